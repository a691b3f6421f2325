#include "runtime/plan/llama_shape.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <vector>

namespace strata::runtime {
namespace {

using json = nlohmann::json;

struct Arch {
  const char* architecture;
  const char* model_type;
};
constexpr std::array<Arch, 3> kArchitectures = {{{"LlamaForCausalLM", "llama"},
                                                 {"MistralForCausalLM", "mistral"},
                                                 {"Qwen2ForCausalLM", "qwen2"}}};

// transformers' defaults for keys a config.json may leave out (configuration_<type>.py).
LlamaShape Defaults(const std::string& model_type) {
  LlamaShape s;
  s.model_type = model_type;
  if (model_type == "mistral") {
    s.intermediate_size = 14336;
    s.num_key_value_heads = 8;
    s.max_position_embeddings = 4096 * 32;
    s.sliding_window = 4096;
  } else if (model_type == "qwen2") {
    s.vocab_size = 151936;
    s.intermediate_size = 22016;
    s.max_position_embeddings = 32768;
    s.qkv_bias = true;
  }
  return s;
}

LlamaShape Preset(const char* name, const char* arch, const char* type, int64_t vocab,
                  int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv,
                  double eps, double theta, bool tie, int64_t max_pos, const char* dtype) {
  LlamaShape s = Defaults(type);
  s.name = name;
  s.architecture = arch;
  s.vocab_size = vocab;
  s.hidden_size = hidden;
  s.intermediate_size = inter;
  s.num_hidden_layers = layers;
  s.num_attention_heads = heads;
  s.num_key_value_heads = kv;
  s.head_dim = hidden / heads;
  s.rms_norm_eps = eps;
  s.rope_theta = theta;
  s.tie_word_embeddings = tie;
  s.max_position_embeddings = max_pos;
  s.torch_dtype = dtype;
  return s;
}

std::vector<LlamaShape> MakePresets() {
  const char* kL = "LlamaForCausalLM";
  std::vector<LlamaShape> p;
  // A few thousand parameters per layer: tests and quick runs.
  p.push_back(Preset("llama-tiny", kL, "llama", 256, 64, 160, 2, 4, 2, 1e-5, 10000, false, 2048,
                     "float32"));
  p.push_back(Preset("llama-3.2-1b", kL, "llama", 128256, 2048, 8192, 16, 32, 8, 1e-5, 500000, true,
                     131072, "bfloat16"));
  p.back().rope_scaling = Llama3RopeScaling{32.0, 1.0, 4.0, 8192};
  p.push_back(Preset("llama-3.2-3b", kL, "llama", 128256, 3072, 8192, 28, 24, 8, 1e-5, 500000, true,
                     131072, "bfloat16"));
  p.back().rope_scaling = Llama3RopeScaling{32.0, 1.0, 4.0, 8192};
  p.push_back(Preset("llama-3.1-8b", kL, "llama", 128256, 4096, 14336, 32, 32, 8, 1e-5, 500000,
                     false, 131072, "bfloat16"));
  p.back().rope_scaling = Llama3RopeScaling{8.0, 1.0, 4.0, 8192};
  p.push_back(Preset("llama-2-7b", kL, "llama", 32000, 4096, 11008, 32, 32, 32, 1e-5, 10000, false,
                     4096, "float16"));
  p.push_back(Preset("llama-2-13b", kL, "llama", 32000, 5120, 13824, 40, 40, 40, 1e-5, 10000, false,
                     4096, "float16"));
  p.push_back(Preset("mistral-7b", "MistralForCausalLM", "mistral", 32000, 4096, 14336, 32, 32, 8,
                     1e-5, 10000, false, 32768, "bfloat16"));
  p.push_back(Preset("qwen2.5-7b", "Qwen2ForCausalLM", "qwen2", 152064, 3584, 18944, 28, 28, 4,
                     1e-6, 1000000, false, 131072, "bfloat16"));
  p.push_back(Preset("llama-3.1-70b", kL, "llama", 128256, 8192, 28672, 80, 64, 8, 1e-5, 500000,
                     false, 131072, "bfloat16"));
  p.back().rope_scaling = Llama3RopeScaling{8.0, 1.0, 4.0, 8192};
  return p;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Reads optional key `key` of `j` into `out` when present and not null; a wrong type is a problem.
template <typename T>
void Read(const json& j, const char* key, T* out, const std::string& source,
          std::vector<std::string>* problems) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  try {
    if constexpr (std::is_same_v<T, int64_t>) {
      if (!it->is_number_integer()) throw json::type_error::create(302, "not an integer", nullptr);
    } else if constexpr (std::is_same_v<T, double>) {
      if (!it->is_number()) throw json::type_error::create(302, "not a number", nullptr);
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) throw json::type_error::create(302, "not a boolean", nullptr);
    }
    *out = it->get<T>();
  } catch (const json::exception&) {
    problems->push_back(std::string(key) + " is " + it->dump() + ", expected " +
                        (std::is_same_v<T, bool>      ? "true or false"
                         : std::is_same_v<T, int64_t> ? "an integer"
                         : std::is_same_v<T, double>  ? "a number"
                                                      : "a string"));
  }
}

}  // namespace

Result<LlamaShape> ParseHfConfig(const json& config, const std::string& source) {
  if (!config.is_object()) return InvalidArgumentError(source + ": not a JSON object");
  std::string arch;
  if (auto it = config.find("architectures");
      it != config.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) {
    arch = (*it)[0].get<std::string>();
  }
  std::string type = config.value("model_type", std::string());
  const Arch* found = nullptr;
  for (const Arch& a : kArchitectures) {
    if (arch == a.architecture || (arch.empty() && type == a.model_type)) found = &a;
  }
  if (found == nullptr) {
    std::string known;
    for (const Arch& a : kArchitectures)
      known += std::string(known.empty() ? "" : ", ") + a.architecture;
    return InvalidArgumentError(source + ": architectures " +
                                (arch.empty() ? std::string("(absent)") : "[\"" + arch + "\"]") +
                                (type.empty() ? "" : " (model_type \"" + type + "\")") +
                                " is not one strata can train; supported: " + known);
  }
  LlamaShape s = Defaults(found->model_type);
  s.architecture = found->architecture;
  s.name = source;
  std::vector<std::string> problems;
  Read(config, "vocab_size", &s.vocab_size, source, &problems);
  Read(config, "hidden_size", &s.hidden_size, source, &problems);
  Read(config, "intermediate_size", &s.intermediate_size, source, &problems);
  Read(config, "num_hidden_layers", &s.num_hidden_layers, source, &problems);
  Read(config, "num_attention_heads", &s.num_attention_heads, source, &problems);
  s.num_key_value_heads = s.num_attention_heads;  // transformers: None -> num_attention_heads
  if (s.model_type == "mistral") s.num_key_value_heads = 8;
  Read(config, "num_key_value_heads", &s.num_key_value_heads, source, &problems);
  Read(config, "rms_norm_eps", &s.rms_norm_eps, source, &problems);
  Read(config, "rope_theta", &s.rope_theta, source, &problems);
  Read(config, "tie_word_embeddings", &s.tie_word_embeddings, source, &problems);
  Read(config, "max_position_embeddings", &s.max_position_embeddings, source, &problems);
  Read(config, "initializer_range", &s.initializer_range, source, &problems);
  if (s.model_type == "llama") {
    Read(config, "attention_bias", &s.attention_bias, source, &problems);
    Read(config, "mlp_bias", &s.mlp_bias, source, &problems);
  }
  if (s.model_type == "mistral") {
    s.sliding_window.reset();
    if (auto it = config.find("sliding_window"); it == config.end()) {
      s.sliding_window = 4096;
    } else if (!it->is_null()) {
      int64_t w = 0;
      Read(config, "sliding_window", &w, source, &problems);
      s.sliding_window = w;
    }
  }
  // Qwen2 applies its sliding window only with use_sliding_window (false in released configs).
  if (s.model_type == "qwen2" && config.value("use_sliding_window", false)) {
    int64_t w = 4096;
    Read(config, "sliding_window", &w, source, &problems);
    s.sliding_window = w;
  }
  if (auto it = config.find("torch_dtype"); it != config.end() && it->is_string()) {
    s.torch_dtype = it->get<std::string>();
  } else if (auto d = config.find("dtype"); d != config.end() && d->is_string()) {
    s.torch_dtype = d->get<std::string>();  // newer transformers write "dtype"
  }
  const std::string act = config.value("hidden_act", std::string("silu"));
  if (act != "silu") problems.push_back("hidden_act \"" + act + "\": only silu is implemented");

  s.head_dim = s.num_attention_heads > 0 ? s.hidden_size / s.num_attention_heads : 0;
  Read(config, "head_dim", &s.head_dim, source, &problems);

  if (auto it = config.find("rope_scaling"); it != config.end() && !it->is_null()) {
    const json& r = *it;
    std::string rtype = r.is_object() ? r.value("rope_type", r.value("type", std::string())) : "";
    if (rtype == "llama3") {
      Llama3RopeScaling l;
      Read(r, "factor", &l.factor, source, &problems);
      Read(r, "low_freq_factor", &l.low_freq_factor, source, &problems);
      Read(r, "high_freq_factor", &l.high_freq_factor, source, &problems);
      Read(r, "original_max_position_embeddings", &l.original_max_position_embeddings, source,
           &problems);
      if (!(l.factor > 0) || !(l.high_freq_factor > l.low_freq_factor) ||
          !(l.low_freq_factor > 0) || l.original_max_position_embeddings < 1) {
        problems.push_back("rope_scaling " + r.dump() +
                           ": llama3 needs factor > 0, high_freq_factor > low_freq_factor > 0 and "
                           "original_max_position_embeddings >= 1");
      }
      s.rope_scaling = l;
    } else if (rtype != "default") {
      problems.push_back("rope_scaling " + r.dump() +
                         ": only null and rope_type \"llama3\" are implemented");
    }
  }
  auto positive = [&](const char* key, int64_t v) {
    if (v < 1) problems.push_back(std::string(key) + " is " + std::to_string(v) + ", must be >= 1");
  };
  positive("vocab_size", s.vocab_size);
  positive("max_position_embeddings", s.max_position_embeddings);
  // Shapes that no tensor can have: refused here rather than by an allocation of petabytes.
  // (Token ids are int32 in tokenizers and in strata's data files.)
  auto at_most = [&](const char* key, int64_t v, int64_t limit) {
    if (v > limit) {
      problems.push_back(std::string(key) + " is " + std::to_string(v) + ", more than " +
                         std::to_string(limit));
    }
  };
  at_most("vocab_size", s.vocab_size, (int64_t{1} << 31) - 1);
  at_most("hidden_size", s.hidden_size, int64_t{1} << 20);
  at_most("intermediate_size", s.intermediate_size, int64_t{1} << 22);
  at_most("num_hidden_layers", s.num_hidden_layers, int64_t{1} << 16);
  at_most("num_attention_heads", s.num_attention_heads, int64_t{1} << 16);
  at_most("num_key_value_heads", s.num_key_value_heads, int64_t{1} << 16);
  at_most("head_dim", s.head_dim, int64_t{1} << 16);
  positive("hidden_size", s.hidden_size);
  positive("intermediate_size", s.intermediate_size);
  positive("num_hidden_layers", s.num_hidden_layers);
  positive("num_attention_heads", s.num_attention_heads);
  positive("num_key_value_heads", s.num_key_value_heads);
  positive("head_dim", s.head_dim);
  if (s.num_attention_heads > 0 && s.num_key_value_heads > 0 &&
      s.num_attention_heads % s.num_key_value_heads != 0) {
    problems.push_back("num_attention_heads " + std::to_string(s.num_attention_heads) +
                       " is not a multiple of num_key_value_heads " +
                       std::to_string(s.num_key_value_heads));
  }
  if (s.head_dim > 0 && s.head_dim % 2 != 0) {
    problems.push_back("head_dim " + std::to_string(s.head_dim) +
                       " is odd (rotary embeddings rotate pairs)");
  }
  if (!(s.rms_norm_eps > 0)) problems.push_back("rms_norm_eps must be > 0");
  if (!(s.rope_theta > 0)) problems.push_back("rope_theta must be > 0");
  if (!problems.empty()) {
    std::string msg = source + ": ";
    for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    return InvalidArgumentError(msg);
  }
  return s;
}

json HfConfigJson(const LlamaShape& s, const std::string& torch_dtype) {
  json j;
  j["architectures"] = json::array({s.architecture});
  j["model_type"] = s.model_type;
  j["vocab_size"] = s.vocab_size;
  j["hidden_size"] = s.hidden_size;
  j["intermediate_size"] = s.intermediate_size;
  j["num_hidden_layers"] = s.num_hidden_layers;
  j["num_attention_heads"] = s.num_attention_heads;
  j["num_key_value_heads"] = s.num_key_value_heads;
  j["head_dim"] = s.head_dim;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = s.rms_norm_eps;
  j["rope_theta"] = s.rope_theta;
  j["max_position_embeddings"] = s.max_position_embeddings;
  j["initializer_range"] = s.initializer_range;
  j["tie_word_embeddings"] = s.tie_word_embeddings;
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  if (s.model_type == "llama") {
    j["attention_bias"] = s.attention_bias;
    j["mlp_bias"] = s.mlp_bias;
    j["bos_token_id"] = s.vocab_size > 128000 ? 128000 : 1;
    j["eos_token_id"] = s.vocab_size > 128000 ? 128001 : 2;
  }
  if (s.model_type == "mistral") {
    j["sliding_window"] = s.sliding_window ? json(*s.sliding_window) : json(nullptr);
  }
  if (s.model_type == "qwen2") {
    j["use_sliding_window"] = false;
    j["sliding_window"] = s.sliding_window.value_or(s.max_position_embeddings);
  }
  if (s.rope_scaling) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", s.rope_scaling->factor},
        {"low_freq_factor", s.rope_scaling->low_freq_factor},
        {"high_freq_factor", s.rope_scaling->high_freq_factor},
        {"original_max_position_embeddings", s.rope_scaling->original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  return j;
}

std::span<const LlamaShape> LlamaPresets() {
  static const std::vector<LlamaShape> presets = MakePresets();
  return presets;
}

Result<LlamaShape> FindLlamaPreset(std::string_view name) {
  const std::string want = Lower(name);
  std::string names;
  for (const LlamaShape& s : LlamaPresets()) {
    if (Lower(s.name) == want) return s;
    names += (names.empty() ? "" : ", ") + s.name;
  }
  return NotFoundError("no Llama-family preset \"" + std::string(name) + "\" (presets: " + names +
                       ")");
}

uint64_t LlamaLayerParams(const LlamaShape& s) {
  const uint64_t h = s.hidden_size, q = s.num_attention_heads * s.head_dim,
                 kv = s.num_key_value_heads * s.head_dim, i = s.intermediate_size;
  uint64_t n = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h;
  if (s.attention_bias) n += q + 2 * kv + h;
  if (s.qkv_bias) n += q + 2 * kv;
  if (s.mlp_bias) n += 2 * i + h;
  return n;
}

std::vector<uint64_t> LlamaLayerTensorNumels(const LlamaShape& s) {
  const uint64_t h = s.hidden_size, q = s.num_attention_heads * s.head_dim,
                 kv = s.num_key_value_heads * s.head_dim, i = s.intermediate_size;
  const bool qkv_bias = s.attention_bias || s.qkv_bias;
  std::vector<uint64_t> t = {h, h * q, h * kv, h * kv, q * h, h, i * h, i * h, h * i};
  if (qkv_bias) t.insert(t.end(), {q, kv, kv});
  if (s.attention_bias) t.push_back(h);  // o_proj's bias
  if (s.mlp_bias) t.insert(t.end(), {i, i, h});
  return t;
}

uint64_t LlamaResidentParams(const LlamaShape& s) {
  const uint64_t emb = static_cast<uint64_t>(s.vocab_size) * s.hidden_size;
  return emb * (s.tie_word_embeddings ? 1 : 2) + s.hidden_size;
}

uint64_t LlamaTotalParams(const LlamaShape& s) {
  return s.num_hidden_layers * LlamaLayerParams(s) + LlamaResidentParams(s);
}

uint64_t LlamaLargestLayerTensor(const LlamaShape& s) {
  const uint64_t h = s.hidden_size, q = s.num_attention_heads * s.head_dim;
  return std::max(h * static_cast<uint64_t>(s.intermediate_size), h * q);
}

}  // namespace strata::runtime
