// hf_reference.cc: see hf_reference.h. Each piece names the transformers code it follows.
#include "tests/testing/hf_reference.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tests/testing/hf_reference_families.h"

namespace strata::testing {
namespace {

using Weights = std::map<std::string, torch::Tensor>;

bool IsLlama(const LlamaSpec& s) { return s.architecture == "LlamaForCausalLM"; }
bool IsMistral(const LlamaSpec& s) { return s.architecture == "MistralForCausalLM"; }
bool IsQwen2(const LlamaSpec& s) { return s.architecture == "Qwen2ForCausalLM"; }

constexpr int64_t kMistralSlidingWindow = 4096;

// ---- Deterministic normal draws (splitmix64 + Box-Muller), independent of libtorch's RNG. ----

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// A tensor of `shape` with entries mean + std * N(0, 1), from the stream for (seed, name).
torch::Tensor Normal(uint64_t seed, const std::string& name, std::vector<int64_t> shape,
                     double mean, double std) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t state = seed ^ Fnv1a(name);
  SplitMix64(state);
  for (int64_t i = 0; i < n; i += 2) {
    // u1 in (0, 1], u2 in [0, 1): 53-bit uniforms.
    double u1 = (static_cast<double>(SplitMix64(state) >> 11) + 1.0) * 0x1.0p-53;
    double u2 = static_cast<double>(SplitMix64(state) >> 11) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(u1));
    v[static_cast<size_t>(i)] = static_cast<float>(mean + std * r * std::cos(2.0 * M_PI * u2));
    if (i + 1 < n) {
      v[static_cast<size_t>(i + 1)] =
          static_cast<float>(mean + std * r * std::sin(2.0 * M_PI * u2));
    }
  }
  return torch::from_blob(v.data(), shape, torch::kFloat).clone();
}

const torch::Tensor& Get(const Weights& w, const std::string& name) {
  auto it = w.find(name);
  if (it == w.end()) throw std::invalid_argument("hf_reference: missing weight " + name);
  return it->second;
}

torch::Tensor GetOr(const Weights& w, const std::string& name) {
  auto it = w.find(name);
  return it == w.end() ? torch::Tensor() : it->second;
}

// LlamaRMSNorm.forward: weight * (x * rsqrt(mean(x^2, -1) + eps)), in fp32.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  torch::Tensor h = x.to(torch::kFloat);
  torch::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(variance + eps);
  return weight * h;
}

// nn.Linear: x @ W^T + b (b may be undefined).
torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  return b.defined() ? torch::linear(x, w, b) : torch::linear(x, w);
}

// repeat_kv: [B, kv, T, D] -> [B, kv * n_rep, T, D], kv head j at heads j*n_rep .. +n_rep-1.
torch::Tensor RepeatKv(const torch::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t b = x.size(0), kv = x.size(1), t = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, kv, n_rep, t, d}).reshape({b, kv * n_rep, t, d});
}

torch::ScalarType StorageType(const std::string& dtype) {
  if (dtype == "F32") return torch::kFloat;
  if (dtype == "BF16") return torch::kBFloat16;
  if (dtype == "F16") return torch::kHalf;
  throw std::invalid_argument("hf_reference: dtype must be F32, BF16 or F16, got " + dtype);
}

std::string TorchDtypeName(const std::string& dtype) {
  if (dtype == "F32") return "float32";
  if (dtype == "BF16") return "bfloat16";
  if (dtype == "F16") return "float16";
  throw std::invalid_argument("hf_reference: dtype must be F32, BF16 or F16, got " + dtype);
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw std::runtime_error("hf_reference: cannot write " + path);
}

// One safetensors file holding `names` (in that order) from `weights`, stored as `type`.
// Returns the data bytes written.
uint64_t WriteSafetensors(const std::string& path, const std::vector<std::string>& names,
                          const Weights& weights, const std::string& dtype) {
  const torch::ScalarType type = StorageType(dtype);
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::string data;
  for (const std::string& name : names) {
    torch::Tensor t = weights.at(name).to(torch::kFloat).to(type).contiguous();
    const uint64_t begin = data.size();
    data.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
    nlohmann::json shape = nlohmann::json::array();
    for (int64_t d : t.sizes()) shape.push_back(d);
    header[name] = {{"dtype", dtype},
                    {"shape", shape},
                    {"data_offsets", {begin, static_cast<uint64_t>(data.size())}}};
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');  // as safetensors pads its header
  std::string bytes(8, '\0');
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  bytes += h;
  bytes += data;
  WriteFile(path, bytes);
  return data.size();
}

}  // namespace

namespace families {

torch::Tensor NormalDraw(uint64_t seed, const std::string& name, std::vector<int64_t> shape,
                         double mean, double std) {
  return Normal(seed, name, std::move(shape), mean, std);
}
const torch::Tensor& Get(const HfWeights& w, const std::string& name) {
  return testing::Get(w, name);
}
torch::Tensor GetOr(const HfWeights& w, const std::string& name) { return testing::GetOr(w, name); }
torch::Tensor LlamaRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  return RmsNorm(x, weight, eps);
}
torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  return testing::Linear(x, w, b);
}
torch::Tensor RepeatKv(const torch::Tensor& x, int64_t n_rep) {
  return testing::RepeatKv(x, n_rep);
}

}  // namespace families

int64_t HeadDim(const LlamaSpec& spec) {
  if (spec.head_dim != 0) return spec.head_dim;
  if (spec.num_attention_heads <= 0) throw std::invalid_argument("hf_reference: heads <= 0");
  return spec.hidden_size / spec.num_attention_heads;
}

std::string ModelType(const LlamaSpec& spec) {
  if (IsLlama(spec)) return "llama";
  if (IsMistral(spec)) return "mistral";
  if (IsQwen2(spec)) return "qwen2";
  throw std::invalid_argument("hf_reference: unknown architecture " + spec.architecture);
}

void ValidateSpec(const LlamaSpec& spec) {
  ModelType(spec);
  auto fail = [](const std::string& why) {
    throw std::invalid_argument("hf_reference: invalid spec: " + why);
  };
  if (spec.vocab_size <= 0 || spec.hidden_size <= 0 || spec.intermediate_size <= 0 ||
      spec.num_hidden_layers < 0 || spec.num_attention_heads <= 0 ||
      spec.num_key_value_heads <= 0 || spec.head_dim < 0) {
    fail("sizes must be positive");
  }
  if (spec.head_dim == 0 && spec.hidden_size % spec.num_attention_heads != 0) {
    fail("hidden_size not divisible by num_attention_heads (and head_dim absent)");
  }
  if (spec.num_attention_heads % spec.num_key_value_heads != 0) {
    fail("num_attention_heads not a multiple of num_key_value_heads");
  }
  if (HeadDim(spec) % 2 != 0) fail("head_dim must be even for rotate_half");
  if (!IsLlama(spec) && (spec.attention_bias || spec.mlp_bias)) {
    fail("attention_bias / mlp_bias exist only for LlamaForCausalLM");
  }
  if (IsMistral(spec) && spec.rope_scaling) fail("MistralConfig has no rope_scaling");
  if (spec.rope_scaling) {
    const Llama3Scaling& r = *spec.rope_scaling;
    if (!(r.high_freq_factor > r.low_freq_factor) || r.low_freq_factor <= 0 || r.factor <= 0 ||
        r.original_max_position_embeddings <= 0) {
      fail("llama3 rope_scaling needs high_freq_factor > low_freq_factor > 0, factor > 0");
    }
  }
}

std::map<std::string, torch::Tensor> RandomLlamaWeights(const LlamaSpec& spec, uint64_t seed) {
  ValidateSpec(spec);
  const int64_t h = spec.hidden_size, v = spec.vocab_size, inter = spec.intermediate_size;
  const int64_t d = HeadDim(spec);
  const int64_t q_out = spec.num_attention_heads * d, kv_out = spec.num_key_value_heads * d;
  const bool qkv_bias = IsQwen2(spec) || (IsLlama(spec) && spec.attention_bias);
  const bool o_bias = IsLlama(spec) && spec.attention_bias;
  const bool mlp_bias = IsLlama(spec) && spec.mlp_bias;

  Weights w;
  auto matrix = [&](const std::string& name, int64_t out, int64_t in, double gain) {
    w[name] = Normal(seed, name, {out, in}, 0.0, gain / std::sqrt(static_cast<double>(in)));
  };
  auto bias = [&](const std::string& name, int64_t n) {
    w[name] = Normal(seed, name, {n}, 0.0, 0.05);
  };
  auto norm = [&](const std::string& name) { w[name] = Normal(seed, name, {h}, 1.0, 0.1); };

  // nn.Embedding(vocab, hidden): N(0, 1/sqrt(hidden)) keeps tied logits O(1) too.
  w["model.embed_tokens.weight"] =
      Normal(seed, "model.embed_tokens.weight", {v, h}, 0.0, 1.0 / std::sqrt(double(h)));
  for (int64_t i = 0; i < spec.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    norm(p + "input_layernorm.weight");
    norm(p + "post_attention_layernorm.weight");
    matrix(p + "self_attn.q_proj.weight", q_out, h, 1.0);
    matrix(p + "self_attn.k_proj.weight", kv_out, h, 1.0);
    matrix(p + "self_attn.v_proj.weight", kv_out, h, 1.0);
    matrix(p + "self_attn.o_proj.weight", h, q_out, 0.5);
    if (qkv_bias) {
      bias(p + "self_attn.q_proj.bias", q_out);
      bias(p + "self_attn.k_proj.bias", kv_out);
      bias(p + "self_attn.v_proj.bias", kv_out);
    }
    if (o_bias) bias(p + "self_attn.o_proj.bias", h);
    matrix(p + "mlp.gate_proj.weight", inter, h, 1.0);
    matrix(p + "mlp.up_proj.weight", inter, h, 1.0);
    matrix(p + "mlp.down_proj.weight", h, inter, 0.5);
    if (mlp_bias) {
      bias(p + "mlp.gate_proj.bias", inter);
      bias(p + "mlp.up_proj.bias", inter);
      bias(p + "mlp.down_proj.bias", h);
    }
  }
  norm("model.norm.weight");
  if (!spec.tie_word_embeddings) matrix("lm_head.weight", v, h, 1.0);
  return w;
}

nlohmann::json LlamaConfigJson(const LlamaSpec& spec, const std::string& torch_dtype) {
  ValidateSpec(spec);
  if (torch_dtype != "float32" && torch_dtype != "bfloat16" && torch_dtype != "float16") {
    throw std::invalid_argument("hf_reference: torch_dtype must be float32, bfloat16 or float16");
  }
  nlohmann::json c = nlohmann::json::object();
  c["architectures"] = {spec.architecture};
  c["model_type"] = ModelType(spec);
  c["vocab_size"] = spec.vocab_size;
  c["hidden_size"] = spec.hidden_size;
  c["intermediate_size"] = spec.intermediate_size;
  c["num_hidden_layers"] = spec.num_hidden_layers;
  c["num_attention_heads"] = spec.num_attention_heads;
  c["num_key_value_heads"] = spec.num_key_value_heads;
  if (spec.head_dim != 0) c["head_dim"] = spec.head_dim;
  c["hidden_act"] = "silu";
  c["max_position_embeddings"] = spec.max_position_embeddings;
  c["initializer_range"] = 0.02;
  c["rms_norm_eps"] = spec.rms_norm_eps;
  c["rope_theta"] = spec.rope_theta;
  c["attention_dropout"] = 0.0;
  c["use_cache"] = true;
  c["tie_word_embeddings"] = spec.tie_word_embeddings;
  c["bos_token_id"] = spec.bos_token_id;
  c["eos_token_id"] = spec.eos_token_id;
  c["torch_dtype"] = torch_dtype;
  c["transformers_version"] = "4.45.0";
  nlohmann::json rope = nullptr;
  if (spec.rope_scaling) {
    const Llama3Scaling& r = *spec.rope_scaling;
    rope = {{"rope_type", "llama3"},
            {"factor", r.factor},
            {"low_freq_factor", r.low_freq_factor},
            {"high_freq_factor", r.high_freq_factor},
            {"original_max_position_embeddings", r.original_max_position_embeddings}};
  }
  if (IsLlama(spec)) {
    c["attention_bias"] = spec.attention_bias;
    c["mlp_bias"] = spec.mlp_bias;
    c["pretraining_tp"] = 1;
    c["rope_scaling"] = rope;
  } else if (IsMistral(spec)) {
    c["sliding_window"] = kMistralSlidingWindow;  // Mistral-7B-v0.1; irrelevant for T <= 4096
  } else {                                        // Qwen2
    c["rope_scaling"] = rope;
    c["use_sliding_window"] = false;
    c["sliding_window"] = spec.max_position_embeddings;
    c["max_window_layers"] = spec.num_hidden_layers;
  }
  return c;
}

void WriteHfCheckpoint(const std::string& dir, const LlamaSpec& spec,
                       const std::map<std::string, torch::Tensor>& weights,
                       const std::string& dtype, int shards) {
  WriteHfCheckpointWithConfig(dir, LlamaConfigJson(spec, TorchDtypeName(dtype)), weights, dtype,
                              shards);
}

void WriteHfCheckpointWithConfig(const std::string& dir, nlohmann::json config,
                                 const std::map<std::string, torch::Tensor>& weights,
                                 const std::string& dtype, int shards) {
  config["torch_dtype"] = TorchDtypeName(dtype);
  std::vector<std::string> names;
  for (const auto& [name, t] : weights) names.push_back(name);
  const int n = static_cast<int>(names.size());
  if (shards < 1 || (shards > 1 && shards > n)) {
    throw std::invalid_argument("hf_reference: shards must be in [1, number of tensors]");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error("hf_reference: cannot create " + dir + ": " + ec.message());
  WriteFile(dir + "/config.json", config.dump(2) + "\n");

  if (shards == 1) {
    WriteSafetensors(dir + "/model.safetensors", names, weights, dtype);
    return;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total = 0;
  for (int s = 0; s < shards; ++s) {
    const int begin = static_cast<int>(int64_t{s} * n / shards);
    const int end = static_cast<int>(int64_t{s + 1} * n / shards);
    char file[64];
    std::snprintf(file, sizeof(file), "model-%05d-of-%05d.safetensors", s + 1, shards);
    std::vector<std::string> part(names.begin() + begin, names.begin() + end);
    total += WriteSafetensors(dir + "/" + file, part, weights, dtype);
    for (const std::string& name : part) weight_map[name] = file;
  }
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  WriteFile(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
}

std::map<std::string, torch::Tensor> RoundTripWeights(
    const std::map<std::string, torch::Tensor>& weights, const std::string& dtype) {
  const torch::ScalarType type = StorageType(dtype);
  Weights out;
  for (const auto& [name, t] : weights) {
    out[name] = t.to(torch::kFloat).to(type).to(torch::kFloat).contiguous().clone();
  }
  return out;
}

// _compute_default_rope_parameters, then _compute_llama3_parameters when rope_scaling is set;
// all in fp32 tensors as transformers computes them.
torch::Tensor RopeInvFreq(const LlamaSpec& spec) {
  const int64_t dim = HeadDim(spec);
  torch::Tensor exponent = torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / dim;
  // Python's `scalar / tensor` is tensor.reciprocal() * scalar (torch/_tensor.py __rdiv__).
  torch::Tensor inv_freq = torch::pow(spec.rope_theta, exponent).reciprocal();
  if (!spec.rope_scaling) return inv_freq;

  const Llama3Scaling& r = *spec.rope_scaling;
  const double old_context_len = static_cast<double>(r.original_max_position_embeddings);
  const double low_freq_wavelen = old_context_len / r.low_freq_factor;
  const double high_freq_wavelen = old_context_len / r.high_freq_factor;
  torch::Tensor wavelen = inv_freq.reciprocal() * (2 * M_PI);
  // wavelen < high_freq_wavelen: unchanged; wavelen > low_freq_wavelen: divided by factor.
  torch::Tensor inv_freq_llama =
      torch::where(wavelen > low_freq_wavelen, inv_freq / r.factor, inv_freq);
  // Otherwise interpolated with a smooth factor.
  torch::Tensor smooth_factor = (wavelen.reciprocal() * old_context_len - r.low_freq_factor) /
                                (r.high_freq_factor - r.low_freq_factor);
  torch::Tensor smoothed_inv_freq =
      (1 - smooth_factor) * inv_freq_llama / r.factor + smooth_factor * inv_freq_llama;
  torch::Tensor is_medium_freq = torch::logical_not(wavelen < high_freq_wavelen) &
                                 torch::logical_not(wavelen > low_freq_wavelen);
  return torch::where(is_medium_freq, smoothed_inv_freq, inv_freq_llama);
}

// LlamaRotaryEmbedding.forward: freqs = inv_freq (x) positions in fp32, emb = cat(freqs, freqs).
std::pair<torch::Tensor, torch::Tensor> RopeCosSin(const LlamaSpec& spec,
                                                   const torch::Tensor& positions) {
  torch::Tensor freqs = torch::outer(positions.to(torch::kFloat), RopeInvFreq(spec));
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};  // attention_scaling is 1.0 for default and llama3
}

// apply_rotary_pos_emb with rotate_half(x) = cat(-x2, x1).
torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  torch::Tensor x1 = x.narrow(-1, 0, half);
  torch::Tensor x2 = x.narrow(-1, half, x.size(-1) - half);
  torch::Tensor rotated = torch::cat({-x2, x1}, -1);
  return x * cos + rotated * sin;
}

torch::Tensor ReferenceLogits(const LlamaSpec& spec,
                              const std::map<std::string, torch::Tensor>& weights,
                              const torch::Tensor& ids_in) {
  ValidateSpec(spec);
  torch::NoGradGuard no_grad;
  if (ids_in.dim() != 2) throw std::invalid_argument("hf_reference: ids must be [B, T]");
  torch::Tensor ids = ids_in.to(torch::kLong).contiguous();
  const int64_t b = ids.size(0), t = ids.size(1);
  if (IsMistral(spec) && t > kMistralSlidingWindow) {
    throw std::invalid_argument("hf_reference: Mistral reference needs T <= sliding_window");
  }
  if (ids.numel() > 0 &&
      (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= spec.vocab_size)) {
    throw std::invalid_argument("hf_reference: token id out of range");
  }
  const int64_t heads = spec.num_attention_heads, kv_heads = spec.num_key_value_heads;
  const int64_t d = HeadDim(spec), n_rep = heads / kv_heads;
  const double scaling = std::pow(static_cast<double>(d), -0.5);
  auto f32 = [](const torch::Tensor& x) { return x.defined() ? x.to(torch::kFloat) : x; };

  const torch::Tensor embed = f32(Get(weights, "model.embed_tokens.weight"));
  // LlamaModel.forward: position_ids = arange(T); cos/sin shared by every layer.
  auto [cos, sin] = RopeCosSin(spec, torch::arange(t, torch::kLong));
  // _prepare_4d_causal_attention_mask: finfo(fp32).min above the diagonal, 0 elsewhere.
  torch::Tensor causal_mask =
      torch::full({t, t}, std::numeric_limits<float>::lowest(), torch::kFloat).triu(1);

  torch::Tensor hidden = embed.index_select(0, ids.reshape({-1})).reshape({b, t, spec.hidden_size});
  for (int64_t i = 0; i < spec.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    auto W = [&](const std::string& n) { return f32(Get(weights, p + n)); };
    auto B = [&](const std::string& n) { return f32(GetOr(weights, p + n)); };

    // LlamaDecoderLayer: residual + self_attn(input_layernorm(x)).
    torch::Tensor residual = hidden;
    torch::Tensor x = RmsNorm(hidden, W("input_layernorm.weight"), spec.rms_norm_eps);
    torch::Tensor q = Linear(x, W("self_attn.q_proj.weight"), B("self_attn.q_proj.bias"))
                          .view({b, t, -1, d})
                          .transpose(1, 2);
    torch::Tensor k = Linear(x, W("self_attn.k_proj.weight"), B("self_attn.k_proj.bias"))
                          .view({b, t, -1, d})
                          .transpose(1, 2);
    torch::Tensor v = Linear(x, W("self_attn.v_proj.weight"), B("self_attn.v_proj.bias"))
                          .view({b, t, -1, d})
                          .transpose(1, 2);
    if (q.size(1) != heads || k.size(1) != kv_heads || v.size(1) != kv_heads) {
      throw std::invalid_argument("hf_reference: q/k/v weight shapes do not match the spec");
    }
    q = ApplyRope(q, cos, sin);
    k = ApplyRope(k, cos, sin);
    // eager_attention_forward.
    torch::Tensor key_states = RepeatKv(k, n_rep);
    torch::Tensor value_states = RepeatKv(v, n_rep);
    torch::Tensor attn = torch::matmul(q, key_states.transpose(2, 3)) * scaling;
    attn = attn + causal_mask;
    attn = torch::softmax(attn, -1, torch::kFloat);
    torch::Tensor out = torch::matmul(attn, value_states).transpose(1, 2).contiguous();
    out = out.reshape({b, t, heads * d});
    out = Linear(out, W("self_attn.o_proj.weight"), B("self_attn.o_proj.bias"));
    hidden = residual + out;

    // residual + mlp(post_attention_layernorm(x)); mlp = down(silu(gate(x)) * up(x)).
    residual = hidden;
    x = RmsNorm(hidden, W("post_attention_layernorm.weight"), spec.rms_norm_eps);
    torch::Tensor gate = Linear(x, W("mlp.gate_proj.weight"), B("mlp.gate_proj.bias"));
    torch::Tensor up = Linear(x, W("mlp.up_proj.weight"), B("mlp.up_proj.bias"));
    torch::Tensor mlp =
        Linear(torch::silu(gate) * up, W("mlp.down_proj.weight"), B("mlp.down_proj.bias"));
    hidden = residual + mlp;
  }
  hidden = RmsNorm(hidden, f32(Get(weights, "model.norm.weight")), spec.rms_norm_eps);
  const torch::Tensor head = spec.tie_word_embeddings ? embed : f32(Get(weights, "lm_head.weight"));
  return torch::linear(hidden, head).to(torch::kFloat);
}

double ReferenceLoss(const LlamaSpec& spec, const std::map<std::string, torch::Tensor>& weights,
                     const torch::Tensor& windows) {
  if (windows.dim() != 2 || windows.size(1) < 2) {
    throw std::invalid_argument("hf_reference: windows must be [B, T+1] with T >= 1");
  }
  torch::NoGradGuard no_grad;
  torch::Tensor w = windows.to(torch::kLong);
  const int64_t t = w.size(1) - 1;
  torch::Tensor inputs = w.narrow(1, 0, t);
  torch::Tensor targets = w.narrow(1, 1, t);
  torch::Tensor logits = ReferenceLogits(spec, weights, inputs).to(torch::kDouble);
  torch::Tensor logp = torch::log_softmax(logits, -1);
  torch::Tensor nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
  return nll.mean().item<double>();
}

}  // namespace strata::testing
