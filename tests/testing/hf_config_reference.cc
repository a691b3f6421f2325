// hf_config_reference.cc: see hf_config_reference.h. Dispatches on the architecture to the
// family files (hf_reference_families.h); greedy decoding and the directory writer are shared.
#include "tests/testing/hf_config_reference.h"

#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tests/testing/hf_reference.h"
#include "tests/testing/hf_reference_families.h"

namespace strata::testing {
namespace {

std::string& PlantedBug() {
  static std::string planted;
  return planted;
}

struct Family {
  families::WeightsFn weights;
  families::LogitsFn logits;
  bool moe;
};

Family FamilyOf(const nlohmann::json& config) {
  if (!config.is_object() || !config.contains("architectures") ||
      !config["architectures"].is_array() || config["architectures"].empty() ||
      !config["architectures"][0].is_string()) {
    throw std::invalid_argument("hf_config_reference: config.json needs \"architectures\": [name]");
  }
  const std::string arch = config["architectures"][0].get<std::string>();
  if (arch == "LlamaForCausalLM" || arch == "MistralForCausalLM" || arch == "Qwen2ForCausalLM" ||
      arch == "Phi3ForCausalLM") {
    return {families::DenseWeights, families::DenseLogits, false};
  }
  if (arch == "Gemma2ForCausalLM") return {families::Gemma2Weights, families::Gemma2Logits, false};
  if (arch == "MixtralForCausalLM" || arch == "Qwen2MoeForCausalLM") {
    return {families::MoeWeights, families::MoeLogits, true};
  }
  throw std::invalid_argument("hf_config_reference: architecture " + arch + " is not covered");
}

}  // namespace

HfWeights RandomWeightsFor(const nlohmann::json& config, uint64_t seed) {
  return FamilyOf(config).weights(config, seed);
}

torch::Tensor ConfigReferenceLogits(const nlohmann::json& config, const HfWeights& weights,
                                    const torch::Tensor& ids) {
  torch::NoGradGuard no_grad;
  return FamilyOf(config).logits(config, weights, ids, nullptr);
}

double ConfigReferenceRouterAuxLoss(const nlohmann::json& config, const HfWeights& weights,
                                    const torch::Tensor& ids) {
  torch::NoGradGuard no_grad;
  const Family f = FamilyOf(config);
  if (!f.moe) return 0.0;
  std::vector<torch::Tensor> router_logits;
  f.logits(config, weights, ids, &router_logits);
  return families::MoeLoadBalancingLoss(config, router_logits);
}

double ConfigReferenceLoss(const nlohmann::json& config, const HfWeights& weights,
                           const torch::Tensor& windows) {
  if (windows.dim() != 2 || windows.size(1) < 2) {
    throw std::invalid_argument("hf_config_reference: windows must be [B, T+1] with T >= 1");
  }
  torch::NoGradGuard no_grad;
  const Family f = FamilyOf(config);
  const torch::Tensor w = windows.to(torch::kLong);
  const int64_t t = w.size(1) - 1;
  const torch::Tensor inputs = w.narrow(1, 0, t), targets = w.narrow(1, 1, t);
  std::vector<torch::Tensor> router_logits;
  const torch::Tensor logits =
      f.logits(config, weights, inputs, f.moe ? &router_logits : nullptr).to(torch::kDouble);
  const torch::Tensor logp = torch::log_softmax(logits, -1);
  double loss = (-logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)).mean().item<double>();
  // MixtralForCausalLM.forward: loss += router_aux_loss_coef * aux_loss when output_router_logits.
  if (f.moe && config.value("output_router_logits", false)) {
    loss += config.value("router_aux_loss_coef", 0.001) *
            families::MoeLoadBalancingLoss(config, router_logits);
  }
  return loss;
}

std::vector<int64_t> ConfigReferenceGreedy(const nlohmann::json& config, const HfWeights& weights,
                                           const std::vector<int64_t>& prompt, int n) {
  if (prompt.empty()) throw std::invalid_argument("hf_config_reference: empty prompt");
  torch::NoGradGuard no_grad;
  const Family f = FamilyOf(config);
  std::vector<int64_t> seq = prompt, out;
  for (int i = 0; i < n; ++i) {
    const torch::Tensor ids = torch::tensor(seq, torch::kLong).unsqueeze(0);
    const torch::Tensor last = f.logits(config, weights, ids, nullptr)[0][-1];
    // torch.argmax returns the first maximal index: the lowest id on ties.
    const int64_t next = last.argmax().item<int64_t>();
    seq.push_back(next);
    out.push_back(next);
  }
  return out;
}

void PlantBug(const std::string& name) { PlantedBug() = name; }
bool BugPlanted(const char* name) { return PlantedBug() == name; }

void WriteHfDirectory(const std::string& dir, const nlohmann::json& config,
                      const HfWeights& weights, const std::string& dtype, int shards) {
  WriteHfCheckpointWithConfig(dir, config, weights, dtype, shards);
}

}  // namespace strata::testing
