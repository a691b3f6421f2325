// hf_reference_dense.cc: the dense families of hf_config_reference.h — LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM and Phi3ForCausalLM — read from config.json as
// transformers (v5, with the v4 "rope_scaling" spelling still accepted) reads it. Written from
// transformers' Python source, without reading runtime/models/ or runtime/plan/.
//
// What each piece follows:
//   Defaults       configuration_llama.py / configuration_mistral.py / configuration_qwen2.py /
//                  configuration_phi3.py for absent (or null) keys:
//                              Llama    Mistral  Qwen2    Phi3
//                    vocab     32000    32000    151936   32064
//                    hidden    4096     4096     4096     3072
//                    inter     11008    14336    22016    8192
//                    layers    32       32       32       32
//                    heads     32       32       32       32
//                    kv heads  =heads   8        32       =heads
//                    max_pos   2048     131072   32768    4096
//                    rms eps   1e-6     1e-6     1e-6     1e-5
//                  rope_theta 10000 and tie_word_embeddings false everywhere; head_dim (key
//                  "head_dim", else hidden / heads) sizes q/k/v/o and the attention scale.
//   Biases         Llama: attention_bias -> q,k,v,o biases, mlp_bias -> gate,up,down biases.
//                  Qwen2: q,k,v biases always. Mistral, Phi3: none.
//   Phi3           modeling_phi3.py: self_attn.qkv_proj rows are q (heads*d), k (kv*d), v (kv*d);
//                  mlp.gate_up_proj output is chunk(2): gate first, then up; down(up * silu(gate)).
//                  apply_rotary_pos_emb rotates only the first rotary_dim = head_dim *
//                  partial_rotary_factor dims of each head and passes the rest through.
//   Sliding window masking_utils.py: sliding_window_overlay keeps kv_idx > q_idx - window on top
//                  of the causal kv_idx <= q_idx (so each query sees `window` keys, itself
//                  included). Which layers slide: an explicit "layer_types" list in config.json
//                  ("sliding_attention" slides); else Mistral and Phi3 slide every layer when
//                  sliding_window is not null (Mistral default 4096, Phi3 default null); Qwen2's
//                  window is sliding_window only when use_sliding_window (default false;
//                  sliding_window default 4096) and layer i slides iff i >= max_window_layers
//                  (default 28), as configuration_qwen2.py builds layer_types.
//   RoPE           modeling_rope_utils.py (v5) with its RotaryEmbeddingConfigMixin: parameters
//                  from "rope_scaling" or "rope_parameters" (type from "rope_type", else "type",
//                  else default), rope_theta inside it or top-level; partial_rotary_factor
//                  inside it or top-level (default 1); original_max_position_embeddings for
//                  llama3/yarn/longrope is the top-level key when the config has one (Phi3
//                  always does: default 4096), else rope_scaling's, else max_position_embeddings.
//                  Phi3 maps the legacy types "su" and "yarn" to longrope and accepts only
//                  default and longrope.
//     default      inv_freq = 1 / theta^(arange(0, dim, 2) / dim), fp32.
//     linear       default / factor.
//     dynamic      dynamic_rope_update: for a forward over 0..T-1 with T > max_position_embeddings
//                  the base becomes theta * (factor * T / max_pos - (factor - 1))^(dim / (dim-2))
//                  (computed in fp32 tensors); otherwise the default frequencies.
//     yarn         blend of inv_freq / factor and inv_freq by a linear ramp over the correction
//                  range of beta_fast (default 32) / beta_slow (default 1) at the original length
//                  (floor/ceil unless "truncate": false); an explicit factor wins (v5; v4.4x-4.5x
//                  replaced it by max_pos / original whenever rope_scaling had an original
//                  length, which made Qwen2.5's published yarn a no-op); factor null -> max_pos /
//                  original;
//                  attention_factor, else mscale ratio (mscale and mscale_all_dim), else
//                  0.1 * ln(factor) + 1 (1 when factor <= 1).
//     longrope     inv_freq = 1 / (ext * theta^(arange/dim)) with ext = long_factor when
//                  T > original_max_position_embeddings, else short_factor; factor = "factor",
//                  else max_pos / original; attention_factor, else sqrt(1 + ln(factor) /
//                  ln(original)) (1 when factor <= 1).
//     llama3       _compute_llama3_parameters (as hf_reference.cc).
//                  cos and sin (of cat(freqs, freqs)) are multiplied by the attention factor.
//
// Planted bugs (hf_config_reference.h's PlantBug), each changing the numbers only while planted:
//   "sliding_window_off_by_one"        the window keeps kv_idx >= q_idx - window (one key wider).
//   "rope_linear_unscaled"             linear rope ignores its factor.
//   "rope_dynamic_static"              dynamic NTK is never recomputed (default frequencies).
//   "rope_yarn_no_attention_factor"    yarn's cos/sin are not multiplied by its attention factor.
//   "rope_longrope_short_factor_only"  longrope uses the short factors at every length.
//   "phi3_gate_up_swapped"             Phi3 takes up from the first half of gate_up_proj.
#include "tests/testing/hf_reference_dense.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/testing/hf_config_reference.h"
#include "tests/testing/hf_reference_families.h"

namespace strata::testing::families {
namespace {

using nlohmann::json;

enum class Arch { kLlama, kMistral, kQwen2, kPhi3 };

[[noreturn]] void Fail(const std::string& why) {
  throw std::invalid_argument("hf_reference_dense: " + why);
}

Arch ArchOf(const json& config) {
  const std::string arch = config.at("architectures").at(0).get<std::string>();
  if (arch == "LlamaForCausalLM") return Arch::kLlama;
  if (arch == "MistralForCausalLM") return Arch::kMistral;
  if (arch == "Qwen2ForCausalLM") return Arch::kQwen2;
  if (arch == "Phi3ForCausalLM") return Arch::kPhi3;
  Fail("architecture " + arch + " is not a dense family");
}

// config[key] when present and not null (transformers treats an explicit null as the class
// default for these keys), else `fallback`.
bool Has(const json& j, const char* key) { return j.contains(key) && !j.at(key).is_null(); }
int64_t Int(const json& j, const char* key, int64_t fallback) {
  return Has(j, key) ? j.at(key).get<int64_t>() : fallback;
}
double Num(const json& j, const char* key, double fallback) {
  return Has(j, key) ? j.at(key).get<double>() : fallback;
}
bool Bool(const json& j, const char* key, bool fallback) {
  return Has(j, key) ? j.at(key).get<bool>() : fallback;
}

struct Rope {
  std::string type = "default";
  double theta = 10000.0;
  int64_t dim = 0;  // rotary dim
  int64_t max_position_embeddings = 0;
  int64_t original_max_position_embeddings = 0;
  json params = json::object();  // the rope_scaling / rope_parameters object
};

struct Dense {
  Arch arch = Arch::kLlama;
  int64_t vocab = 0, hidden = 0, inter = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  double eps = 1e-6;
  bool tie = false, qkv_bias = false, o_bias = false, mlp_bias = false;
  std::vector<std::optional<int64_t>> window;  // per layer; nullopt: full causal attention
  Rope rope;
};

Rope ParseRope(const json& c, Arch arch, int64_t head_dim, int64_t max_pos) {
  Rope r;
  r.max_position_embeddings = max_pos;
  if (Has(c, "rope_scaling")) {
    r.params = c.at("rope_scaling");
  } else if (Has(c, "rope_parameters")) {
    r.params = c.at("rope_parameters");
  }
  if (!r.params.is_object()) Fail("rope_scaling must be an object or null");
  if (r.params.contains("full_attention") || r.params.contains("sliding_attention")) {
    Fail("rope parameters per layer type are not covered for dense families");
  }
  r.type = r.params.value("rope_type", r.params.value("type", std::string("default")));
  if (arch == Arch::kPhi3) {
    // Phi3Config.convert_rope_params_to_dict: legacy "su" / "yarn" configs are longrope.
    if (r.type == "su" || r.type == "yarn") r.type = "longrope";
    if (r.type != "default" && r.type != "longrope") {
      Fail("Phi3 rope_scaling type must be default or longrope, got " + r.type);
    }
  }
  r.theta = Num(r.params, "rope_theta", Num(c, "rope_theta", 10000.0));
  const double partial =
      Num(r.params, "partial_rotary_factor", Num(c, "partial_rotary_factor", 1.0));
  r.dim = static_cast<int64_t>(static_cast<double>(head_dim) * partial);
  if (r.dim <= 0 || r.dim % 2 != 0 || r.dim > head_dim) Fail("rotary dim must be even and > 0");
  // standardize_rope_params: a top-level original_max_position_embeddings wins (Phi3's class
  // attribute, default 4096), then rope_scaling's, then max_position_embeddings.
  if (arch == Arch::kPhi3 || Has(c, "original_max_position_embeddings")) {
    r.original_max_position_embeddings = Int(c, "original_max_position_embeddings", 4096);
  } else {
    r.original_max_position_embeddings = Int(r.params, "original_max_position_embeddings", max_pos);
  }
  static const char* kTypes[] = {"default", "linear", "dynamic", "yarn", "longrope", "llama3"};
  bool known = false;
  for (const char* t : kTypes) known = known || r.type == t;
  if (!known) Fail("rope type " + r.type + " is not covered");
  if ((r.type == "linear" || r.type == "dynamic" || r.type == "llama3") &&
      !Has(r.params, "factor")) {
    Fail("rope_scaling of type " + r.type + " needs \"factor\"");
  }
  if (r.type == "longrope") {
    for (const char* key : {"short_factor", "long_factor"}) {
      if (!r.params.contains(key) || !r.params.at(key).is_array() ||
          static_cast<int64_t>(r.params.at(key).size()) != r.dim / 2) {
        Fail(std::string("longrope needs ") + key + " of length rotary_dim / 2");
      }
    }
  }
  return r;
}

Dense Parse(const json& c) {
  Dense d;
  d.arch = ArchOf(c);
  struct Defaults {
    int64_t vocab, hidden, inter, kv_heads, max_pos;
    double eps;
  };
  Defaults def{32000, 4096, 11008, -1, 2048, 1e-6};  // Llama; -1: kv heads = heads
  if (d.arch == Arch::kMistral) def = {32000, 4096, 14336, 8, 4096 * 32, 1e-6};
  if (d.arch == Arch::kQwen2) def = {151936, 4096, 22016, 32, 32768, 1e-6};
  if (d.arch == Arch::kPhi3) def = {32064, 3072, 8192, -1, 4096, 1e-5};
  d.vocab = Int(c, "vocab_size", def.vocab);
  d.hidden = Int(c, "hidden_size", def.hidden);
  d.inter = Int(c, "intermediate_size", def.inter);
  d.layers = Int(c, "num_hidden_layers", 32);
  d.heads = Int(c, "num_attention_heads", 32);
  // Absent: the class default; an explicit null: every configuration class uses the heads.
  d.kv_heads = !c.contains("num_key_value_heads") && def.kv_heads > 0
                   ? def.kv_heads
                   : Int(c, "num_key_value_heads", d.heads);
  d.eps = Num(c, "rms_norm_eps", def.eps);
  d.tie = Bool(c, "tie_word_embeddings", false);
  if (d.vocab <= 0 || d.hidden <= 0 || d.inter <= 0 || d.layers < 0 || d.heads <= 0 ||
      d.kv_heads <= 0) {
    Fail("sizes must be positive");
  }
  if (d.heads % d.kv_heads != 0) Fail("num_attention_heads not a multiple of num_key_value_heads");
  if (!Has(c, "head_dim") && d.hidden % d.heads != 0) Fail("hidden_size not divisible by heads");
  d.head_dim = Int(c, "head_dim", d.hidden / d.heads);
  if (d.arch == Arch::kLlama) {
    d.qkv_bias = d.o_bias = Bool(c, "attention_bias", false);
    d.mlp_bias = Bool(c, "mlp_bias", false);
  }
  if (d.arch == Arch::kQwen2) d.qkv_bias = true;
  const int64_t max_pos = Int(c, "max_position_embeddings", def.max_pos);
  d.rope = ParseRope(c, d.arch, d.head_dim, max_pos);

  // The window of sliding layers, and which layers slide.
  std::optional<int64_t> window;
  std::vector<bool> slides(static_cast<size_t>(d.layers), false);
  if (d.arch == Arch::kMistral) {
    // Absent: MistralConfig's default 4096; null: full attention.
    if (!c.contains("sliding_window")) {
      window = 4096;
    } else if (!c.at("sliding_window").is_null()) {
      window = c.at("sliding_window").get<int64_t>();
    }
    slides.assign(slides.size(), true);
  } else if (d.arch == Arch::kPhi3) {
    if (Has(c, "sliding_window")) window = c.at("sliding_window").get<int64_t>();
    slides.assign(slides.size(), true);
  } else if (d.arch == Arch::kQwen2) {
    const bool use = Bool(c, "use_sliding_window", false);
    // Qwen2Config.__post_init__: sliding_window = sliding_window if use_sliding_window else None
    // (absent: 4096; an explicit null: no layer slides).
    if (use && !c.contains("sliding_window")) window = 4096;
    if (use && Has(c, "sliding_window")) window = c.at("sliding_window").get<int64_t>();
    const int64_t max_window_layers = Int(c, "max_window_layers", 28);
    for (int64_t i = 0; i < d.layers; ++i)
      slides[static_cast<size_t>(i)] = use && i >= max_window_layers;
  }  // LlamaConfig has no sliding window: a "sliding_window" key is an ignored extra attribute.
  if (Has(c, "layer_types")) {
    const json& types = c.at("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != d.layers) {
      Fail("layer_types must list num_hidden_layers entries");
    }
    for (int64_t i = 0; i < d.layers; ++i) {
      const std::string t = types.at(static_cast<size_t>(i)).get<std::string>();
      if (t != "sliding_attention" && t != "full_attention") Fail("unknown layer type " + t);
      slides[static_cast<size_t>(i)] = t == "sliding_attention";
    }
  }
  if (window && *window <= 0) Fail("sliding_window must be positive");
  for (int64_t i = 0; i < d.layers; ++i) {
    d.window.push_back(slides[static_cast<size_t>(i)] ? window : std::nullopt);
  }
  return d;
}

// ---- RoPE (modeling_rope_utils.py) --------------------------------------------------------------

// The dynamic-NTK base is a tensor in transformers (seq_len is one): torch.pow(Tensor, Tensor).
torch::Tensor InvFreqFromBase(const torch::Tensor& base, int64_t dim) {
  const torch::Tensor exponent = torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / dim;
  return torch::pow(base, exponent).reciprocal();
}

// `theta ** (arange(0, dim, 2) / dim)` with a Python-float base: torch.pow(Scalar, Tensor).
torch::Tensor PosFreqs(const Rope& r) {
  return torch::pow(r.theta, torch::arange(0, r.dim, 2, torch::kLong).to(torch::kFloat) / r.dim);
}

torch::Tensor DefaultInvFreq(const Rope& r) { return PosFreqs(r).reciprocal(); }

double GetMscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// Python's `x or default` for an optional number: absent, null or 0 take the default.
double OrDefault(const json& params, const char* key, double fallback) {
  const double v = Num(params, key, 0.0);
  return v != 0.0 ? v : fallback;
}

torch::Tensor YarnInvFreq(const Rope& r, double* attention_factor) {
  const json& p = r.params;
  const double original = static_cast<double>(r.original_max_position_embeddings);
  const double factor =
      Has(p, "factor") ? p.at("factor").get<double>() : r.max_position_embeddings / original;
  if (Has(p, "attention_factor")) {
    *attention_factor = p.at("attention_factor").get<double>();
  } else if (OrDefault(p, "mscale", 0.0) != 0.0 && OrDefault(p, "mscale_all_dim", 0.0) != 0.0) {
    *attention_factor = GetMscale(factor, p.at("mscale").get<double>()) /
                        GetMscale(factor, p.at("mscale_all_dim").get<double>());
  } else {
    *attention_factor = GetMscale(factor, 1.0);
  }
  const double beta_fast = OrDefault(p, "beta_fast", 32.0);
  const double beta_slow = OrDefault(p, "beta_slow", 1.0);
  const double dim = static_cast<double>(r.dim);
  auto correction_dim = [&](double rotations) {
    return dim * std::log(original / (rotations * 2.0 * M_PI)) / (2.0 * std::log(r.theta));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (Bool(p, "truncate", true)) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // linear_ramp_factor's guard against a zero-width ramp

  const torch::Tensor pos_freqs = PosFreqs(r);
  const torch::Tensor extrapolation = pos_freqs.reciprocal();
  const torch::Tensor interpolation = (pos_freqs * factor).reciprocal();
  const torch::Tensor ramp =
      ((torch::arange(r.dim / 2, torch::kFloat) - low) / (high - low)).clamp(0, 1);
  const torch::Tensor extrapolation_factor = 1 - ramp;
  return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
}

torch::Tensor LongropeInvFreq(const Rope& r, int64_t seq_len, double* attention_factor) {
  const json& p = r.params;
  const double original = static_cast<double>(r.original_max_position_embeddings);
  const double factor =
      Has(p, "factor") ? p.at("factor").get<double>() : r.max_position_embeddings / original;
  if (Has(p, "attention_factor")) {
    *attention_factor = p.at("attention_factor").get<double>();
  } else {
    *attention_factor =
        factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(factor) / std::log(original));
  }
  // dynamic_rope_update's longrope_frequency_update: long factors past the original length.
  const bool long_context = seq_len > r.original_max_position_embeddings &&
                            !BugPlanted("rope_longrope_short_factor_only");
  const std::vector<double> ext =
      p.at(long_context ? "long_factor" : "short_factor").get<std::vector<double>>();
  const torch::Tensor ext_factors = torch::tensor(ext, torch::kDouble).to(torch::kFloat);
  return (ext_factors * PosFreqs(r)).reciprocal();
}

// _compute_llama3_parameters on top of the default frequencies.
torch::Tensor Llama3InvFreq(const Rope& r) {
  const json& p = r.params;
  const double factor = p.at("factor").get<double>();
  const double low_freq_factor = Num(p, "low_freq_factor", 1.0);
  const double high_freq_factor = Num(p, "high_freq_factor", 4.0);
  const double old_context_len = static_cast<double>(r.original_max_position_embeddings);
  const torch::Tensor inv_freq = DefaultInvFreq(r);
  const double low_freq_wavelen = old_context_len / low_freq_factor;
  const double high_freq_wavelen = old_context_len / high_freq_factor;
  const torch::Tensor wavelen = inv_freq.reciprocal() * (2 * M_PI);
  const torch::Tensor inv_freq_llama =
      torch::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  const torch::Tensor smooth = (wavelen.reciprocal() * old_context_len - low_freq_factor) /
                               (high_freq_factor - low_freq_factor);
  const torch::Tensor smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama;
  const torch::Tensor medium = torch::logical_not(wavelen < high_freq_wavelen) &
                               torch::logical_not(wavelen > low_freq_wavelen);
  return torch::where(medium, smoothed, inv_freq_llama);
}

DenseRopeTables RopeTables(const Rope& r, int64_t seq_len) {
  DenseRopeTables out;
  out.rotary_dim = r.dim;
  if (r.type == "default") {
    out.inv_freq = DefaultInvFreq(r);
  } else if (r.type == "linear") {
    const double factor =
        BugPlanted("rope_linear_unscaled") ? 1.0 : r.params.at("factor").get<double>();
    out.inv_freq = DefaultInvFreq(r) / factor;
  } else if (r.type == "dynamic") {
    // The rotary embedding starts from seq_len = max_position_embeddings (the base unchanged) and
    // dynamic_frequency_update recomputes with seq_len = max(position_ids) + 1 once it grows past.
    if (seq_len > r.max_position_embeddings && !BugPlanted("rope_dynamic_static")) {
      const double factor = r.params.at("factor").get<double>();
      const double dim = static_cast<double>(r.dim);
      const torch::Tensor scaled = torch::tensor(factor, torch::kFloat) *
                                       torch::tensor(seq_len, torch::kLong) /
                                       r.max_position_embeddings -
                                   (factor - 1);
      const torch::Tensor base = torch::pow(scaled, dim / (dim - 2)) * r.theta;
      out.inv_freq = InvFreqFromBase(base, r.dim);
    } else {
      out.inv_freq = DefaultInvFreq(r);
    }
  } else if (r.type == "yarn") {
    out.inv_freq = YarnInvFreq(r, &out.attention_scaling);
    if (BugPlanted("rope_yarn_no_attention_factor")) out.attention_scaling = 1.0;
  } else if (r.type == "longrope") {
    out.inv_freq = LongropeInvFreq(r, seq_len, &out.attention_scaling);
  } else {
    out.inv_freq = Llama3InvFreq(r);
  }
  // RotaryEmbedding.forward: freqs = inv_freq (x) positions in fp32, emb = cat(freqs, freqs).
  const torch::Tensor freqs =
      torch::outer(torch::arange(seq_len, torch::kLong).to(torch::kFloat), out.inv_freq);
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  out.cos = emb.cos() * out.attention_scaling;
  out.sin = emb.sin() * out.attention_scaling;
  return out;
}

// apply_rotary_pos_emb (Phi3's form, which equals Llama's when rotary_dim == head_dim): rotate the
// first rotary_dim dims with rotate_half(x) = cat(-x2, x1), pass the rest through.
torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
  const int64_t rotary_dim = cos.size(-1), head_dim = x.size(-1);
  const torch::Tensor x_rot = x.narrow(-1, 0, rotary_dim);
  const int64_t half = rotary_dim / 2;
  const torch::Tensor rotated =
      torch::cat({-x_rot.narrow(-1, half, rotary_dim - half), x_rot.narrow(-1, 0, half)}, -1);
  const torch::Tensor embedded = x_rot * cos + rotated * sin;
  if (rotary_dim == head_dim) return embedded;
  return torch::cat({embedded, x.narrow(-1, rotary_dim, head_dim - rotary_dim)}, -1);
}

// The additive mask of create_causal_mask / create_sliding_window_causal_mask for eager attention:
// 0 where the key is visible, finfo(fp32).min elsewhere.
torch::Tensor AdditiveMask(int64_t t, std::optional<int64_t> window) {
  const torch::Tensor q = torch::arange(t, torch::kLong).unsqueeze(1);
  const torch::Tensor kv = torch::arange(t, torch::kLong).unsqueeze(0);
  torch::Tensor visible = kv <= q;
  if (window) {
    const int64_t w = *window + (BugPlanted("sliding_window_off_by_one") ? 1 : 0);
    visible = visible & (kv > q - w);
  }
  return torch::where(visible, torch::zeros({}, torch::kFloat),
                      torch::full({}, std::numeric_limits<float>::lowest(), torch::kFloat));
}

}  // namespace

DenseRopeTables DenseRope(const nlohmann::json& config, int64_t seq_len) {
  const Dense d = Parse(config);
  return RopeTables(d.rope, seq_len);
}

HfWeights DenseWeights(const nlohmann::json& config, uint64_t seed) {
  const Dense d = Parse(config);
  const int64_t h = d.hidden, q_out = d.heads * d.head_dim, kv_out = d.kv_heads * d.head_dim;
  HfWeights w;
  // Scales as hf_reference.h's RandomLlamaWeights, so a plain Llama draws the same tensors.
  auto matrix = [&](const std::string& name, int64_t out, int64_t in, double gain) {
    w[name] = NormalDraw(seed, name, {out, in}, 0.0, gain / std::sqrt(static_cast<double>(in)));
  };
  auto bias = [&](const std::string& name, int64_t n) {
    w[name] = NormalDraw(seed, name, {n}, 0.0, 0.05);
  };
  auto norm = [&](const std::string& name) { w[name] = NormalDraw(seed, name, {h}, 1.0, 0.1); };

  w["model.embed_tokens.weight"] = NormalDraw(seed, "model.embed_tokens.weight", {d.vocab, h}, 0.0,
                                              1.0 / std::sqrt(static_cast<double>(h)));
  for (int64_t i = 0; i < d.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    norm(p + "input_layernorm.weight");
    norm(p + "post_attention_layernorm.weight");
    if (d.arch == Arch::kPhi3) {
      matrix(p + "self_attn.qkv_proj.weight", q_out + 2 * kv_out, h, 1.0);
      matrix(p + "self_attn.o_proj.weight", h, q_out, 0.5);
      matrix(p + "mlp.gate_up_proj.weight", 2 * d.inter, h, 1.0);
      matrix(p + "mlp.down_proj.weight", h, d.inter, 0.5);
      continue;
    }
    matrix(p + "self_attn.q_proj.weight", q_out, h, 1.0);
    matrix(p + "self_attn.k_proj.weight", kv_out, h, 1.0);
    matrix(p + "self_attn.v_proj.weight", kv_out, h, 1.0);
    matrix(p + "self_attn.o_proj.weight", h, q_out, 0.5);
    if (d.qkv_bias) {
      bias(p + "self_attn.q_proj.bias", q_out);
      bias(p + "self_attn.k_proj.bias", kv_out);
      bias(p + "self_attn.v_proj.bias", kv_out);
    }
    if (d.o_bias) bias(p + "self_attn.o_proj.bias", h);
    matrix(p + "mlp.gate_proj.weight", d.inter, h, 1.0);
    matrix(p + "mlp.up_proj.weight", d.inter, h, 1.0);
    matrix(p + "mlp.down_proj.weight", h, d.inter, 0.5);
    if (d.mlp_bias) {
      bias(p + "mlp.gate_proj.bias", d.inter);
      bias(p + "mlp.up_proj.bias", d.inter);
      bias(p + "mlp.down_proj.bias", h);
    }
  }
  norm("model.norm.weight");
  if (!d.tie) matrix("lm_head.weight", d.vocab, h, 1.0);
  return w;
}

torch::Tensor DenseLogits(const nlohmann::json& config, const HfWeights& weights,
                          const torch::Tensor& ids_in, std::vector<torch::Tensor>* router_logits) {
  (void)router_logits;  // dense families have no routers: left empty
  const Dense d = Parse(config);
  torch::NoGradGuard no_grad;
  if (ids_in.dim() != 2) Fail("ids must be [B, T]");
  const torch::Tensor ids = ids_in.to(torch::kLong).contiguous();
  const int64_t b = ids.size(0), t = ids.size(1);
  if (ids.numel() > 0 && (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= d.vocab)) {
    Fail("token id out of range");
  }
  const int64_t hd = d.head_dim, n_rep = d.heads / d.kv_heads;
  const double scaling = std::pow(static_cast<double>(hd), -0.5);
  auto f32 = [](const torch::Tensor& x) { return x.defined() ? x.to(torch::kFloat) : x; };

  const torch::Tensor embed = f32(Get(weights, "model.embed_tokens.weight"));
  const DenseRopeTables rope = RopeTables(d.rope, t);  // shared by every layer
  torch::Tensor hidden = embed.index_select(0, ids.reshape({-1})).reshape({b, t, d.hidden});
  for (int64_t i = 0; i < d.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    auto W = [&](const std::string& n) { return f32(Get(weights, p + n)); };
    auto B = [&](const std::string& n) { return f32(GetOr(weights, p + n)); };
    auto heads_view = [&](const torch::Tensor& x) {
      return x.view({b, t, -1, hd}).transpose(1, 2);
    };

    torch::Tensor residual = hidden;
    torch::Tensor x = LlamaRmsNorm(hidden, W("input_layernorm.weight"), d.eps);
    torch::Tensor q, k, v;
    if (d.arch == Arch::kPhi3) {
      const torch::Tensor qkv = Linear(x, W("self_attn.qkv_proj.weight"), torch::Tensor());
      const int64_t q_out = d.heads * hd, kv_out = d.kv_heads * hd;
      if (qkv.size(-1) != q_out + 2 * kv_out) Fail("qkv_proj shape does not match the config");
      q = heads_view(qkv.narrow(-1, 0, q_out));
      k = heads_view(qkv.narrow(-1, q_out, kv_out));
      v = heads_view(qkv.narrow(-1, q_out + kv_out, kv_out));
    } else {
      q = heads_view(Linear(x, W("self_attn.q_proj.weight"), B("self_attn.q_proj.bias")));
      k = heads_view(Linear(x, W("self_attn.k_proj.weight"), B("self_attn.k_proj.bias")));
      v = heads_view(Linear(x, W("self_attn.v_proj.weight"), B("self_attn.v_proj.bias")));
    }
    if (q.size(1) != d.heads || k.size(1) != d.kv_heads || v.size(1) != d.kv_heads) {
      Fail("q/k/v weight shapes do not match the config");
    }
    q = ApplyRope(q, rope.cos, rope.sin);
    k = ApplyRope(k, rope.cos, rope.sin);
    // eager_attention_forward with the layer's causal (or sliding-window causal) mask.
    torch::Tensor attn = torch::matmul(q, RepeatKv(k, n_rep).transpose(2, 3)) * scaling;
    attn =
        torch::softmax(attn + AdditiveMask(t, d.window[static_cast<size_t>(i)]), -1, torch::kFloat);
    torch::Tensor out = torch::matmul(attn, RepeatKv(v, n_rep)).transpose(1, 2).contiguous();
    out = Linear(out.reshape({b, t, d.heads * hd}), W("self_attn.o_proj.weight"),
                 B("self_attn.o_proj.bias"));
    hidden = residual + out;

    residual = hidden;
    x = LlamaRmsNorm(hidden, W("post_attention_layernorm.weight"), d.eps);
    torch::Tensor mlp;
    if (d.arch == Arch::kPhi3) {
      const std::vector<torch::Tensor> halves =
          Linear(x, W("mlp.gate_up_proj.weight"), torch::Tensor()).chunk(2, -1);
      const bool swapped = BugPlanted("phi3_gate_up_swapped");
      const torch::Tensor& gate = halves[swapped ? 1 : 0];
      const torch::Tensor& up = halves[swapped ? 0 : 1];
      mlp = Linear(up * torch::silu(gate), W("mlp.down_proj.weight"), torch::Tensor());
    } else {
      const torch::Tensor gate = Linear(x, W("mlp.gate_proj.weight"), B("mlp.gate_proj.bias"));
      const torch::Tensor up = Linear(x, W("mlp.up_proj.weight"), B("mlp.up_proj.bias"));
      mlp = Linear(torch::silu(gate) * up, W("mlp.down_proj.weight"), B("mlp.down_proj.bias"));
    }
    hidden = residual + mlp;
  }
  hidden = LlamaRmsNorm(hidden, f32(Get(weights, "model.norm.weight")), d.eps);
  const torch::Tensor head = d.tie ? embed : f32(Get(weights, "lm_head.weight"));
  return torch::linear(hidden, head).to(torch::kFloat);
}

}  // namespace strata::testing::families
