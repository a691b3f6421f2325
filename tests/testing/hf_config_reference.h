// hf_config_reference: an independent reference for Hugging Face causal LMs read from their
// config.json exactly as transformers reads it, for tests of strata's loader, models and
// `strata generate` on the families beyond hf_reference.h's LlamaSpec: sliding-window attention
// and every rope_scaling type (linear, dynamic, yarn, longrope/su, llama3) on Llama, Mistral and
// Qwen2, Phi3ForCausalLM, Gemma2ForCausalLM, MixtralForCausalLM and Qwen2MoeForCausalLM.
//
// Written from transformers' Python source (modeling_*.py, modeling_rope_utils.py,
// masking_utils.py, configuration_*.py defaults) in plain libtorch ops; shares no code with
// runtime/models/ and was written without reading it: it is what strata's models are checked
// against. Each family's file names the transformers code it follows.
//
//   nlohmann::json config = ...;                      // a config.json, e.g. a shrunk Gemma 2
//   Weights w = RandomWeightsFor(config, /*seed=*/7);  // transformers' parameter names
//   WriteHfDirectory(dir, config, w, "F32", 1);        // config.json + safetensors
//   torch::Tensor logits = ConfigReferenceLogits(config, w, ids);   // [B, T, vocab] fp32
//   double loss = ConfigReferenceLoss(config, w, windows);
//
// Defaults: keys absent from `config` take the defaults of transformers' configuration class for
// its model_type (the file of each family lists them). The architecture is
// config["architectures"][0].
//
// Errors: std::invalid_argument for a config transformers could not build or that this reference
// does not cover (naming the key), std::runtime_error for I/O. Thread-safety: pure functions
// (WriteHfDirectory writes only under its directory).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace strata::testing {

using HfWeights = std::map<std::string, torch::Tensor>;

// Exactly the parameters transformers' *ForCausalLM built from `config` has (HF names, fp32,
// contiguous), deterministic in (config, seed) and independent of libtorch's RNG. Scales keep
// activations O(1) (as hf_reference.h's RandomLlamaWeights); MoE routers are drawn wide enough
// (std ~1) that top-k choices differ between tokens.
HfWeights RandomWeightsFor(const nlohmann::json& config, uint64_t seed);

// transformers' eager forward in fp32 (eager attention, causal mask with the config's sliding
// window where the layer has one, position_ids 0..T-1, attention_mask None): logits [B, T, vocab]
// fp32 for ids [B, T] int64, soft-capped where the config says so.
torch::Tensor ConfigReferenceLogits(const nlohmann::json& config, const HfWeights& weights,
                                    const torch::Tensor& ids);

// *ForCausalLM's loss over windows [B, T+1] int64 (inputs windows[:, :T], targets windows[:, 1:],
// mean over all B*T targets, log_softmax in double from the fp32 logits), plus
// router_aux_loss_coef × load_balancing_loss_func(router logits) when the config has
// output_router_logits true (Mixtral, Qwen2-MoE).
double ConfigReferenceLoss(const nlohmann::json& config, const HfWeights& weights,
                           const torch::Tensor& windows);

// Only the router auxiliary loss (unscaled load_balancing_loss_func) of ids [B, T]; 0 for models
// without routers.
double ConfigReferenceRouterAuxLoss(const nlohmann::json& config, const HfWeights& weights,
                                    const torch::Tensor& ids);

// Greedy decoding as model.generate(do_sample=False, max_new_tokens=n) without stopping at EOS:
// each new token is the argmax (lowest id on ties) of the last position's logits over the whole
// sequence so far (recomputed from scratch, no cache). Returns the n new ids.
std::vector<int64_t> ConfigReferenceGreedy(const nlohmann::json& config, const HfWeights& weights,
                                           const std::vector<int64_t>& prompt, int n);

// Writes DIR/config.json (`config` with torch_dtype set from `dtype`) and `weights` as safetensors
// in `dtype` ("F32", "BF16", "F16") in `shards` files, as hf_reference.h's WriteHfCheckpoint.
void WriteHfDirectory(const std::string& dir, const nlohmann::json& config,
                      const HfWeights& weights, const std::string& dtype, int shards);

// Deliberate bugs, so a test can show it fails when the reference is wrong: while `name` is
// planted (until PlantBug("")), the reference computes that one bug. The names (each family's
// file lists what each does): "sliding_window_off_by_one", "rope_linear_unscaled",
// "rope_dynamic_static", "rope_yarn_no_attention_factor", "rope_longrope_short_factor_only",
// "phi3_gate_up_swapped", "gemma2_norm_without_one", "gemma2_no_softcap",
// "gemma2_all_layers_global", "moe_softmax_after_topk", "moe_no_topk_renormalization",
// "qwen2moe_no_shared_expert_gate", "qwen2moe_window_layers_as_qwen2". Not thread-safe: tests plant
// from their one thread.
void PlantBug(const std::string& name);
// True while `name` is planted (for the family files).
bool BugPlanted(const char* name);

}  // namespace strata::testing
