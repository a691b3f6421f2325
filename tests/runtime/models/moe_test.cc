// Mixtral and Qwen2-MoE: shapes and parameter counts (the published ones), config.json parsing,
// and the gradients of the loss with the router aux loss (models/moe.h's pass-through functions)
// against autograd through the independent reference (tests/testing/hf_config_reference.h) with
// transformers' load_balancing_loss_func written out here; with per-expert paging, which units are
// conditional and that the experts announced (UnitHooks::Expect) are exactly the ones gathered
// next, in order, in forward and in backward, without changing a loss or gradient bit.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/engine/offload_unit.h"
#include "runtime/models/causal_lm.h"
#include "runtime/models/llama.h"
#include "runtime/plan/llama_shape.h"
#include "runtime/plan/memory_plan.h"
#include "runtime/plan/model_spec.h"
#include "tests/testing/hf_config_reference.h"
#include "tests/testing/hf_reference_families.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using nlohmann::json;

json MixtralConfig() {
  return {{"architectures", {"MixtralForCausalLM"}},
          {"model_type", "mixtral"},
          {"hidden_size", 32},
          {"intermediate_size", 48},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"num_hidden_layers", 2},
          {"num_local_experts", 4},
          {"num_experts_per_tok", 2},
          {"vocab_size", 96},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 1e6},
          {"sliding_window", nullptr},
          {"output_router_logits", true},
          {"router_aux_loss_coef", 0.5},
          {"tie_word_embeddings", false}};
}

json QwenMoeConfig() {
  return {{"architectures", {"Qwen2MoeForCausalLM"}},
          {"model_type", "qwen2_moe"},
          {"hidden_size", 32},
          {"intermediate_size", 40},
          {"moe_intermediate_size", 16},
          {"shared_expert_intermediate_size", 24},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 4},
          {"num_hidden_layers", 3},
          {"mlp_only_layers", {1}},
          {"num_experts", 5},
          {"num_experts_per_tok", 2},
          {"norm_topk_prob", false},
          {"vocab_size", 96},
          {"rms_norm_eps", 1e-6},
          {"output_router_logits", true},
          {"router_aux_loss_coef", 0.5},
          {"use_sliding_window", false},
          {"tie_word_embeddings", false}};
}

TEST(MoeShapeTest, PresetsHaveTheirPublishedSizes) {
  // mistralai/Mixtral-8x7B-v0.1 and Qwen/Qwen1.5-MoE-A2.7B (safetensors totals).
  EXPECT_EQ(LlamaTotalParams(*FindLlamaPreset("mixtral-8x7b")), 46'702'792'704u);
  EXPECT_EQ(LlamaTotalParams(*FindLlamaPreset("qwen1.5-moe-a2.7b")), 14'315'784'192u);
}

TEST(MoeShapeTest, CountsPerLayerAreTheModulesTensors) {
  for (const json& config : {MixtralConfig(), QwenMoeConfig()}) {
    const LlamaShape s = *ParseHfConfig(config, "config.json");
    uint64_t total = 0;
    std::vector<uint64_t> layers(s.num_hidden_layers, 0);
    for (const auto& [name, shape] : LlamaTensorShapes(s)) {
      uint64_t n = 1;
      for (int64_t d : shape) n *= d;
      total += n;
      if (name.starts_with("model.layers.")) layers[std::stoi(name.substr(13))] += n;
    }
    EXPECT_EQ(total, LlamaTotalParams(s)) << s.architecture;
    for (int64_t l = 0; l < s.num_hidden_layers; ++l) {
      EXPECT_EQ(layers[l], LlamaLayerParams(s, l)) << s.architecture << " layer " << l;
    }
  }
  // Qwen2-MoE's layer 1 is dense (mlp_only_layers): smaller than the sparse ones.
  const LlamaShape q = *ParseHfConfig(QwenMoeConfig(), "config.json");
  EXPECT_TRUE(IsSparseLayer(q, 0));
  EXPECT_FALSE(IsSparseLayer(q, 1));
  EXPECT_EQ(SparseLayerCount(q), 2);
  EXPECT_LT(LlamaLayerParams(q, 1), LlamaLayerParams(q, 0));
  EXPECT_EQ(LlamaLayerParams(q), LlamaLayerParams(q, 0));
}

TEST(MoeShapeTest, ParsesDefaultsAndRefusesWhatItCannotTrain) {
  const LlamaShape m = *ParseHfConfig(MixtralConfig(), "m/config.json");
  EXPECT_EQ(m.num_experts, 4);
  EXPECT_EQ(m.moe_intermediate_size, 48);
  EXPECT_TRUE(m.norm_topk_prob);
  EXPECT_FALSE(m.sliding_window.has_value());
  EXPECT_TRUE(m.output_router_logits);
  // transformers' defaults for absent keys.
  const LlamaShape d =
      *ParseHfConfig(json{{"architectures", {"Qwen2MoeForCausalLM"}}}, "d/config.json");
  EXPECT_EQ(d.num_experts, 60);
  EXPECT_EQ(d.num_experts_per_tok, 4);
  EXPECT_EQ(d.moe_intermediate_size, 1408);
  EXPECT_EQ(d.shared_expert_intermediate_size, 5632);
  EXPECT_FALSE(d.norm_topk_prob);
  EXPECT_TRUE(d.qkv_bias);
  EXPECT_DOUBLE_EQ(d.router_aux_loss_coef, 0.001);

  json jitter = MixtralConfig();
  jitter["router_jitter_noise"] = 0.1;
  Result<LlamaShape> r = ParseHfConfig(jitter, "j/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("router_jitter_noise"), std::string::npos);
  json too_many = MixtralConfig();
  too_many["num_experts_per_tok"] = 5;
  r = ParseHfConfig(too_many, "k/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("num_experts_per_tok"), std::string::npos);
}

// Qwen2-MoE's sliding window: only with use_sliding_window; the layers layer_types lists, else
// transformers 5's Qwen2MoeConfig rule (even layers below max_window_layers), not Qwen2's.
TEST(MoeShapeTest, QwenMoeSlidingWindowLayersAsTransformersDerivesThem) {
  auto windows = [](const json& config) {
    const Result<LlamaShape> s = ParseHfConfig(config, "q/config.json");
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    std::vector<std::optional<int64_t>> out;
    for (int64_t i = 0; s.ok() && i < s->num_hidden_layers; ++i) {
      out.push_back(LayerSlidingWindow(*s, i));
    }
    return out;
  };
  using W = std::vector<std::optional<int64_t>>;
  const std::optional<int64_t> none;
  json c = QwenMoeConfig();
  c["num_hidden_layers"] = 5;
  c["sliding_window"] = 6;
  EXPECT_EQ(windows(c), (W{none, none, none, none, none}));  // use_sliding_window false
  c["use_sliding_window"] = true;
  c["max_window_layers"] = 3;
  EXPECT_EQ(windows(c), (W{6, none, 6, none, none}));
  c.erase("max_window_layers");  // default 28
  EXPECT_EQ(windows(c), (W{6, none, 6, none, 6}));
  c["layer_types"] = {"full_attention", "sliding_attention", "full_attention", "sliding_attention",
                      "sliding_attention"};
  EXPECT_EQ(windows(c), (W{none, 6, none, 6, 6}));
  c.erase("layer_types");
  c["sliding_window"] = nullptr;  // a window of none: full attention
  EXPECT_EQ(windows(c), (W{none, none, none, none, none}));
}

// A paged model (--page-experts: attention, experts and dense MLPs are offload units of their
// own) gives the unpaged model's logits bit for bit, both the reference's; its KV cache (inside the
// attention units) gives the full forward's logits token by token, past Qwen2-MoE's sliding window;
// and a cache left on in a forward that builds a graph is refused (a unit's backward would
// recompute the forward and remember its keys twice).
TEST(MoePagingTest, PagedModelCachesAndGivesTheUnpagedLogits) {
  json config = QwenMoeConfig();
  config["use_sliding_window"] = true;
  config["sliding_window"] = 3;
  config["max_window_layers"] = 3;  // layers 0 and 2 slide
  strata::testing::TempDir dir("strata-moe-paged");
  ASSERT_TRUE(dir.ok());
  const strata::testing::HfWeights weights = strata::testing::RandomWeightsFor(config, 8);
  strata::testing::WriteHfDirectory(dir.path(), config, weights, "F32", 1);
  auto open = [&](bool paged) -> Result<std::unique_ptr<CausalLm>> {
    STRATA_ASSIGN_OR_RETURN(ModelSpec spec, ResolveModel(dir.path(), 0, Weights::kRequired));
    spec.llama->page_experts = paged;
    return OpenModel(std::move(spec), 1, /*eager=*/true);
  };
  auto whole = open(false);
  auto paged = open(true);
  ASSERT_TRUE(whole.ok() && paged.ok()) << whole.status().ToString() << paged.status().ToString();
  int units = 0;
  for (const auto& m : (*paged)->module()->modules()) {
    units += dynamic_cast<OffloadUnitImpl*>(m.get()) != nullptr ? 1 : 0;
  }
  EXPECT_EQ(units, 3 + 2 * (5 + 1) + 1);  // attentions; experts + shared; the dense MLP
  torch::NoGradGuard no_grad;
  torch::manual_seed(2);
  const torch::Tensor ids = torch::randint(96, {2, 10}, torch::kLong);
  const torch::Tensor full = (*whole)->Logits(ids);
  EXPECT_TRUE(torch::equal((*paged)->Logits(ids), full));
  const torch::Tensor reference = strata::testing::ConfigReferenceLogits(config, weights, ids);
  EXPECT_LE((full - reference).abs().max().item<double>(),
            1e-5 * reference.abs().max().item<double>());
  // The window matters at this length: the reference without it differs.
  json unwindowed = config;
  unwindowed["use_sliding_window"] = false;
  EXPECT_GT((strata::testing::ConfigReferenceLogits(unwindowed, weights, ids) - reference)
                .abs()
                .max()
                .item<double>(),
            1e-3);

  ASSERT_TRUE((*paged)->supports_kv_cache());
  (*paged)->SetKvCaching(true);
  std::vector<torch::Tensor> pieces = {(*paged)->LogitsAt(ids.slice(1, 0, 4), 0)};
  for (int64_t t = 4; t < 10; ++t) pieces.push_back((*paged)->LogitsAt(ids.slice(1, t, t + 1), t));
  const torch::Tensor incremental = torch::cat(pieces, 1);
  EXPECT_TRUE(torch::allclose(incremental, full, 1e-5, 1e-5))
      << (incremental - full).abs().max().item<float>();
  {
    torch::AutoGradMode grad(true);
    EXPECT_THROW((*paged)->LogitsAt(ids.slice(1, 0, 1), 10), c10::Error);
  }
  // Off: the cache forgets (a lone token sees only itself).
  (*paged)->SetKvCaching(false);
  EXPECT_FALSE(torch::allclose((*paged)->LogitsAt(ids.slice(1, 9, 10), 9), full.slice(1, 9, 10),
                               1e-3, 1e-3));
}

// With page_experts the memory plan's units (LlamaPlanInput through LlamaLayerUnits, what `strata
// estimate --page-experts` plans) are the model's offload units, in order, with the tensors the
// persistence threshold keeps resident moved out as the engine moves them
// (engine/engine_layout.cc); so are whole layers.
TEST(MoeShapeTest, PlannedUnitsAreTheModelsOffloadUnits) {
  for (const json& config : {MixtralConfig(), QwenMoeConfig()}) {
    for (const bool paged : {false, true}) {
      for (const uint64_t threshold : {uint64_t{0}, uint64_t{100}, uint64_t{1000}}) {
        LlamaShape s = *ParseHfConfig(config, "config.json");
        s.page_experts = paged;
        const auto model = MakeCausalLmModule(s);
        std::vector<uint64_t> units;
        uint64_t in_units = 0;
        for (const auto& item : model->named_modules()) {
          if (dynamic_cast<OffloadUnitImpl*>(item.value().get()) == nullptr) continue;
          uint64_t n = 0;
          for (const torch::Tensor& p : item.value()->parameters()) {
            const uint64_t numel = static_cast<uint64_t>(p.numel());
            in_units += numel;
            if (numel > threshold) n += numel;
          }
          units.push_back(n);
        }
        const PlanInput in = LlamaPlanInput(s, 1, 4, 4, 1'000'000'000, threshold);
        const std::string what = s.architecture + (paged ? " paged" : " whole") + " threshold " +
                                 std::to_string(threshold);
        EXPECT_EQ(in.layout.unit_numel, units) << what;
        uint64_t planned = 0;
        for (uint64_t n : units) planned += n;
        EXPECT_EQ(in.layout.resident_numel, LlamaTotalParams(s) - planned) << what;
        // Paged: Mixtral's 2 layers of attention + 4 experts; Qwen2-MoE's sparse layers 0 and 2
        // of attention + 5 experts + the shared expert, its dense layer 1 of attention + MLP.
        const size_t expected =
            s.model_type == "mixtral" ? (paged ? 2 * (1 + 4) : 2) : (paged ? 7 + 2 + 7 : 3);
        EXPECT_EQ(units.size(), expected) << what;
        EXPECT_LE(in_units, LlamaTotalParams(s));
      }
    }
  }
}

// transformers' load_balancing_loss_func(router_logits, num_experts, top_k) without a mask.
torch::Tensor LoadBalancing(const std::vector<torch::Tensor>& router_logits, int64_t experts,
                            int64_t top_k) {
  const torch::Tensor logits = torch::cat(router_logits, 0);
  const torch::Tensor weights = torch::softmax(logits, -1);
  const torch::Tensor selected = std::get<1>(torch::topk(weights, top_k, -1));
  const torch::Tensor mask = torch::one_hot(selected, experts).to(torch::kFloat32);
  const torch::Tensor tokens_per_expert = mask.mean(0);
  const torch::Tensor prob_per_expert = weights.mean(0);
  return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * static_cast<double>(experts);
}

TEST(MoeGradientTest, LossAndGradientsWithTheAuxLossMatchAutogradThroughTheReference) {
  for (const json& config : {MixtralConfig(), QwenMoeConfig()}) {
    const std::string arch = config.at("architectures")[0];
    strata::testing::TempDir dir("strata-moe-grad");
    ASSERT_TRUE(dir.ok());
    const strata::testing::HfWeights weights = strata::testing::RandomWeightsFor(config, 3);
    strata::testing::WriteHfDirectory(dir.path(), config, weights, "F32", 1);
    torch::manual_seed(4);
    const torch::Tensor windows = torch::randint(96, {2, 9}, torch::kLong);
    const torch::Tensor x = windows.slice(1, 0, 8), y = windows.slice(1, 1, 9);

    // The reference: cross-entropy + coef · load balancing, by autograd.
    strata::testing::HfWeights leaves;
    for (const auto& [name, t] : weights) leaves[name] = t.clone().requires_grad_(true);
    std::vector<torch::Tensor> router_logits;
    const torch::Tensor logits =
        strata::testing::families::MoeLogits(config, leaves, x, &router_logits);
    const int64_t experts = config.value("num_local_experts", config.value("num_experts", 0));
    const torch::Tensor reference =
        torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape(-1)) +
        0.5 * LoadBalancing(router_logits, experts, 2);
    reference.backward();

    ModelOptions mo;
    mo.spec = dir.path();
    mo.eager = true;
    auto lm = OpenModel(mo);
    ASSERT_TRUE(lm.ok()) << lm.status().ToString();
    const torch::Tensor loss = (*lm)->Loss(x, y);
    EXPECT_NEAR(loss.item<double>(), reference.item<double>(), 1e-5 * reference.item<double>())
        << arch;
    loss.backward();
    for (const auto& item : (*lm)->module()->named_parameters()) {
      const torch::Tensor& want = leaves.at(item.key()).grad();
      const torch::Tensor& got = item.value().grad();
      ASSERT_EQ(got.defined(), want.defined()) << arch << " " << item.key();
      if (!want.defined()) continue;  // an expert no token chose: no gradient in either
      const double scale = std::max(want.abs().max().item<double>(), 1e-3);
      EXPECT_LE((got - want).abs().max().item<double>(), 1e-4 * scale) << arch << " " << item.key();
    }
  }
}

// What the units of a paged model ask of an engine, recorded; gathers move nothing (the
// parameters stay where the model holds them) and gradients are kept per unit.
class RecordingHooks final : public strata::UnitHooks {
 public:
  struct Event {
    bool expect = false;     // an announcement, else a gather
    std::vector<int> units;  // the announced units, or the gathered one
  };
  void Gather(int unit, bool) override { events.push_back({false, {unit}}); }
  void Release(int) override {}
  const std::vector<torch::Tensor>& GradParameters(int unit) override { return params[unit]; }
  void GradientsReady(int unit, std::vector<torch::Tensor> g) override { grads[unit] = g; }
  void Expect(const std::vector<int>& units) override { events.push_back({true, units}); }

  std::vector<std::vector<torch::Tensor>> params, grads;
  std::vector<Event> events;
};

TEST(MoePagingTest, ExpertsAreAnnouncedInTheOrderTheyAreGatheredInForwardAndBackward) {
  for (const json& config : {MixtralConfig(), QwenMoeConfig()}) {
    const std::string arch = config.at("architectures")[0];
    strata::testing::TempDir dir("strata-moe-paging");
    ASSERT_TRUE(dir.ok());
    strata::testing::WriteHfDirectory(dir.path(), config,
                                      strata::testing::RandomWeightsFor(config, 5), "F32", 1);
    torch::manual_seed(6);
    const torch::Tensor windows = torch::randint(96, {2, 9}, torch::kLong);
    const torch::Tensor x = windows.slice(1, 0, 8), y = windows.slice(1, 1, 9);

    ModelOptions mo;
    mo.spec = dir.path();
    mo.eager = true;
    auto whole = OpenModel(mo);  // no paging, no engine: plain autograd
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    const torch::Tensor whole_loss = (*whole)->Loss(x, y);
    whole_loss.backward();

    auto spec = ResolveModel(dir.path(), 0, Weights::kRequired);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    spec->llama->page_experts = true;
    auto paged = OpenModel(std::move(*spec), 1, /*eager=*/true);
    ASSERT_TRUE(paged.ok()) << paged.status().ToString();
    RecordingHooks hooks;
    std::vector<OffloadUnitImpl*> units;
    std::vector<bool> conditional;
    int sparse_layers = 0;
    for (const auto& item : (*paged)->module()->named_modules()) {
      if (item.key().ends_with(".experts.0")) ++sparse_layers;
      auto* u = dynamic_cast<OffloadUnitImpl*>(item.value().get());
      if (u == nullptr) continue;
      // Only the routed experts are conditional: attention, dense MLPs and the shared expert run
      // for every token.
      EXPECT_EQ(u->conditional(), item.key().find(".experts.") != std::string::npos)
          << arch << " " << item.key();
      conditional.push_back(u->conditional());
      u->Attach(&hooks, static_cast<int>(units.size()));
      units.push_back(u);
      hooks.params.push_back(u->parameters());
    }
    hooks.grads.resize(units.size());
    ASSERT_GT(sparse_layers, 0) << arch;
    const torch::Tensor loss = (*paged)->Loss(x, y);
    loss.backward();
    for (OffloadUnitImpl* u : units) u->Detach();
    EXPECT_TRUE(torch::equal(loss, whole_loss)) << arch;  // the forward is the same either way

    // Every announcement comes when the one before is used up, and each expert gathered is the
    // next one announced.
    std::vector<int> pending;
    int announcements = 0, expert_gathers = 0;
    for (const RecordingHooks::Event& e : hooks.events) {
      if (e.expect) {
        EXPECT_TRUE(pending.empty()) << arch << ": announcement " << announcements;
        pending = e.units;
        ASSERT_FALSE(pending.empty()) << arch;
        ++announcements;
        continue;
      }
      if (!conditional[e.units[0]]) continue;
      ++expert_gathers;
      ASSERT_FALSE(pending.empty()) << arch << ": unit " << e.units[0] << " gathered unannounced";
      EXPECT_EQ(e.units[0], pending.front()) << arch;
      pending.erase(pending.begin());
    }
    EXPECT_TRUE(pending.empty()) << arch;
    EXPECT_EQ(announcements, 2 * sparse_layers) << arch << ": forward and backward of each";
    EXPECT_GT(expert_gathers, 2 * announcements) << arch << ": too few experts to show an order";

    // The same gradients as the unpaged model's: bit for bit for Mixtral; Qwen2-MoE's shared
    // expert, a unit when paged, returns its input's gradient as one sum where the unpaged graph
    // adds its two matmuls' parts to the layer's input one by one (rounding apart).
    std::map<const void*, torch::Tensor> unit_grads;
    for (size_t u = 0; u < units.size(); ++u) {
      for (size_t i = 0; i < hooks.params[u].size(); ++i) {
        unit_grads[hooks.params[u][i].unsafeGetTensorImpl()] =
            hooks.grads[u].empty() ? torch::Tensor() : hooks.grads[u][i];
      }
    }
    auto want = (*whole)->module()->named_parameters();
    for (const auto& item : (*paged)->module()->named_parameters()) {
      const torch::Tensor& w = want[item.key()].grad();
      auto it = unit_grads.find(item.value().unsafeGetTensorImpl());
      const torch::Tensor got = it != unit_grads.end() ? it->second : item.value().grad();
      ASSERT_EQ(got.defined(), w.defined()) << arch << " " << item.key();
      if (!w.defined()) continue;
      if (arch == "MixtralForCausalLM") {
        EXPECT_TRUE(torch::equal(got, w)) << arch << " " << item.key();
      } else {
        const double scale = std::max(w.abs().max().item<double>(), 1e-6);
        EXPECT_LE((got - w).abs().max().item<double>(), 1e-5 * scale) << arch << " " << item.key();
      }
    }
  }
}

}  // namespace
}  // namespace strata::runtime
