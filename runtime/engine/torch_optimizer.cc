#include "runtime/engine/torch_optimizer.h"

#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "runtime/numerics/clipping.h"

namespace strata::runtime {

Status TorchOptimizer::Make(double lr) {
  if (optim_) return Status::Ok();
  const auto& o = opt_.optimizer_options;
  using cpu_optimizer::OptimizerType;
  const std::vector<torch::Tensor>& all = Stepped();
  switch (o.type) {
    case OptimizerType::kAdam:
      optim_ = std::make_unique<torch::optim::Adam>(all, torch::optim::AdamOptions(lr)
                                                             .betas({o.beta1, o.beta2})
                                                             .eps(o.eps)
                                                             .weight_decay(o.weight_decay));
      break;
    case OptimizerType::kAdamW:
      optim_ = std::make_unique<torch::optim::AdamW>(all, torch::optim::AdamWOptions(lr)
                                                              .betas({o.beta1, o.beta2})
                                                              .eps(o.eps)
                                                              .weight_decay(o.weight_decay));
      break;
    case OptimizerType::kAdagrad:
      optim_ = std::make_unique<torch::optim::Adagrad>(
          all, torch::optim::AdagradOptions(lr)
                   .lr_decay(o.lr_decay)
                   .weight_decay(o.weight_decay)
                   .initial_accumulator_value(o.initial_accumulator_value)
                   .eps(o.eps));
      break;
    case OptimizerType::kLion:
      return InvalidArgumentError("Lion needs offload_optimizer cpu or nvme");
  }
  return Status::Ok();
}

TorchOptimizer::TorchOptimizer(torch::nn::Module& model, const EngineOptions& options)
    : model_(model), opt_(options) {
  for (const auto& item : model_.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    names_.push_back(item.key());
    params_.push_back(item.value());
  }
}

Status TorchOptimizer::Init() {
  if (!opt_.device_masters || opt_.precision != DType::kBFloat16) return Status::Ok();
  torch::NoGradGuard no_grad;
  try {
    for (torch::Tensor& p : params_) {
      masters_.push_back(p.detach().to(torch::kFloat32).clone());
      p.set_data(p.detach().to(torch::kBFloat16));
    }
  } catch (const std::exception& e) {
    return ResourceExhaustedError(std::string("keeping fp32 master weights on the device: ") +
                                  e.what());
  }
  return Status::Ok();
}

void TorchOptimizer::AccumulateGradients() {
  if (masters_.empty()) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& g = params_[i].mutable_grad();
    if (!g.defined()) continue;
    torch::Tensor& acc = masters_[i].mutable_grad();
    if (acc.defined()) {
      acc.add_(g.to(torch::kFloat32));
    } else {
      acc = g.to(torch::kFloat32);
    }
    g = torch::Tensor();
  }
}

void TorchOptimizer::DiscardGradients() {
  for (torch::Tensor& p : params_) p.mutable_grad() = torch::Tensor();
  for (torch::Tensor& m : masters_) m.mutable_grad() = torch::Tensor();
}

int64_t TorchOptimizer::IndexOf(const torch::Tensor& param) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].is_same(param)) return static_cast<int64_t>(i);
  }
  return -1;
}

torch::Tensor TorchOptimizer::Fp32Value(const torch::Tensor& param) const {
  const int64_t i = masters_.empty() ? -1 : IndexOf(param);
  return i < 0 ? param : masters_[static_cast<size_t>(i)];
}

void TorchOptimizer::Assign(const torch::Tensor& param, const torch::Tensor& value) {
  torch::NoGradGuard no_grad;
  const int64_t i = masters_.empty() ? -1 : IndexOf(param);
  if (i >= 0) masters_[static_cast<size_t>(i)].copy_(value);
  torch::Tensor(param).copy_(value);
}

Status TorchOptimizer::Step(double lr, double* grad_norm, std::string* non_finite) {
  torch::NoGradGuard no_grad;
  if (opt_.step_without_gradient) {  // options.h: a zero gradient, stepped as any other
    for (torch::Tensor p : Stepped()) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    }
  }
  if (opt_.communicator->world_size() > 1) {
    // Data parallel without partitioning (DDP): every rank's gradients are summed into every
    // rank's and divided by the world size, in one flat all-reduce over all trainable parameters
    // in the model's order (a missing gradient counts as zeros), so every rank applies the same
    // update to the same replica. The flat buffer ends with one flag per parameter (1 where this
    // rank has its gradient): a parameter no rank has a gradient for stays without one, as on one
    // rank (the optimizer leaves it alone).
    std::vector<torch::Tensor> all = Stepped();
    int64_t total_numel = 0;
    for (const auto& p : all) total_numel += p.numel();
    const int64_t flags = static_cast<int64_t>(all.size());
    torch::Tensor flat = torch::zeros({total_numel + flags}, torch::kFloat32);
    float* has = flat.data_ptr<float>() + total_numel;
    int64_t at = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      const torch::Tensor& p = all[i];
      if (p.grad().defined()) {
        flat.narrow(0, at, p.numel()).copy_(p.grad().reshape({-1}));
        has[i] = 1;
      }
      at += p.numel();
    }
    STRATA_RETURN_IF_ERROR(opt_.communicator->AllReduceSumFloat(
        flat.data_ptr<float>(), static_cast<size_t>(total_numel + flags)));
    flat.narrow(0, 0, total_numel).mul_(1.0 / opt_.communicator->world_size());
    at = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      torch::Tensor& p = all[i];
      torch::Tensor g = flat.narrow(0, at, p.numel()).view(p.sizes());
      at += p.numel();
      if (has[i] == 0) continue;
      if (p.grad().defined()) {
        p.mutable_grad().copy_(g);
      } else {
        p.mutable_grad() = g.clone();
      }
    }
  }
  std::vector<torch::Tensor> params;
  for (const auto& p : Stepped()) {
    if (p.grad().defined()) params.push_back(p);
  }
  double total = 0;
  for (const auto& p : params) total += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  *grad_norm = std::sqrt(total);
  if (!std::isfinite(total)) {
    // Name the first parameter with a non-finite gradient; nothing is applied.
    std::string where = "another rank";
    for (size_t i = 0; i < Stepped().size(); ++i) {
      const torch::Tensor g = Stepped()[i].grad();
      if (g.defined() && !torch::isfinite(g).all().item<bool>()) {
        where = names_[i];
        break;
      }
    }
    for (auto p : Stepped()) p.mutable_grad() = torch::Tensor();
    if (non_finite == nullptr) return FailedPreconditionError("non-finite gradient in " + where);
    *non_finite = where;
    return Status::Ok();
  }
  const double multiplier = ClipMultiplier(*grad_norm, opt_.gradient_clipping);
  if (multiplier != 1.0) {
    for (auto& p : params) p.mutable_grad().mul_(multiplier);
  }
  STRATA_RETURN_IF_ERROR(Make(lr));
  for (auto& group : optim_->param_groups()) group.options().set_lr(lr);
  try {
    optim_->step();
  } catch (const std::exception& e) {
    return InternalError(std::string("torch optimizer step failed: ") + e.what());
  }
  for (auto p : Stepped()) p.mutable_grad() = torch::Tensor();
  // The updated masters, rounded into the bf16 parameters the model computes with.
  for (size_t i = 0; i < masters_.size(); ++i) params_[i].copy_(masters_[i]);
  return Status::Ok();
}

// ---- Saved state
//
// torch_optimizer.bin: kStateMagic, the header's length (8 bytes, little-endian), a JSON header,
// then the tensors' bytes. Header: {"optimizer": "adam"|"adamw"|"adagrad", "params": [per stepped
// parameter in the model's order: null (no state yet) or {"step": N, "tensors": {name: {"dtype",
// "shape", "offset", "bytes"}}}]}. Plain data only: torch::optim's own serialization is a
// TorchScript archive, whose loading runs the code the archive carries, so a checkpoint from
// anyone could run code; this format has none to run, and every field is checked on load.

namespace {

constexpr char kStateMagic[8] = {'S', 'T', 'R', 'O', 'P', 'T', '1', '\n'};

const char* TypeName(cpu_optimizer::OptimizerType type) {
  switch (type) {
    case cpu_optimizer::OptimizerType::kAdam:
      return "adam";
    case cpu_optimizer::OptimizerType::kAdamW:
      return "adamw";
    case cpu_optimizer::OptimizerType::kAdagrad:
      return "adagrad";
    case cpu_optimizer::OptimizerType::kLion:
      break;
  }
  return "lion";
}

// The named tensors and the step count of one parameter's torch::optim state.
struct StateView {
  int64_t step = 0;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
};

template <typename State>
StateView ViewAdam(const State& s) {
  StateView v{s.step(), {{"exp_avg", s.exp_avg()}, {"exp_avg_sq", s.exp_avg_sq()}}};
  if (s.max_exp_avg_sq().defined()) v.tensors.emplace_back("max_exp_avg_sq", s.max_exp_avg_sq());
  return v;
}

std::optional<StateView> View(cpu_optimizer::OptimizerType type,
                              const torch::optim::OptimizerParamState& s) {
  using cpu_optimizer::OptimizerType;
  if (type == OptimizerType::kAdam) {
    return ViewAdam(static_cast<const torch::optim::AdamParamState&>(s));
  }
  if (type == OptimizerType::kAdamW) {
    return ViewAdam(static_cast<const torch::optim::AdamWParamState&>(s));
  }
  if (type == OptimizerType::kAdagrad) {
    const auto& a = static_cast<const torch::optim::AdagradParamState&>(s);
    return StateView{a.step(), {{"sum", a.sum()}}};
  }
  return std::nullopt;
}

template <typename State>
std::unique_ptr<torch::optim::OptimizerParamState> MakeAdam(
    int64_t step, std::map<std::string, torch::Tensor>& t) {
  auto s = std::make_unique<State>();
  s->step(step);
  s->exp_avg(t.at("exp_avg"));
  s->exp_avg_sq(t.at("exp_avg_sq"));
  if (t.count("max_exp_avg_sq")) s->max_exp_avg_sq(t.at("max_exp_avg_sq"));
  return s;
}

// The tensor names each type's state must hold, and may hold.
std::vector<std::string> Required(cpu_optimizer::OptimizerType type) {
  if (type == cpu_optimizer::OptimizerType::kAdagrad) return {"sum"};
  return {"exp_avg", "exp_avg_sq"};
}
bool Allowed(cpu_optimizer::OptimizerType type, const std::string& name) {
  if (type == cpu_optimizer::OptimizerType::kAdagrad) return name == "sum";
  return name == "exp_avg" || name == "exp_avg_sq" || name == "max_exp_avg_sq";
}

}  // namespace

Result<std::string> TorchOptimizer::Save() const {
  if (!optim_) return std::string();
  const auto type = opt_.optimizer_options.type;
  nlohmann::json header = {{"optimizer", TypeName(type)}, {"params", nlohmann::json::array()}};
  std::string data;
  try {
    for (const torch::Tensor& p : Stepped()) {
      auto it = optim_->state().find(p.unsafeGetTensorImpl());
      std::optional<StateView> v;
      if (it != optim_->state().end()) v = View(type, *it->second);
      if (!v) {
        header["params"].push_back(nullptr);
        continue;
      }
      nlohmann::json tensors = nlohmann::json::object();
      for (const auto& [name, t] : v->tensors) {
        const torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
        const uint64_t bytes = c.numel() * c.element_size();
        tensors[name] = {{"dtype", c10::toString(c.scalar_type())},
                         {"shape", c.sizes().vec()},
                         {"offset", data.size()},
                         {"bytes", bytes}};
        data.append(static_cast<const char*>(c.data_ptr()), bytes);
      }
      header["params"].push_back({{"step", v->step}, {"tensors", std::move(tensors)}});
    }
  } catch (const std::exception& ex) {
    return InternalError(std::string("saving the torch optimizer's state: ") + ex.what());
  }
  const std::string text = header.dump();
  std::string out(kStateMagic, sizeof(kStateMagic));
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += text;
  out += data;
  return out;
}

Status TorchOptimizer::Load(const std::string& bytes, double lr) {
  const std::string what = "torch_optimizer.bin (the optimizer state without offload)";
  auto bad = [&](const std::string& why) { return DataLossError(what + ": " + why); };
  if (bytes.rfind("PK\x03\x04", 0) == 0) {
    return InvalidArgumentError(
        what +
        " is a TorchScript archive, as strata wrote it before this version: loading one "
        "runs the code it carries, so it is not loaded (resume it with the strata that "
        "wrote it, or start from its exported weights)");
  }
  if (bytes.size() < 16 || bytes.compare(0, 8, kStateMagic, 8) != 0) {
    return bad("not strata's optimizer state (its first bytes differ)");
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
  if (n > bytes.size() - 16) return bad("the header runs past the end of the entry");
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(16, n), nullptr, false);
  const uint64_t data_begin = 16 + n, data_size = bytes.size() - data_begin;
  const auto type = opt_.optimizer_options.type;
  if (!header.is_object() || !header.contains("params") || !header["params"].is_array()) {
    return bad("its header is not the expected JSON object");
  }
  if (header.value("optimizer", std::string()) != TypeName(type)) {
    return InvalidArgumentError(what + " is for optimizer " +
                                header.value("optimizer", std::string("?")) + ", the config's is " +
                                TypeName(type));
  }
  const std::vector<torch::Tensor>& stepped = Stepped();
  const nlohmann::json& params = header["params"];
  if (params.size() != stepped.size()) {
    return InvalidArgumentError(what + " holds " + std::to_string(params.size()) +
                                " parameters' state, the model trains " +
                                std::to_string(stepped.size()));
  }
  STRATA_RETURN_IF_ERROR(Make(lr));
  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> states(stepped.size());
  for (size_t i = 0; i < stepped.size(); ++i) {
    const nlohmann::json& e = params[i];
    if (e.is_null()) continue;
    const std::string who = "the state of " + names_[i];
    if (!e.is_object() || !e.contains("step") || !e["step"].is_number_unsigned() ||
        !e.contains("tensors") || !e["tensors"].is_object()) {
      return bad(who + " is not {\"step\": N, \"tensors\": {...}}");
    }
    const torch::Tensor& p = stepped[i];
    std::map<std::string, torch::Tensor> tensors;
    for (const auto& [name, t] : e["tensors"].items()) {
      if (!Allowed(type, name)) return bad(who + " has an unknown tensor " + name);
      if (!t.is_object() || !t.contains("offset") || !t["offset"].is_number_unsigned() ||
          !t.contains("bytes") || !t["bytes"].is_number_unsigned() ||
          t.value("dtype", std::string()) != c10::toString(p.scalar_type()) ||
          !t.contains("shape") || t["shape"] != nlohmann::json(p.sizes().vec())) {
        return bad(who + ": " + name + " is not a " + c10::toString(p.scalar_type()) +
                   " tensor of the parameter's shape");
      }
      const uint64_t offset = t["offset"].get<uint64_t>(), size = t["bytes"].get<uint64_t>();
      if (size != static_cast<uint64_t>(p.numel() * p.element_size()) || offset > data_size ||
          size > data_size - offset) {
        return bad(who + ": " + name + "'s bytes are not within the entry");
      }
      torch::Tensor c = torch::empty(p.sizes(), p.options().device(torch::kCPU));
      std::memcpy(c.data_ptr(), bytes.data() + data_begin + offset, size);
      tensors[name] = c.to(p.device());
    }
    for (const std::string& name : Required(type)) {
      if (!tensors.count(name)) return bad(who + " has no " + name);
    }
    const int64_t step = e["step"].get<int64_t>();
    using cpu_optimizer::OptimizerType;
    if (type == OptimizerType::kAdam) {
      states[i] = MakeAdam<torch::optim::AdamParamState>(step, tensors);
    } else if (type == OptimizerType::kAdamW) {
      states[i] = MakeAdam<torch::optim::AdamWParamState>(step, tensors);
    } else {
      auto a = std::make_unique<torch::optim::AdagradParamState>();
      a->step(step);
      a->sum(tensors.at("sum"));
      states[i] = std::move(a);
    }
  }
  // Every entry checked: the state is replaced whole.
  for (size_t i = 0; i < stepped.size(); ++i) {
    void* key = stepped[i].unsafeGetTensorImpl();
    if (states[i]) {
      optim_->state()[key] = std::move(states[i]);
    } else if (type != cpu_optimizer::OptimizerType::kAdagrad) {
      optim_->state().erase(key);
    }
  }
  return Status::Ok();
}

}  // namespace strata::runtime
