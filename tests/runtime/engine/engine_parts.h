// Test helpers for the engine's parts (runtime/engine/*.h): a tiny model of OffloadUnit-wrapped
// Linear blocks, and Parts, which builds layout, state store, coordinator and pipelines the way
// Engine::Init does (engine_impl.h) but leaves them public, so that a test drives one part
// directly and reads the blocks it wrote through the TierManager.
//
// Thread-safety: a test's training thread only (as the engine).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpu_optimizer/optimizer.h"
#include "runtime/engine/engine_layout.h"
#include "runtime/engine/grad_pipeline.h"
#include "runtime/engine/offload_unit.h"
#include "runtime/engine/optimizer_pipeline.h"
#include "runtime/engine/options.h"
#include "runtime/engine/param_coordinator.h"
#include "runtime/engine/state_store.h"

#define STRATA_EXPECT_OK(expr)                           \
  do {                                                   \
    const ::strata::Status strata_s_ = (expr);           \
    EXPECT_TRUE(strata_s_.ok()) << strata_s_.ToString(); \
  } while (0)
#define STRATA_ASSERT_OK(expr)                           \
  do {                                                   \
    const ::strata::Status strata_s_ = (expr);           \
    ASSERT_TRUE(strata_s_.ok()) << strata_s_.ToString(); \
  } while (0)

namespace strata::runtime::engine_testing {

// x [B, in] -> stem Linear(in, d) -> `units` x tanh(OffloadUnit(Linear(d, d))) -> head
// Linear(d, 1). Parameter order: stem.weight, stem.bias, blocks.i.weight, blocks.i.bias...,
// head.weight, head.bias. Unit i holds d*d + d elements.
class TinyNetImpl : public torch::nn::Module {
 public:
  TinyNetImpl(int units, int64_t d, int64_t in = 4) {
    stem = register_module("stem", torch::nn::Linear(in, d));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < units; ++i) blocks->push_back(Offload(torch::nn::Linear(d, d)));
    head = register_module("head", torch::nn::Linear(d, 1));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = stem(x);
    for (const auto& b : *blocks) h = torch::tanh(b->as<OffloadUnitImpl>()->forward(h));
    return head(h);
  }
  torch::Tensor Loss(const torch::Tensor& x, const torch::Tensor& y) {
    return (forward(x) - y).pow(2).mean();
  }
  OffloadUnitImpl* unit(int i) { return blocks[i]->as<OffloadUnitImpl>(); }

  torch::nn::Linear stem{nullptr}, head{nullptr};
  torch::nn::ModuleList blocks{nullptr};
};
TORCH_MODULE(TinyNet);

inline cpu_optimizer::OptimizerOptions AdamW() {
  cpu_optimizer::OptimizerOptions o;
  o.type = cpu_optimizer::OptimizerType::kAdamW;
  o.lr = 1e-2;
  o.weight_decay = 0.01;
  o.threads = 1;
  return o;
}

inline EngineOptions Options(Home params, Home optimizer, const std::string& nvme_dir) {
  EngineOptions o;
  o.params = params;
  o.optimizer = optimizer;
  o.param_nvme_path = nvme_dir;
  o.optimizer_nvme_path = nvme_dir;
  o.optimizer_options = AdamW();
  o.persistence_threshold = 0;  // every unit parameter in its unit
  o.pin_memory = false;
  return o;
}

// The engine's offload parts over `model`, built in Engine::Init's order. Parts is the units'
// UnitHooks (forwarding to the coordinator and, for gradients, to the gradient pipeline).
class Parts final : public UnitHooks {
 public:
  struct Build {
    bool grads = true;      // GradPipeline
    bool optimizer = true;  // OptimizerPipeline (needs grads)
  };

  static Result<std::unique_ptr<Parts>> Create(std::shared_ptr<torch::nn::Module> model,
                                               EngineOptions options, Build build) {
    std::unique_ptr<Parts> p(new Parts(std::move(model), std::move(options)));
    STRATA_RETURN_IF_ERROR(p->Init(build));
    return p;
  }
  static Result<std::unique_ptr<Parts>> Create(std::shared_ptr<torch::nn::Module> model,
                                               EngineOptions options) {
    return Create(std::move(model), std::move(options), Build{});
  }

  ~Parts() override {
    for (const auto& m : model->modules()) {
      if (auto* u = dynamic_cast<OffloadUnitImpl*>(m.get())) u->Detach();
    }
    optimizer.reset();
    grads.reset();
    if (store) {  // parameters viewing the store's memory must not outlive it
      torch::NoGradGuard no_grad;
      for (const ParamGroup& g : layout.groups) {
        for (const ParamSlot& s : g.params) {
          torch::Tensor var = s.var;
          var.set_data(store->Empty());
        }
      }
    }
    coordinator.reset();
    store.reset();
  }

  // UnitHooks, as the engine implements them.
  void Gather(int unit, bool tracked) override { coordinator->Gather(unit, tracked); }
  void Release(int unit) override { coordinator->Release(unit); }
  void Expect(const std::vector<int>& units) override { coordinator->Expect(units); }
  const std::vector<torch::Tensor>& GradParameters(int unit) override {
    return layout.unit_grad_params[unit];
  }
  void GradientsReady(int unit, std::vector<torch::Tensor> g) override {
    std::vector<torch::Tensor> unit_grads(layout.groups[unit].params.size());
    for (size_t i = 0; i < g.size(); ++i) {
      const GradTarget& t = layout.unit_grad_targets[unit][i];
      if (!t.resident) unit_grads[t.slot] = std::move(g[i]);
    }
    ready.push_back(unit);
    if (grads) grads->Submit(unit, std::move(unit_grads), /*boundary=*/true);
  }

  // Sub-group si's state (master, then moments: with master_in_params the master from the
  // group's parameter block) and gradient block, read through a pinned copy (fetched from NVMe
  // where that is their home).
  std::vector<float> State(int si) {
    const SubGroupSpan& sg = layout.subgroups[si];
    const ParamGroup& g = layout.groups[sg.group];
    if (!g.master_in_params) {
      return ReadPinned(store->subgroup(si).state,
                        sg.numel * static_cast<uint64_t>(sizes.state_arrays));
    }
    std::vector<float> state = ReadPinned(store->group(sg.group).block, g.part);
    state.erase(state.begin(), state.begin() + (sg.begin - g.own_begin));
    state.resize(sg.numel);
    const std::vector<float> moments = ReadPinned(
        store->subgroup(si).state, sg.numel * static_cast<uint64_t>(sizes.state_arrays - 1));
    state.insert(state.end(), moments.begin(), moments.end());
    return state;
  }
  std::vector<float> Grad(int si) {
    return ReadPinned(store->subgroup(si).grad, layout.subgroups[si].numel);
  }
  void WriteGrad(int si, float value) {
    auto pin =
        store->tm().Acquire(store->subgroup(si).grad, Tier::kPinned, TierManager::Access::kWrite);
    ASSERT_TRUE(pin.ok()) << pin.status().ToString();
    ASSERT_TRUE(pin->Wait().ok());
    auto* f = static_cast<float*>(pin->data());
    for (uint64_t i = 0; i < layout.subgroups[si].numel; ++i) f[i] = value;
    pin->MarkDirty();
  }
  // Group g's flat parameter block as fp32 (fp32 compute dtype only), from its home.
  std::vector<float> GroupParams(int g) {
    const uint64_t n = layout.groups[g].numel;
    std::vector<float> out(n);
    if (layout.groups[g].home == Home::kDevice) {
      Status s = store->device().CopyAsync(out.data(), store->group(g).home_pin.data(), n * 4,
                                           CopyKind::kDeviceToHost, store->d2h());
      if (s.ok()) s = store->device().Synchronize(store->d2h());
      EXPECT_TRUE(s.ok()) << s.ToString();
      return out;
    }
    return ReadPinned(store->group(g).block, n);
  }
  std::vector<float> ReadPinned(BlockId id, uint64_t floats) {
    std::vector<float> out(floats);
    auto pin = store->tm().Acquire(id, Tier::kPinned);
    EXPECT_TRUE(pin.ok()) << pin.status().ToString();
    if (!pin.ok()) return out;
    Status s = pin->Wait();
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (s.ok()) std::memcpy(out.data(), pin->data(), floats * 4);
    return out;
  }
  // Gradients for group g's parameters (aligned with its slots), seeded.
  std::vector<torch::Tensor> RandomGrads(int g, uint64_t seed) const {
    torch::manual_seed(seed);
    std::vector<torch::Tensor> out;
    for (const ParamSlot& s : layout.groups[g].params) out.push_back(torch::randn(s.shape));
    return out;
  }

  std::shared_ptr<torch::nn::Module> model;
  EngineOptions options;
  cpu_optimizer::OptimizerType type{};
  std::optional<cpu_optimizer::CpuOptimizer> cpu;
  EngineLayout layout;
  BlockSizes sizes;
  TorchBoundary boundary;
  std::unique_ptr<StateStore> store;
  std::unique_ptr<ParamCoordinator> coordinator;
  std::unique_ptr<GradPipeline> grads;
  std::unique_ptr<OptimizerPipeline> optimizer;
  std::vector<std::vector<float>> initial;  // per group: the flat initial values (fp32)
  std::vector<int> ready;                   // units whose gradients arrived, in order

 private:
  Parts(std::shared_ptr<torch::nn::Module> m, EngineOptions o)
      : model(std::move(m)), options(std::move(o)) {}

  Status Init(Build build) {
    type = options.optimizer_options.type;
    STRATA_ASSIGN_OR_RETURN(auto c, cpu_optimizer::CpuOptimizer::Create(options.optimizer_options));
    cpu.emplace(c);
    STRATA_ASSIGN_OR_RETURN(layout,
                            PartitionModel(*model, options.params, options.persistence_threshold,
                                           options.sub_group_size, this));
    for (const ParamGroup& g : layout.groups) {
      std::vector<float> flat(g.numel);
      for (const ParamSlot& s : g.params) {
        torch::Tensor t = s.var.detach().contiguous();
        std::memcpy(flat.data() + s.offset, t.data_ptr<float>(), s.numel * 4);
      }
      initial.push_back(std::move(flat));
    }
    sizes.compute_bytes = DTypeBytes(options.precision);
    sizes.state_arrays = StateArrays(type);
    PlaceGroups(options, layout, sizes);
    STRATA_ASSIGN_OR_RETURN(store, StateStore::Create(options, layout, sizes));
    coordinator = std::make_unique<ParamCoordinator>(options, layout, *store, boundary);
    if (build.grads) {
      STRATA_ASSIGN_OR_RETURN(grads, GradPipeline::Create(options, layout, *store, boundary));
      if (build.optimizer) {
        STRATA_ASSIGN_OR_RETURN(
            optimizer, OptimizerPipeline::Create(options, layout, *store, *grads, *cpu, type));
      }
    }
    return store->InitBlocks(*cpu, type);
  }
};

// Index of the first differing element of a and b (bitwise), or -1.
inline int64_t FirstDifference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

inline std::vector<float> Floats(const torch::Tensor& t) {
  torch::Tensor c = t.detach().to(torch::kFloat32).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// Injects I/O errors under the store's own IoBackend (which tests cannot replace): the open swap
// file `<dir>/.../<kind>.swp` gets its descriptor replaced by one on the same file opened with
// `flags` (O_RDONLY: every write fails with EBADF; O_WRONLY: every read does) until Restore() or
// destruction.
class SwapFileFault {
 public:
  SwapFileFault(const std::string& dir, const std::string& kind, int flags) {
    const std::string suffix = "/" + kind + ".swp";
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
      if (ec || target.rfind(dir, 0) != 0 || target.size() < suffix.size() ||
          target.compare(target.size() - suffix.size(), suffix.size(), suffix) != 0) {
        continue;
      }
      fd_ = std::stoi(e.path().filename().string());
      path_ = target;
      break;
    }
    if (fd_ < 0) return;
    saved_ = ::dup(fd_);
    const int other = ::open(path_.c_str(), flags | O_CLOEXEC);
    if (saved_ < 0 || other < 0 || ::dup2(other, fd_) < 0) fd_ = -1;
    if (other >= 0) ::close(other);
  }
  ~SwapFileFault() { Restore(); }
  SwapFileFault(const SwapFileFault&) = delete;
  SwapFileFault& operator=(const SwapFileFault&) = delete;

  bool ok() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  void Restore() {
    if (fd_ >= 0 && saved_ >= 0) ::dup2(saved_, fd_);
    if (saved_ >= 0) ::close(saved_);
    saved_ = -1;
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  int saved_ = -1;
  std::string path_;
};

}  // namespace strata::runtime::engine_testing
