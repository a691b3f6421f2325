// The Llama family: modules (llama.h) and the CausalLm over them (deferred initialization from a
// checkpoint's shards or from generators seeded by parameter name).
#include "runtime/models/llama.h"

#include <cmath>
#include <set>
#include <utility>

#include "base/logging.h"
#include "runtime/models/gemma2.h"
#include "runtime/persist/hf_checkpoint.h"

namespace strata::runtime {

LlamaLinearImpl::LlamaLinearImpl(int64_t in, int64_t out, bool with_bias) {
  weight = register_parameter("weight", torch::empty({out, in}));
  if (with_bias) bias = register_parameter("bias", torch::empty({out}));
}

RmsNormImpl::RmsNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::empty({dim}));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  torch::Tensor h = x.to(torch::kFloat32);
  const torch::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(variance + eps_);
  return weight * h.to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaShape& s, int64_t layer)
    : heads_(s.num_attention_heads), kv_heads_(s.num_key_value_heads), head_dim_(s.head_dim) {
  spec_.scaling = std::pow(static_cast<double>(head_dim_), -0.5);
  spec_.sliding_window = LayerSlidingWindow(s, layer);
  const bool qkv_bias = s.attention_bias || s.qkv_bias;
  if (FusedProjections(s)) {
    qkv_proj_ = register_module(
        "qkv_proj", LlamaLinear(s.hidden_size, (heads_ + 2 * kv_heads_) * head_dim_, false));
  } else {
    q_proj_ = register_module("q_proj", LlamaLinear(s.hidden_size, heads_ * head_dim_, qkv_bias));
    k_proj_ =
        register_module("k_proj", LlamaLinear(s.hidden_size, kv_heads_ * head_dim_, qkv_bias));
    v_proj_ =
        register_module("v_proj", LlamaLinear(s.hidden_size, kv_heads_ * head_dim_, qkv_bias));
  }
  o_proj_ =
      register_module("o_proj", LlamaLinear(heads_ * head_dim_, s.hidden_size, s.attention_bias));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                          const torch::Tensor& sin) {
  const int64_t B = x.size(0), T = x.size(1);
  torch::Tensor q, k, v;
  if (qkv_proj_) {
    const torch::Tensor qkv = qkv_proj_(x);
    const int64_t q_out = heads_ * head_dim_, kv_out = kv_heads_ * head_dim_;
    q = qkv.narrow(-1, 0, q_out);
    k = qkv.narrow(-1, q_out, kv_out);
    v = qkv.narrow(-1, q_out + kv_out, kv_out);
  } else {
    q = q_proj_(x);
    k = k_proj_(x);
    v = v_proj_(x);
  }
  q = q.view({B, T, heads_, head_dim_}).transpose(1, 2);
  k = k.view({B, T, kv_heads_, head_dim_}).transpose(1, 2);
  v = v.view({B, T, kv_heads_, head_dim_}).transpose(1, 2);
  const torch::Tensor c = cos.unsqueeze(0).unsqueeze(0), s = sin.unsqueeze(0).unsqueeze(0);
  q = ApplyRotary(q, c, s);
  k = ApplyRotary(k, c, s);
  const auto [keys, values] = kv_cache.Remember(k, v);
  return o_proj_(EagerAttention(q, keys, values, spec_));
}

LlamaMlpImpl::LlamaMlpImpl(const LlamaShape& s) {
  if (FusedProjections(s)) {
    gate_up_proj_ =
        register_module("gate_up_proj", LlamaLinear(s.hidden_size, 2 * s.intermediate_size, false));
    down_proj_ =
        register_module("down_proj", LlamaLinear(s.intermediate_size, s.hidden_size, false));
    return;
  }
  gate_proj_ =
      register_module("gate_proj", LlamaLinear(s.hidden_size, s.intermediate_size, s.mlp_bias));
  up_proj_ =
      register_module("up_proj", LlamaLinear(s.hidden_size, s.intermediate_size, s.mlp_bias));
  down_proj_ =
      register_module("down_proj", LlamaLinear(s.intermediate_size, s.hidden_size, s.mlp_bias));
}

torch::Tensor LlamaMlpImpl::forward(const torch::Tensor& x) {
  if (gate_up_proj_) {  // Phi3MLP: gate first, then up; up · silu(gate)
    const std::vector<torch::Tensor> gate_up = gate_up_proj_(x).chunk(2, -1);
    return down_proj_(gate_up[1] * torch::silu(gate_up[0]));
  }
  return down_proj_(torch::silu(gate_proj_(x)) * up_proj_(x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaShape& s, int64_t layer,
                                             std::shared_ptr<RouterLoss> router_loss) {
  if (s.page_experts) {
    paged_self_attn_ = register_module("self_attn", Offload(LlamaAttention(s, layer)));
  } else {
    self_attn_ = register_module("self_attn", LlamaAttention(s, layer));
  }
  if (IsSparseLayer(s, layer)) {
    int slot = 0;  // this layer's index among the sparse ones
    for (int64_t l = 0; l < layer; ++l) slot += IsSparseLayer(s, l) ? 1 : 0;
    moe_ = register_module(s.model_type == "mixtral" ? "block_sparse_moe" : "mlp",
                           SparseMoe(s, slot, std::move(router_loss)));
  } else if (s.page_experts) {
    paged_mlp_ = register_module("mlp", Offload(LlamaMlp(s)));
  } else {
    mlp_ = register_module("mlp", LlamaMlp(s));
  }
  input_layernorm_ = register_module("input_layernorm", RmsNorm(s.hidden_size, s.rms_norm_eps));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm", RmsNorm(s.hidden_size, s.rms_norm_eps));
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x,
                                             const strata::UnitInputs& rope) {
  TORCH_CHECK(rope.size() == 2, "a Llama decoder layer takes (hidden, {cos, sin})");
  const torch::Tensor attention_in = input_layernorm_(x);
  torch::Tensor h = x + (paged_self_attn_ ? paged_self_attn_->forward(attention_in, rope)
                                          : self_attn_->forward(attention_in, rope[0], rope[1]));
  const torch::Tensor normed = post_attention_layernorm_(h);
  return h + (moe_ ? moe_(normed) : paged_mlp_ ? paged_mlp_->forward(normed) : mlp_(normed));
}

LlamaForCausalLmImpl::LlamaForCausalLmImpl(const LlamaShape& s) : shape_(s), rope_(s) {
  model_ = register_module("model", std::make_shared<torch::nn::Module>("LlamaModel"));
  auto embed = std::make_shared<torch::nn::Module>("Embedding");
  embed_weight_ = embed->register_parameter("weight", torch::empty({s.vocab_size, s.hidden_size}));
  model_->register_module("embed_tokens", embed);
  layers_ = model_->register_module("layers", torch::nn::ModuleList());
  if (s.num_experts > 0 && s.output_router_logits && SparseLayerCount(s) > 0) {
    router_loss_ = std::make_shared<RouterLoss>(static_cast<int>(SparseLayerCount(s)),
                                                s.num_experts, s.num_experts_per_tok);
  }
  for (int64_t i = 0; i < s.num_hidden_layers; ++i) {
    if (s.page_experts) {
      layers_->push_back(LlamaDecoderLayer(s, i, router_loss_));  // its parts are the units
    } else {
      layers_->push_back(Offload(LlamaDecoderLayer(s, i, router_loss_)));
    }
  }
  norm_ = model_->register_module("norm", RmsNorm(s.hidden_size, s.rms_norm_eps));
  if (!s.tie_word_embeddings) {
    lm_head_ = register_module("lm_head", LlamaLinear(s.hidden_size, s.vocab_size, false));
  }
}

torch::Tensor LlamaForCausalLmImpl::forward(const torch::Tensor& ids, int64_t position_offset) {
  const int64_t T = ids.size(1);
  // padding_idx: the pad row gets no gradient from the lookup, as nn.Embedding(padding_idx=...).
  torch::Tensor x = torch::embedding(embed_weight_, ids, shape_.pad_token_id.value_or(-1));
  // Rotary tables for positions offset..offset+T-1, in fp32, then in the compute dtype.
  const RopeTables tables = rope_.Tables(position_offset, T, x.scalar_type(), ids.device());
  const strata::UnitInputs rope = {tables.cos, tables.sin};
  for (const auto& layer : *layers_) {
    if (auto* unit = layer->as<OffloadUnitImpl>()) {
      x = unit->forward(x, rope);
    } else {
      x = layer->as<LlamaDecoderLayerImpl>()->forward(x, rope);
    }
  }
  if (router_loss_) {
    // The aux value is known now (every layer has routed); it enters the graph here so that its
    // gradient scale is known before any layer's backward (moe.h).
    const std::vector<torch::Tensor> attached =
        AttachAuxLoss(x, router_loss_->Value(), router_loss_.get());
    x = attached[0];
    aux_loss_ = attached[1] * shape_.router_aux_loss_coef;
  }
  x = norm_(x);
  return lm_head_ ? lm_head_(x) : torch::linear(x, embed_weight_);
}

std::shared_ptr<CausalLmModule> MakeCausalLmModule(const LlamaShape& s) {
  if (IsGemma2(s)) return std::make_shared<Gemma2ForCausalLmImpl>(s);
  return std::make_shared<LlamaForCausalLmImpl>(s);
}

std::vector<std::pair<std::string, std::vector<int64_t>>> LlamaTensorShapes(const LlamaShape& s) {
  const auto probe = MakeCausalLmModule(s);  // uninitialized tensors: nothing is touched
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& item : probe->named_parameters()) {
    out.emplace_back(item.key(), item.value().sizes().vec());
  }
  return out;
}

namespace {

// Random initialization as transformers' _init_weights (normal(0, initializer_range) for
// matrices and the embedding, `norm_weight` for norms: 1, or 0 for Gemma 2's norms that scale by
// 1 + weight; 0 for biases), seeded by name.
void InitializeByName(torch::Tensor t, const std::string& name, uint64_t seed, double std,
                      double norm_weight) {
  torch::NoGradGuard no_grad;
  const bool norm = name.ends_with("norm.weight");
  if (norm) {
    t.fill_(norm_weight);
  } else if (name.ends_with(".bias")) {
    t.zero_();
  } else {
    t.normal_(0.0, std, NamedGenerator(seed, name));
  }
}

class LlamaLm final : public CausalLm {
 public:
  LlamaLm(const LlamaShape& shape, uint64_t seed, std::unique_ptr<HfCheckpoint> checkpoint,
          std::string hf_dir, nlohmann::json hf_config)
      : shape_(shape),
        seed_(seed),
        checkpoint_(std::move(checkpoint)),
        hf_dir_(std::move(hf_dir)),
        hf_config_(std::move(hf_config)),
        model_(MakeCausalLmModule(shape)) {
    // The offload units in the order the engine numbers them (module order): the decoder
    // layers, or with per-expert paging each layer's attention, experts and MLPs.
    for (const auto& item : model_->named_modules()) {
      if (dynamic_cast<OffloadUnitImpl*>(item.value().get()) == nullptr) continue;
      std::vector<std::pair<std::string, torch::Tensor>> params;
      for (const auto& p : item.value()->named_parameters()) {
        params.emplace_back(item.key() + "." + p.key(), p.value());
        in_units_.insert(params.back().first);
      }
      unit_params_.push_back(std::move(params));
    }
  }

  Status InitializeResident() {
    for (const auto& item : model_->named_parameters()) {
      if (in_units_.count(item.key())) continue;
      STRATA_RETURN_IF_ERROR(Fill(item.key(), item.value()));
    }
    return Status::Ok();
  }

  std::shared_ptr<torch::nn::Module> module() override { return model_; }
  torch::Tensor Logits(const torch::Tensor& ids) override { return model_->forward(ids, 0); }
  torch::Tensor LogitsAt(const torch::Tensor& ids, int64_t position_offset) override {
    return model_->forward(ids, position_offset);
  }
  // Every layer's attention caches, whether it runs inside its decoder layer's unit or (per-expert
  // paging) as a unit of its own: a cached forward builds no graph, so no backward recomputes it.
  bool supports_kv_cache() const override { return true; }
  int64_t kv_cache_rebuild_length() const override {
    const bool longrope =
        shape_.rope_scaling && shape_.rope_scaling->type == RopeScaling::Type::kLongrope;
    return longrope && shape_.model_type == "phi3"
               ? shape_.rope_scaling->original_max_position_embeddings
               : 0;
  }
  torch::Tensor AuxiliaryLoss() override { return model_->aux_loss(); }
  Status InitializeUnit(int unit) override {
    if (unit < 0 || unit >= num_units()) {
      return InvalidArgumentError("no decoder layer " + std::to_string(unit));
    }
    for (auto& [name, t] : unit_params_[unit]) {
      // Fresh storage now rather than the construction-time allocation: the engine frees this
      // unit's storage once it has taken the values, and the next unit's allocations of the same
      // sizes reuse it, so the heap holds about one unit (not one per unit, as glibc's growing
      // mmap threshold would otherwise leave behind).
      t.set_data(torch::empty(t.sizes(), t.options()));
      STRATA_RETURN_IF_ERROR(Fill(name, t));
    }
    // The engine takes the values from here on; the model keeps no reference of its own.
    return Status::Ok();
  }
  int num_units() const override { return static_cast<int>(unit_params_.size()); }
  std::string family() const override { return "llama"; }
  std::string Describe() const override {
    return shape_.architecture + " " + shape_.name + ": " +
           std::to_string(LlamaTotalParams(shape_) / 1'000'000) + "M parameters, " +
           std::to_string(shape_.num_hidden_layers) + " layers x " +
           std::to_string(shape_.hidden_size) + ", " + std::to_string(shape_.num_attention_heads) +
           "/" + std::to_string(shape_.num_key_value_heads) + " heads" +
           (shape_.num_experts > 0 ? ", " + std::to_string(shape_.num_experts_per_tok) + " of " +
                                         std::to_string(shape_.num_experts) + " experts"
                                   : std::string()) +
           (checkpoint_ ? "" : " (random weights, seed " + std::to_string(seed_) + ")");
  }
  uint64_t num_parameters() const override { return LlamaTotalParams(shape_); }
  int64_t vocab_size() const override { return shape_.vocab_size; }
  // Sliding windows are computed (attention.h) and rope extends past max_position_embeddings
  // as transformers does: no bound but the token index type.
  int64_t max_seq_len() const override { return std::numeric_limits<int32_t>::max(); }
  int64_t hidden_size() const override { return shape_.hidden_size; }
  ActivationBytes Activations(int micro_batch, int seq_len, int compute_bytes) const override {
    return LlamaActivationBytes(shape_, micro_batch, seq_len, compute_bytes);
  }
  std::string hf_dir() const override { return hf_dir_; }
  nlohmann::json HfConfig() const override { return hf_config_; }
  std::string ExportDtype(const std::string& name) const override {
    if (checkpoint_) {
      if (const HfTensorInfo* t = checkpoint_->Find(name)) return t->dtype;
    }
    const std::string& d = shape_.torch_dtype;
    return d == "bfloat16" ? "BF16" : d == "float16" ? "F16" : "F32";
  }
  nlohmann::json Identity() const override {
    return {{"family", "llama"},
            {"architecture", shape_.architecture},
            {"num_hidden_layers", shape_.num_hidden_layers},
            {"hidden_size", shape_.hidden_size},
            {"vocab_size", shape_.vocab_size}};
  }

 private:
  Status Fill(const std::string& name, torch::Tensor t) {
    if (!checkpoint_) {
      InitializeByName(t, name, seed_, shape_.initializer_range, IsGemma2(shape_) ? 0.0 : 1.0);
      return Status::Ok();
    }
    if (shape_.tie_word_embeddings && name == "lm_head.weight") return Status::Ok();
    return checkpoint_->ReadFloat32(name, t.data_ptr<float>());
  }

  LlamaShape shape_;
  uint64_t seed_;
  std::unique_ptr<HfCheckpoint> checkpoint_;
  std::string hf_dir_;
  nlohmann::json hf_config_;
  std::shared_ptr<CausalLmModule> model_;
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> unit_params_;
  std::set<std::string> in_units_;  // names of the parameters inside offload units
};

// Checks the checkpoint's tensors against the model's: every one present with its shape and a
// float dtype; extras refused, except those transformers ignores too (a tied head's copy, the
// rotary inv_freq buffers older conversions saved).
Status CheckTensors(const LlamaShape& s, const HfCheckpoint& ckpt, const std::string& dir) {
  const auto expected = LlamaTensorShapes(s);
  std::vector<std::string> problems;
  std::set<std::string> names;
  auto where = [&](const HfTensorInfo& t) { return " (" + t.file + ")"; };
  for (const auto& [name, shape] : expected) {
    names.insert(name);
    const HfTensorInfo* t = ckpt.Find(name);
    if (t == nullptr) {
      problems.push_back("tensor " + name + " is missing");
      continue;
    }
    if (t->shape != shape) {
      auto str = [](const std::vector<int64_t>& v) {
        std::string o = "[";
        for (size_t i = 0; i < v.size(); ++i) o += (i ? ", " : "") + std::to_string(v[i]);
        return o + "]";
      };
      problems.push_back("tensor " + name + " has shape " + str(t->shape) + ", the config says " +
                         str(shape) + where(*t));
    }
    if (t->dtype != "F32" && t->dtype != "BF16" && t->dtype != "F16") {
      problems.push_back("tensor " + name + " is " + t->dtype + ", strata loads F32, BF16 and F16" +
                         where(*t));
    }
  }
  int ignored = 0;
  for (const HfTensorInfo& t : ckpt.tensors()) {
    if (names.count(t.name)) continue;
    if ((s.tie_word_embeddings && t.name == "lm_head.weight") ||
        t.name.ends_with("rotary_emb.inv_freq")) {
      ++ignored;
      continue;
    }
    problems.push_back("unexpected tensor " + t.name + where(t));
  }
  if (ignored > 0) {
    STRATA_LOG(kWarning) << dir << ": ignoring " << ignored
                         << " tensor(s) transformers ignores too (a tied lm_head.weight, "
                            "rotary_emb.inv_freq)";
  }
  if (problems.empty()) return Status::Ok();
  std::string msg = dir + ": the checkpoint does not match config.json (" +
                    std::to_string(problems.size()) + " problem" +
                    (problems.size() == 1 ? "" : "s") + "): ";
  const size_t shown = std::min<size_t>(problems.size(), 8);
  for (size_t i = 0; i < shown; ++i) msg += (i ? "; " : "") + problems[i];
  if (shown < problems.size())
    msg += "; ... and " + std::to_string(problems.size() - shown) + " more";
  return InvalidArgumentError(msg);
}

}  // namespace

Result<std::unique_ptr<CausalLm>> MakeLlama(const LlamaShape& shape, uint64_t seed,
                                            std::unique_ptr<HfCheckpoint> checkpoint,
                                            std::string hf_dir, nlohmann::json hf_config) {
  if (checkpoint) STRATA_RETURN_IF_ERROR(CheckTensors(shape, *checkpoint, hf_dir));
  auto lm = std::make_unique<LlamaLm>(shape, seed, std::move(checkpoint), std::move(hf_dir),
                                      std::move(hf_config));
  STRATA_RETURN_IF_ERROR(lm->InitializeResident());
  return std::unique_ptr<CausalLm>(std::move(lm));
}

}  // namespace strata::runtime
