// The model registry: OpenModel picks the family from `--model` and builds it (causal_lm.h).
#include "runtime/models/causal_lm.h"

#include <ATen/CPUGeneratorImpl.h>
#include <xxhash.h>

#include <filesystem>

#include "base/json_text.h"
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

torch::Tensor CausalLm::Loss(const torch::Tensor& ids, const torch::Tensor& targets) {
  return NextTokenLoss(Logits(ids), targets);
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

Result<std::unique_ptr<CausalLm>> OpenHfDirectory(const ModelOptions& o) {
  const std::string dir = o.spec;
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  Result<nlohmann::json> read = ReadJsonFile(config_path);
  if (read.status().code() == StatusCode::kNotFound) {
    return NotFoundError(dir + " has no config.json (a Hugging Face model directory holds "
                               "config.json and model*.safetensors)");
  }
  STRATA_ASSIGN_OR_RETURN(nlohmann::json config, std::move(read));
  STRATA_ASSIGN_OR_RETURN(LlamaShape shape, ParseHfConfig(config, config_path));
  shape.name = std::filesystem::path(dir).filename().string();
  if (shape.name.empty()) shape.name = dir;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<HfCheckpoint> ckpt, HfCheckpoint::Open(dir));
  const bool config_ties = shape.tie_word_embeddings;
  STRATA_RETURN_IF_ERROR(UntieADistinctHead(*ckpt, dir, &shape.tie_word_embeddings));
  // Exports say what was trained: a head of its own.
  if (config_ties && !shape.tie_word_embeddings) config["tie_word_embeddings"] = false;
  return MakeLlama(shape, o.seed, std::move(ckpt), dir, std::move(config));
}

}  // namespace

Result<std::unique_ptr<CausalLm>> OpenModel(const ModelOptions& o) {
  std::error_code ec;
  std::unique_ptr<CausalLm> lm;
  if (std::filesystem::is_directory(o.spec, ec)) {
    STRATA_ASSIGN_OR_RETURN(lm, OpenHfDirectory(o));
  } else if (Result<GptShape> gpt = FindGptPreset(o.spec); gpt.ok()) {
    GptShape shape = *gpt;
    if (o.seq_len > 0) shape.seq_len = static_cast<int>(o.seq_len);
    GptOptions go;
    go.n_layers = shape.n_layers;
    go.d_model = shape.d_model;
    go.n_heads = shape.n_heads;
    go.seq_len = shape.seq_len;
    go.vocab = shape.vocab;
    go.seed = o.seed;
    go.deferred_init = !o.eager;
    lm = std::make_unique<GptLm>(shape, go);
  } else if (Result<LlamaShape> llama = FindLlamaPreset(o.spec); llama.ok()) {
    STRATA_ASSIGN_OR_RETURN(lm, MakeLlama(*llama, o.seed, nullptr, "",
                                          HfConfigJson(*llama, llama->torch_dtype)));
  } else {
    std::string names;
    for (const GptShape& s : GptPresets()) names += (names.empty() ? "" : ", ") + s.name;
    for (const LlamaShape& s : LlamaPresets()) names += ", " + s.name;
    return NotFoundError("--model " + o.spec +
                         " is neither a directory nor a preset (a Hugging Face model directory "
                         "with config.json and model*.safetensors, or one of: " +
                         names + ")");
  }
  if (o.eager) {
    torch::NoGradGuard no_grad;
    for (int u = 0; u < lm->num_units(); ++u) STRATA_RETURN_IF_ERROR(lm->InitializeUnit(u));
  }
  return lm;
}

}  // namespace strata::runtime
