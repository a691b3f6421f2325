// hf_reference_decoder.cc: see hf_reference_decoder.h.
#include "tests/testing/hf_reference_decoder.h"

#include <torch/torch.h>

#include <limits>
#include <stdexcept>
#include <string>

#include "tests/testing/hf_reference.h"
#include "tests/testing/hf_reference_families.h"

namespace strata::testing::families {
namespace {

[[noreturn]] void BadKey(const char* key, const std::string& why) {
  throw std::invalid_argument(std::string("hf_config_reference: config key \"") + key + "\" " +
                              why);
}

bool Present(const nlohmann::json& config, const char* key) {
  return config.contains(key) && !config[key].is_null();
}

}  // namespace

int64_t IntKey(const nlohmann::json& config, const char* key, int64_t fallback) {
  if (!Present(config, key)) return fallback;
  const nlohmann::json& v = config[key];
  if (!v.is_number_integer()) BadKey(key, "must be an integer");
  return v.get<int64_t>();
}

double DoubleKey(const nlohmann::json& config, const char* key, double fallback) {
  if (!Present(config, key)) return fallback;
  const nlohmann::json& v = config[key];
  if (!v.is_number()) BadKey(key, "must be a number");
  return v.get<double>();
}

bool BoolKey(const nlohmann::json& config, const char* key, bool fallback) {
  if (!Present(config, key)) return fallback;
  const nlohmann::json& v = config[key];
  if (!v.is_boolean()) BadKey(key, "must be true or false");
  return v.get<bool>();
}

std::string StringKey(const nlohmann::json& config, const char* key, const std::string& fallback) {
  if (!Present(config, key)) return fallback;
  const nlohmann::json& v = config[key];
  if (!v.is_string()) BadKey(key, "must be a string");
  return v.get<std::string>();
}

std::optional<int64_t> OptionalIntKey(const nlohmann::json& config, const char* key,
                                      std::optional<int64_t> fallback) {
  if (!config.contains(key)) return fallback;
  if (config[key].is_null()) return std::nullopt;
  return IntKey(config, key, 0);
}

std::optional<double> OptionalDoubleKey(const nlohmann::json& config, const char* key,
                                        std::optional<double> fallback) {
  if (!config.contains(key)) return fallback;
  if (config[key].is_null()) return std::nullopt;
  return DoubleKey(config, key, 0.0);
}

double DefaultRopeTheta(const nlohmann::json& config, double fallback) {
  if (Present(config, "rope_scaling")) {
    BadKey("rope_scaling", "is set: this family's reference covers the default RoPE only");
  }
  double theta = DoubleKey(config, "rope_theta", fallback);
  if (Present(config, "rope_parameters")) {
    const nlohmann::json& p = config["rope_parameters"];
    if (!p.is_object()) BadKey("rope_parameters", "must be an object");
    const std::string type = StringKey(p, "rope_type", StringKey(p, "type", "default"));
    if (type != "default") {
      BadKey("rope_parameters", "has rope_type " + type + ": only \"default\" is covered here");
    }
    theta = DoubleKey(p, "rope_theta", theta);
  }
  if (!(theta > 0)) BadKey("rope_theta", "must be > 0");
  return theta;
}

std::optional<bool> ListedLayerSlides(const nlohmann::json& config, int64_t layer,
                                      int64_t num_layers) {
  if (!Present(config, "layer_types")) return std::nullopt;
  const nlohmann::json& types = config["layer_types"];
  if (!types.is_array() || static_cast<int64_t>(types.size()) != num_layers) {
    BadKey("layer_types", "must list one type per layer");
  }
  const nlohmann::json& type = types[static_cast<size_t>(layer)];
  if (type == "sliding_attention") return true;
  if (type == "full_attention") return false;
  BadKey("layer_types", "entries must be \"sliding_attention\" or \"full_attention\"");
}

torch::Tensor CheckedIds(const torch::Tensor& ids_in, int64_t vocab_size) {
  if (ids_in.dim() != 2) throw std::invalid_argument("hf_config_reference: ids must be [B, T]");
  torch::Tensor ids = ids_in.to(torch::kLong).contiguous();
  if (ids.numel() > 0 &&
      (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= vocab_size)) {
    throw std::invalid_argument("hf_config_reference: token id out of range");
  }
  return ids;
}

torch::Tensor CausalMask(int64_t t, std::optional<int64_t> window) {
  const torch::Tensor q = torch::arange(t, torch::kLong).unsqueeze(1);
  const torch::Tensor kv = torch::arange(t, torch::kLong).unsqueeze(0);
  torch::Tensor visible = kv.le(q);
  if (window) {
    // The planted bug is the dense families' one, so that it reaches every sliding layer.
    const int64_t w = *window + (BugPlanted("sliding_window_off_by_one") ? 1 : 0);
    visible = visible.logical_and(kv.gt(q - w));
  }
  return torch::where(visible, torch::zeros({}, torch::kFloat),
                      torch::full({}, std::numeric_limits<float>::lowest(), torch::kFloat));
}

std::pair<torch::Tensor, torch::Tensor> DefaultRope(int64_t head_dim, double theta, int64_t t) {
  // hf_reference.h's RoPE is the default one when rope_scaling is unset.
  LlamaSpec spec;
  spec.head_dim = head_dim;
  spec.rope_theta = theta;
  return RopeCosSin(spec, torch::arange(t, torch::kLong));
}

torch::Tensor SelfAttention(const torch::Tensor& x, const HfWeights& weights,
                            const std::string& prefix, const AttentionShape& shape,
                            const std::pair<torch::Tensor, torch::Tensor>& cos_sin,
                            const torch::Tensor& mask, double scaling,
                            std::optional<double> softcap) {
  const int64_t b = x.size(0), t = x.size(1), d = shape.head_dim;
  auto bias = [&](bool present, const char* name) {
    return present ? Get(weights, prefix + name) : torch::Tensor();
  };
  auto heads = [&](const char* proj, const char* bias_name, int64_t n) {
    torch::Tensor y = Linear(x, Get(weights, prefix + proj), bias(shape.qkv_bias, bias_name));
    if (y.size(-1) != n * d) {
      throw std::invalid_argument("hf_config_reference: " + prefix + proj +
                                  " does not match the config's heads x head_dim");
    }
    return y.view({b, t, n, d}).transpose(1, 2);
  };
  torch::Tensor q = heads("q_proj.weight", "q_proj.bias", shape.heads);
  torch::Tensor k = heads("k_proj.weight", "k_proj.bias", shape.kv_heads);
  torch::Tensor v = heads("v_proj.weight", "v_proj.bias", shape.kv_heads);
  q = ApplyRope(q, cos_sin.first, cos_sin.second);
  k = ApplyRope(k, cos_sin.first, cos_sin.second);
  const int64_t n_rep = shape.heads / shape.kv_heads;
  torch::Tensor scores = torch::matmul(q, RepeatKv(k, n_rep).transpose(2, 3)) * scaling;
  if (softcap) scores = torch::tanh(scores / *softcap) * *softcap;
  scores = scores + mask;
  torch::Tensor probs = torch::softmax(scores, -1, torch::kFloat);
  torch::Tensor out = torch::matmul(probs, RepeatKv(v, n_rep)).transpose(1, 2).contiguous();
  out = out.reshape({b, t, shape.heads * d});
  return Linear(out, Get(weights, prefix + "o_proj.weight"), bias(shape.o_bias, "o_proj.bias"));
}

}  // namespace strata::testing::families
