// hf_reference_family_stubs.cc: placeholders for the family files of hf_reference_families.h not
// yet in this tree (CMake compiles a part only while its family's .cc is absent), so that
// strata_hf_reference links. Each stub throws: the family is not covered yet.
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/testing/hf_reference_families.h"

namespace strata::testing::families {
namespace {
[[noreturn]] void NotCovered(const std::string& family) {
  throw std::invalid_argument("hf_config_reference: " + family + " is not in this build");
}
}  // namespace

#ifdef STRATA_STUB_GEMMA2_REFERENCE
HfWeights Gemma2Weights(const nlohmann::json&, uint64_t) { NotCovered("Gemma2ForCausalLM"); }
torch::Tensor Gemma2Logits(const nlohmann::json&, const HfWeights&, const torch::Tensor&,
                           std::vector<torch::Tensor>*) {
  NotCovered("Gemma2ForCausalLM");
}
#endif

#ifdef STRATA_STUB_MOE_REFERENCE
HfWeights MoeWeights(const nlohmann::json&, uint64_t) { NotCovered("the MoE families"); }
torch::Tensor MoeLogits(const nlohmann::json&, const HfWeights&, const torch::Tensor&,
                        std::vector<torch::Tensor>*) {
  NotCovered("the MoE families");
}
double MoeLoadBalancingLoss(const nlohmann::json&, const std::vector<torch::Tensor>&) {
  NotCovered("the MoE families");
}
#endif

}  // namespace strata::testing::families
