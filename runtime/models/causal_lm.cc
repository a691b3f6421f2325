// The model registry: OpenModel picks the family from `--model` and builds it (causal_lm.h).
#include "runtime/models/causal_lm.h"

#include <ATen/CPUGeneratorImpl.h>
#include <xxhash.h>

#include <filesystem>

#include "base/json_text.h"
#include "runtime/engine/offload_unit.h"
#include "runtime/models/attention.h"
#include "runtime/models/gpt.h"
#include "runtime/models/llama.h"
#include "runtime/persist/hf_checkpoint.h"
#include "runtime/plan/llama_shape.h"
#include "runtime/plan/model_presets.h"

namespace strata::runtime {

torch::Tensor NextTokenLoss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), targets.reshape({-1}));
}

torch::Tensor CausalLm::LogitsAt(const torch::Tensor& ids, int64_t position_offset) {
  TORCH_CHECK(position_offset == 0, family(), " models generate without a KV cache");
  return Logits(ids);
}

void CausalLm::SetKvCaching(bool on) {
  auto set = [on](torch::nn::Module* m) {
    if (auto* attention = dynamic_cast<CachingAttention*>(m)) {
      if (on) {
        attention->kv_cache.Start();
      } else {
        attention->kv_cache.Stop();
      }
    }
  };
  for (const auto& m : module()->modules()) {
    set(m.get());
    // An attention that is an offload unit of its own (per-expert paging) is the unit's inner
    // module, which the walk does not meet (only its children, adopted by the unit).
    if (auto* unit = dynamic_cast<OffloadUnitImpl*>(m.get())) set(unit->inner().get());
  }
}

torch::Tensor CausalLm::Loss(const torch::Tensor& ids, const torch::Tensor& targets) {
  torch::Tensor loss = NextTokenLoss(Logits(ids), targets);
  if (torch::Tensor aux = AuxiliaryLoss(); aux.defined()) loss = loss + aux;
  return loss;
}

at::Generator NamedGenerator(uint64_t seed, const std::string& name) {
  return at::detail::createCPUGenerator(XXH64(name.data(), name.size(), seed));
}

namespace {

class GptLm final : public CausalLm {
 public:
  GptLm(const GptShape& shape, const GptOptions& options) : shape_(shape), model_(options) {}

  std::shared_ptr<torch::nn::Module> module() override { return model_.ptr(); }
  torch::Tensor Logits(const torch::Tensor& ids) override { return model_->forward(ids); }
  Status InitializeUnit(int unit) override {
    if (unit < 0 || unit >= shape_.n_layers) {
      return InvalidArgumentError("no GPT block " + std::to_string(unit));
    }
    if (model_->options().deferred_init) model_->InitializeBlock(unit);
    return Status::Ok();
  }
  int num_units() const override { return shape_.n_layers; }
  std::string family() const override { return "gpt"; }
  std::string Describe() const override {
    return "GPT " + shape_.name + ": " + std::to_string(TotalParams(shape_) / 1'000'000) +
           "M parameters, " + std::to_string(shape_.n_layers) + " blocks x " +
           std::to_string(shape_.d_model) + ", seq " + std::to_string(shape_.seq_len);
  }
  uint64_t num_parameters() const override { return TotalParams(shape_); }
  int64_t vocab_size() const override { return shape_.vocab; }
  int64_t max_seq_len() const override { return shape_.seq_len; }
  int64_t hidden_size() const override { return shape_.d_model; }
  ActivationBytes Activations(int micro_batch, int seq_len, int compute_bytes) const override {
    GptShape shape = shape_;
    shape.seq_len = seq_len;
    return GptActivationBytes(shape, micro_batch, compute_bytes);
  }
  nlohmann::json Identity() const override {
    return {{"name", shape_.name},
            {"n_layers", shape_.n_layers},
            {"d_model", shape_.d_model},
            {"n_heads", shape_.n_heads},
            {"seq_len", shape_.seq_len}};
  }

 private:
  GptShape shape_;
  Gpt model_;
};

}  // namespace

Result<std::unique_ptr<CausalLm>> OpenModel(const ModelOptions& o) {
  STRATA_ASSIGN_OR_RETURN(ModelSpec spec,
                          ResolveModel(o.spec, static_cast<int>(o.seq_len), Weights::kRequired));
  return OpenModel(std::move(spec), o.seed, o.eager);
}

Result<std::unique_ptr<CausalLm>> OpenModel(ModelSpec spec, uint64_t seed, bool eager) {
  std::unique_ptr<CausalLm> lm;
  if (spec.gpt) {
    const GptShape& shape = *spec.gpt;
    GptOptions go;
    go.n_layers = shape.n_layers;
    go.d_model = shape.d_model;
    go.n_heads = shape.n_heads;
    go.seq_len = shape.seq_len;
    go.vocab = shape.vocab;
    go.seed = seed;
    go.deferred_init = !eager;
    lm = std::make_unique<GptLm>(shape, go);
  } else if (!spec.hf_dir.empty()) {
    STRATA_ASSIGN_OR_RETURN(lm, MakeLlama(*spec.llama, seed, std::move(spec.checkpoint),
                                          spec.hf_dir, std::move(spec.hf_config)));
  } else {
    STRATA_ASSIGN_OR_RETURN(lm, MakeLlama(*spec.llama, seed, nullptr, "",
                                          HfConfigJson(*spec.llama, spec.llama->torch_dtype)));
  }
  if (eager) {
    torch::NoGradGuard no_grad;
    for (int u = 0; u < lm->num_units(); ++u) STRATA_RETURN_IF_ERROR(lm->InitializeUnit(u));
  }
  return lm;
}

}  // namespace strata::runtime
