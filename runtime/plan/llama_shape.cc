#include "runtime/plan/llama_shape.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <vector>

#include "base/logging.h"

namespace strata::runtime {
namespace {

using json = nlohmann::json;

struct Arch {
  const char* architecture;
  const char* model_type;
};
constexpr std::array<Arch, 7> kArchitectures = {{{"LlamaForCausalLM", "llama"},
                                                 {"MistralForCausalLM", "mistral"},
                                                 {"Qwen2ForCausalLM", "qwen2"},
                                                 {"Phi3ForCausalLM", "phi3"},
                                                 {"Gemma2ForCausalLM", "gemma2"},
                                                 {"MixtralForCausalLM", "mixtral"},
                                                 {"Qwen2MoeForCausalLM", "qwen2_moe"}}};

// Gemma 2's alternation without layer_types (configuration_gemma2.py): layer i slides when i is
// even.
std::vector<bool> Gemma2DefaultSlidingLayers(int64_t layers) {
  std::vector<bool> out(static_cast<size_t>(std::max<int64_t>(layers, 0)));
  for (size_t i = 0; i < out.size(); ++i) out[i] = (i + 1) % 2 != 0;
  return out;
}

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
  } else if (model_type == "phi3") {
    s.vocab_size = 32064;
    s.hidden_size = 3072;
    s.intermediate_size = 8192;
    s.max_position_embeddings = 4096;
    s.rms_norm_eps = 1e-5;
    s.pad_token_id = 32000;             // Phi3Config's default: <|endoftext|>
  } else if (model_type == "gemma2") {  // Gemma2Config's defaults: gemma-2-2b's shape
    s.vocab_size = 256000;
    s.hidden_size = 2304;
    s.intermediate_size = 9216;
    s.num_hidden_layers = 26;
    s.num_attention_heads = 8;
    s.num_key_value_heads = 4;
    s.head_dim = 256;
    s.max_position_embeddings = 8192;
    s.tie_word_embeddings = true;
    s.pad_token_id = 0;
    s.sliding_window = 4096;
    s.sliding_layers = Gemma2DefaultSlidingLayers(s.num_hidden_layers);
    s.query_pre_attn_scalar = 256;
    s.attn_logit_softcapping = 50.0;
    s.final_logit_softcapping = 30.0;
  } else if (model_type == "mixtral") {  // configuration_mixtral.py
    s.intermediate_size = 14336;
    s.num_key_value_heads = 8;
    s.max_position_embeddings = 4096 * 32;
    s.rms_norm_eps = 1e-5;
    s.rope_theta = 1e6;
    s.num_experts = 8;
    s.num_experts_per_tok = 2;
    s.moe_intermediate_size = s.intermediate_size;
  } else if (model_type == "qwen2_moe") {  // configuration_qwen2_moe.py
    s.vocab_size = 151936;
    s.hidden_size = 2048;
    s.intermediate_size = 5632;
    s.num_hidden_layers = 24;
    s.num_attention_heads = 16;
    s.num_key_value_heads = 16;
    s.max_position_embeddings = 32768;
    s.qkv_bias = true;
    s.num_experts = 60;
    s.num_experts_per_tok = 4;
    s.moe_intermediate_size = 1408;
    s.shared_expert_intermediate_size = 5632;
    s.norm_topk_prob = false;
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
  if (s.pad_token_id && *s.pad_token_id >= vocab) s.pad_token_id.reset();
  return s;
}

// Llama 3.1/3.2's rope_scaling: llama3 with `factor` over 8192 pretraining positions.
RopeScaling Llama3(double factor) {
  RopeScaling r;
  r.type = RopeScaling::Type::kLlama3;
  r.factor = factor;
  r.original_max_position_embeddings = 8192;
  return r;
}

std::vector<LlamaShape> MakePresets() {
  const char* kL = "LlamaForCausalLM";
  std::vector<LlamaShape> p;
  // A few thousand parameters per layer: tests and quick runs.
  p.push_back(Preset("llama-tiny", kL, "llama", 256, 64, 160, 2, 4, 2, 1e-5, 10000, false, 2048,
                     "float32"));
  p.push_back(Preset("llama-3.2-1b", kL, "llama", 128256, 2048, 8192, 16, 32, 8, 1e-5, 500000, true,
                     131072, "bfloat16"));
  p.back().rope_scaling = Llama3(32.0);
  p.push_back(Preset("llama-3.2-3b", kL, "llama", 128256, 3072, 8192, 28, 24, 8, 1e-5, 500000, true,
                     131072, "bfloat16"));
  p.back().rope_scaling = Llama3(32.0);
  p.push_back(Preset("llama-3.1-8b", kL, "llama", 128256, 4096, 14336, 32, 32, 8, 1e-5, 500000,
                     false, 131072, "bfloat16"));
  p.back().rope_scaling = Llama3(8.0);
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
  p.back().rope_scaling = Llama3(8.0);
  // Phi-3 (the -4k-instruct configs): 32064 x 3072 (mini) and 32064 x 5120 (medium), a sliding
  // window of 2047 on every layer.
  const char* kPhi3 = "Phi3ForCausalLM";
  p.push_back(Preset("phi-3-mini-4k", kPhi3, "phi3", 32064, 3072, 8192, 32, 32, 32, 1e-5, 10000,
                     false, 4096, "bfloat16"));
  p.back().sliding_window = 2047;
  p.push_back(Preset("phi-3-medium-4k", kPhi3, "phi3", 32064, 5120, 17920, 40, 40, 10, 1e-5, 10000,
                     false, 4096, "bfloat16"));
  p.back().sliding_window = 2047;
  // Gemma 2 (google/gemma-2-*: float32 weights, head_dim and query_pre_attn_scalar explicit).
  auto gemma2 = [&](const char* name, int64_t hidden, int64_t inter, int64_t layers, int64_t heads,
                    int64_t kv, int64_t head_dim, double query_pre_attn_scalar) {
    LlamaShape s = Preset(name, "Gemma2ForCausalLM", "gemma2", 256000, hidden, inter, layers, heads,
                          kv, 1e-6, 10000, true, 8192, "float32");
    s.head_dim = head_dim;
    s.query_pre_attn_scalar = query_pre_attn_scalar;
    s.sliding_layers = Gemma2DefaultSlidingLayers(layers);
    return s;
  };
  p.push_back(gemma2("gemma-2-2b", 2304, 9216, 26, 8, 4, 256, 256));
  p.push_back(gemma2("gemma-2-9b", 3584, 14336, 42, 16, 8, 256, 256));
  p.push_back(gemma2("gemma-2-27b", 4608, 36864, 46, 32, 16, 128, 144));
  // mistralai/Mixtral-8x7B-v0.1: 46,702,792,704 parameters.
  p.push_back(Preset("mixtral-8x7b", "MixtralForCausalLM", "mixtral", 32000, 4096, 14336, 32, 32, 8,
                     1e-5, 1e6, false, 32768, "bfloat16"));
  p.back().sliding_window.reset();
  p.back().moe_intermediate_size = 14336;
  // Qwen/Qwen1.5-MoE-A2.7B: 14,315,784,192 parameters (60 experts of 1408, a shared one of 5632).
  p.push_back(Preset("qwen1.5-moe-a2.7b", "Qwen2MoeForCausalLM", "qwen2_moe", 151936, 2048, 5632,
                     24, 16, 16, 1e-6, 1e6, false, 8192, "bfloat16"));
  // A Mixtral of a few thousand parameters per expert: tests and quick runs.
  p.push_back(Preset("mixtral-tiny", "MixtralForCausalLM", "mixtral", 256, 64, 96, 2, 4, 2, 1e-5,
                     1e6, false, 2048, "float32"));
  p.back().moe_intermediate_size = 96;
  p.back().num_experts = 4;
  // Mixtral-8x7B's shape scaled to a small machine (`strata bench step --model`): 8 experts, top-2,
  // experts 3.5x the hidden size, 4 query heads per kv head, embeddings 2% of the parameters;
  // 185.6 M parameters, 22.7 M per layer of which 22.0 M are experts.
  p.push_back(Preset("mixtral-mini", "MixtralForCausalLM", "mixtral", 4096, 512, 1792, 8, 8, 2,
                     1e-5, 1e6, false, 32768, "float32"));
  p.back().sliding_window.reset();
  p.back().moe_intermediate_size = 1792;
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

bool Has(const json& j, const char* key) { return j.contains(key) && !j.at(key).is_null(); }

// pad_token_id as nn.Embedding takes padding_idx: null is none, a negative id counts from the end
// of the vocabulary, an id outside it is refused (transformers fails to build such a model). An
// absent key keeps the class default (Phi3Config 32000, Gemma2Config 0) when the vocabulary holds
// it, and none otherwise.
void ReadPadTokenId(const json& config, LlamaShape* s, std::vector<std::string>* problems) {
  auto it = config.find("pad_token_id");
  if (it == config.end()) {
    if (s->pad_token_id && (*s->pad_token_id < 0 || *s->pad_token_id >= s->vocab_size))
      s->pad_token_id.reset();
    return;
  }
  s->pad_token_id.reset();
  if (it->is_null()) return;
  if (!it->is_number_integer()) {
    problems->push_back("pad_token_id is " + it->dump() + ", expected an integer or null");
    return;
  }
  const int64_t id = it->get<int64_t>();
  const int64_t row = id < 0 ? id + s->vocab_size : id;
  if (row < 0 || row >= s->vocab_size) {
    problems->push_back("pad_token_id is " + std::to_string(id) + ", outside the vocabulary of " +
                        std::to_string(s->vocab_size) + " (vocab_size)");
    return;
  }
  s->pad_token_id = row;
}

// ---- Positions: sliding windows and rope scaling ----

// Which layers slide and over how many keys, as each configuration class builds layer_types.
void ParseSlidingWindows(const json& c, LlamaShape* s, const std::string& source,
                         std::vector<std::string>* problems) {
  s->sliding_window.reset();
  s->sliding_layers.clear();
  int64_t window = 4096;  // MistralConfig's and Qwen2Config's default
  if (s->model_type == "mistral") {
    // Absent: the default; an explicit null: full attention (Mistral v0.2+).
    if (!c.contains("sliding_window") || Has(c, "sliding_window")) {
      Read(c, "sliding_window", &window, source, problems);
      s->sliding_window = window;
    }
  } else if (s->model_type == "phi3" || s->model_type == "mixtral") {
    if (Has(c, "sliding_window")) {  // Phi3Config's and MixtralConfig's default is null
      Read(c, "sliding_window", &window, source, problems);
      s->sliding_window = window;
    }
  } else if (s->model_type == "gemma2") {
    // Gemma2Config: window 4096 unless given (null: no layer slides), on the even layers.
    if (!c.contains("sliding_window") || Has(c, "sliding_window")) {
      Read(c, "sliding_window", &window, source, problems);
      s->sliding_window = window;
      s->sliding_layers = Gemma2DefaultSlidingLayers(s->num_hidden_layers);
    }
  } else if (s->model_type == "qwen2") {
    // Qwen2 slides only with use_sliding_window, and then layers max_window_layers and above.
    bool use = false;
    int64_t max_window_layers = 28;
    Read(c, "use_sliding_window", &use, source, problems);
    Read(c, "max_window_layers", &max_window_layers, source, problems);
    if (use && (!c.contains("sliding_window") || Has(c, "sliding_window"))) {
      Read(c, "sliding_window", &window, source, problems);
      s->sliding_window = window;
      for (int64_t i = 0; i < s->num_hidden_layers; ++i)
        s->sliding_layers.push_back(i >= max_window_layers);
    }
  } else if (s->model_type == "qwen2_moe") {
    // Qwen2MoeConfig (transformers 5): a window only with use_sliding_window, and then, unless
    // layer_types lists the layers, the even layers below max_window_layers slide (its
    // __post_init__: (i + 1) % 2 and i < max_window_layers). transformers 4.x decided it in the
    // attention code instead (flash attention: layers >= max_window_layers, as Qwen2; eager and
    // sdpa: every layer), so a config without layer_types is computed as transformers 5 does, with
    // a warning; with layer_types every version that reads it agrees.
    bool use = false;
    int64_t max_window_layers = 28;
    Read(c, "use_sliding_window", &use, source, problems);
    Read(c, "max_window_layers", &max_window_layers, source, problems);
    if (use && (!c.contains("sliding_window") || Has(c, "sliding_window"))) {
      Read(c, "sliding_window", &window, source, problems);
      s->sliding_window = window;
      std::string sliding;
      for (int64_t i = 0; i < s->num_hidden_layers; ++i) {
        const bool slides = i % 2 == 0 && i < max_window_layers;
        s->sliding_layers.push_back(slides);
        if (slides && sliding.size() < 200)
          sliding += (sliding.empty() ? "" : ", ") + std::to_string(i);
      }
      if (!Has(c, "layer_types")) {
        STRATA_LOG(kWarning)
            << source << ": use_sliding_window without layer_types: layers "
            << (sliding.empty() ? std::string("(none)") : sliding) << " slide over " << window
            << " keys, as transformers 5's Qwen2MoeConfig derives them (the even layers below "
               "max_window_layers); transformers 4.x chose other layers, so list layer_types in "
               "config.json to pin them";
      }
    }
  }  // LlamaConfig has no window: a "sliding_window" key there is an ignored extra attribute.
  if (Has(c, "layer_types")) {  // newer configs list each layer's kind; it wins
    const json& types = c.at("layer_types");
    const bool listed =
        types.is_array() && static_cast<int64_t>(types.size()) == s->num_hidden_layers;
    std::vector<bool> slides;
    for (size_t i = 0; listed && i < types.size(); ++i) {
      if (types[i] == "sliding_attention" || types[i] == "full_attention") {
        slides.push_back(types[i] == "sliding_attention");
      }
    }
    if (static_cast<int64_t>(slides.size()) != s->num_hidden_layers) {
      problems->push_back("layer_types is " + types.dump() + ", expected num_hidden_layers (" +
                          std::to_string(s->num_hidden_layers) +
                          ") entries of \"sliding_attention\" or \"full_attention\"");
    } else {
      s->sliding_layers = std::move(slides);
    }
  }
  if (s->sliding_window && *s->sliding_window < 1) {
    problems->push_back("sliding_window is " + std::to_string(*s->sliding_window) +
                        ", must be >= 1 (or null)");
  }
}

// Gemma2Config's own keys (configuration_gemma2.py); absent keys keep Defaults("gemma2"), a null
// soft-cap turns it off. (sliding_window and layer_types: ParseSlidingWindows.)
void ReadGemma2(const json& config, const std::string& source, LlamaShape* s,
                std::vector<std::string>* problems) {
  // Gemma2MLP applies hidden_activation; hidden_act (also in the released configs) is not read.
  Read(config, "hidden_activation", &s->hidden_activation, source, problems);
  if (s->hidden_activation != "gelu_pytorch_tanh" && s->hidden_activation != "gelu") {
    problems->push_back("hidden_activation \"" + s->hidden_activation +
                        "\": only gelu_pytorch_tanh and gelu are implemented");
  }
  Read(config, "attention_bias", &s->attention_bias, source, problems);
  Read(config, "query_pre_attn_scalar", &s->query_pre_attn_scalar, source, problems);
  if (!(s->query_pre_attn_scalar > 0)) problems->push_back("query_pre_attn_scalar must be > 0");
  auto read_cap = [&](const char* key, std::optional<double>* cap) {
    if (!config.contains(key)) return;  // the default
    if (!Has(config, key)) {            // null: no cap
      cap->reset();
      return;
    }
    double v = 1;
    Read(config, key, &v, source, problems);
    if (!(v > 0)) {
      problems->push_back(std::string(key) + " is " + config.at(key).dump() + ", must be > 0");
    }
    *cap = v;
  };
  read_cap("attn_logit_softcapping", &s->attn_logit_softcapping);
  read_cap("final_logit_softcapping", &s->final_logit_softcapping);
  bool bidirectional = false;
  Read(config, "use_bidirectional_attention", &bidirectional, source, problems);
  if (bidirectional) {
    problems->push_back("use_bidirectional_attention true: only causal attention is implemented");
  }
}

// YaRN's get_mscale.
double YarnMscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// rope_scaling (v4) or rope_parameters (v5) with transformers' defaults and derived values
// (modeling_rope_utils.py). Needs head_dim and max_position_embeddings read already.
void ParseRope(const json& c, LlamaShape* s, const std::string& source,
               std::vector<std::string>* problems) {
  s->rope_scaling.reset();
  Read(c, "partial_rotary_factor", &s->partial_rotary_factor, source, problems);
  const char* key = Has(c, "rope_scaling") ? "rope_scaling" : "rope_parameters";
  if (!Has(c, key)) return;
  const json& r = c.at(key);
  const std::string where = std::string(key) + " " + r.dump();
  if (!r.is_object()) {
    problems->push_back(where + ": expected an object or null");
    return;
  }
  std::string type = "default";
  for (const char* type_key : {"type", "rope_type"}) {  // rope_type wins
    if (auto it = r.find(type_key); it != r.end() && it->is_string()) type = it->get<std::string>();
  }
  Read(r, "rope_theta", &s->rope_theta, source, problems);  // v5 keeps it here
  Read(r, "partial_rotary_factor", &s->partial_rotary_factor, source, problems);
  if (s->model_type == "phi3") {
    // Phi3Config: the legacy names of Phi-3's scaling are longrope; nothing else is allowed.
    if (type == "su" || type == "yarn") type = "longrope";
    if (type != "default" && type != "longrope") {
      problems->push_back(where + ": Phi3 takes rope type default or longrope (su)");
      return;
    }
  }
  if (type == "default") return;
  RopeScaling rs;
  using Type = RopeScaling::Type;
  constexpr std::array<Type, 5> kTypes = {Type::kLinear, Type::kDynamic, Type::kYarn,
                                          Type::kLongrope, Type::kLlama3};
  const auto known =
      std::find_if(kTypes.begin(), kTypes.end(), [&](Type t) { return type == RopeTypeName(t); });
  if (known == kTypes.end()) {
    problems->push_back(where + ": rope type \"" + type +
                        "\" is not one strata implements (default, linear, dynamic, yarn, "
                        "longrope, llama3)");
    return;
  }
  rs.type = *known;
  // A top-level original_max_position_embeddings (Phi3 always has one) wins over rope_scaling's.
  rs.original_max_position_embeddings = s->max_position_embeddings;
  Read(r, "original_max_position_embeddings", &rs.original_max_position_embeddings, source,
       problems);
  if (s->model_type == "phi3") rs.original_max_position_embeddings = 4096;
  Read(c, "original_max_position_embeddings", &rs.original_max_position_embeddings, source,
       problems);
  if (rs.original_max_position_embeddings < 1) {
    problems->push_back(where + ": original_max_position_embeddings must be >= 1");
    return;
  }
  const double original = static_cast<double>(rs.original_max_position_embeddings);
  const bool factor_given = Has(r, "factor");
  if (!factor_given &&
      (rs.type == Type::kLinear || rs.type == Type::kDynamic || rs.type == Type::kLlama3)) {
    problems->push_back(where + ": rope type " + type + " needs \"factor\"");
    return;
  }
  rs.factor = static_cast<double>(s->max_position_embeddings) / original;
  Read(r, "factor", &rs.factor, source, problems);
  if (!(rs.factor > 0)) {
    problems->push_back(where + ": factor must be > 0");
    return;
  }
  switch (rs.type) {
    case Type::kLinear:
    case Type::kDynamic:
      break;
    case Type::kLlama3:
      Read(r, "low_freq_factor", &rs.low_freq_factor, source, problems);
      Read(r, "high_freq_factor", &rs.high_freq_factor, source, problems);
      if (!(rs.high_freq_factor > rs.low_freq_factor) || !(rs.low_freq_factor > 0)) {
        problems->push_back(where + ": llama3 needs high_freq_factor > low_freq_factor > 0");
      }
      break;
    case Type::kYarn: {
      // `beta_fast or 32`: absent, null and 0 take the defaults.
      double beta = 0, mscale = 0, mscale_all_dim = 0;
      Read(r, "beta_fast", &beta, source, problems);
      if (beta != 0) rs.beta_fast = beta;
      beta = 0;
      Read(r, "beta_slow", &beta, source, problems);
      if (beta != 0) rs.beta_slow = beta;
      Read(r, "truncate", &rs.truncate, source, problems);
      Read(r, "mscale", &mscale, source, problems);
      Read(r, "mscale_all_dim", &mscale_all_dim, source, problems);
      rs.attention_factor =
          mscale != 0 && mscale_all_dim != 0
              ? YarnMscale(rs.factor, mscale) / YarnMscale(rs.factor, mscale_all_dim)
              : YarnMscale(rs.factor, 1.0);
      Read(r, "attention_factor", &rs.attention_factor, source, problems);
      break;
    }
    case Type::kLongrope: {
      const size_t half = static_cast<size_t>(RotaryDim(*s) / 2);
      for (const char* list : {"short_factor", "long_factor"}) {
        std::vector<double>& out = list[0] == 's' ? rs.short_factor : rs.long_factor;
        const json* v = r.contains(list) ? &r.at(list) : nullptr;
        if (v != nullptr && v->is_array() && v->size() == half &&
            std::all_of(v->begin(), v->end(), [](const json& x) { return x.is_number(); })) {
          out = v->get<std::vector<double>>();
        } else {
          problems->push_back(where + ": longrope needs " + list + ", a list of " +
                              std::to_string(half) + " numbers (rotary dims / 2)");
        }
      }
      rs.attention_factor =
          rs.factor <= 1 ? 1.0 : std::sqrt(1 + std::log(rs.factor) / std::log(original));
      Read(r, "attention_factor", &rs.attention_factor, source, problems);
      break;
    }
  }
  s->rope_scaling = std::move(rs);
}

}  // namespace

const char* RopeTypeName(RopeScaling::Type type) {
  switch (type) {
    case RopeScaling::Type::kLinear:
      return "linear";
    case RopeScaling::Type::kDynamic:
      return "dynamic";
    case RopeScaling::Type::kYarn:
      return "yarn";
    case RopeScaling::Type::kLongrope:
      return "longrope";
    case RopeScaling::Type::kLlama3:
      return "llama3";
  }
  return "default";
}

std::optional<int64_t> LayerSlidingWindow(const LlamaShape& s, int64_t layer) {
  if (!s.sliding_window) return std::nullopt;
  if (s.sliding_layers.empty()) return s.sliding_window;
  const bool slides = layer >= 0 && layer < static_cast<int64_t>(s.sliding_layers.size()) &&
                      s.sliding_layers[static_cast<size_t>(layer)];
  return slides ? s.sliding_window : std::nullopt;
}

int64_t RotaryDim(const LlamaShape& s) {
  return static_cast<int64_t>(static_cast<double>(s.head_dim) * s.partial_rotary_factor);
}

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
  if (s.model_type == "mistral" || s.model_type == "mixtral") s.num_key_value_heads = 8;
  if (IsGemma2(s)) s.num_key_value_heads = 4;
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
  if (s.model_type == "mixtral") {
    Read(config, "num_local_experts", &s.num_experts, source, &problems);
    s.moe_intermediate_size = s.intermediate_size;
    double jitter = 0;
    Read(config, "router_jitter_noise", &jitter, source, &problems);
    if (jitter != 0) {
      problems.push_back("router_jitter_noise " + std::to_string(jitter) +
                         ": random router jitter is not implemented (a decoder layer must "
                         "recompute its forward exactly in backward)");
    }
  }
  if (s.model_type == "qwen2_moe") {
    Read(config, "num_experts", &s.num_experts, source, &problems);
    Read(config, "moe_intermediate_size", &s.moe_intermediate_size, source, &problems);
    Read(config, "shared_expert_intermediate_size", &s.shared_expert_intermediate_size, source,
         &problems);
    Read(config, "norm_topk_prob", &s.norm_topk_prob, source, &problems);
    Read(config, "decoder_sparse_step", &s.decoder_sparse_step, source, &problems);
    Read(config, "qkv_bias", &s.qkv_bias, source, &problems);
    if (auto it = config.find("mlp_only_layers"); it != config.end() && !it->is_null()) {
      bool ok = it->is_array();
      for (const json& v : ok ? *it : json::array()) ok = ok && v.is_number_integer();
      if (ok) {
        s.mlp_only_layers = it->get<std::vector<int64_t>>();
      } else {
        problems.push_back("mlp_only_layers is " + it->dump() + ", expected a list of integers");
      }
    }
  }
  if (s.num_experts > 0) {
    Read(config, "num_experts_per_tok", &s.num_experts_per_tok, source, &problems);
    Read(config, "output_router_logits", &s.output_router_logits, source, &problems);
    Read(config, "router_aux_loss_coef", &s.router_aux_loss_coef, source, &problems);
    if (s.num_experts_per_tok < 1 || s.num_experts_per_tok > s.num_experts) {
      problems.push_back("num_experts_per_tok " + std::to_string(s.num_experts_per_tok) +
                         " must be in 1 .. " + std::to_string(s.num_experts) + " (the experts)");
    }
    if (s.moe_intermediate_size < 1)
      problems.push_back("the experts' intermediate size must be >= 1");
    if (s.decoder_sparse_step < 1) problems.push_back("decoder_sparse_step must be >= 1");
    if (s.num_experts > (int64_t{1} << 16)) problems.push_back("more than 65536 experts");
  }
  if (auto it = config.find("torch_dtype"); it != config.end() && it->is_string()) {
    s.torch_dtype = it->get<std::string>();
  } else if (auto d = config.find("dtype"); d != config.end() && d->is_string()) {
    s.torch_dtype = d->get<std::string>();  // newer transformers write "dtype"
  }
  if (IsGemma2(s)) {
    ReadGemma2(config, source, &s, &problems);
  } else {
    std::string act = "silu";
    Read(config, "hidden_act", &act, source, &problems);
    if (act != "silu") problems.push_back("hidden_act \"" + act + "\": only silu is implemented");
    s.head_dim = s.num_attention_heads > 0 ? s.hidden_size / s.num_attention_heads : 0;
  }
  Read(config, "head_dim", &s.head_dim, source, &problems);

  auto positive = [&](const char* key, int64_t v) {
    if (v < 1) problems.push_back(std::string(key) + " is " + std::to_string(v) + ", must be >= 1");
  };
  positive("vocab_size", s.vocab_size);
  positive("max_position_embeddings", s.max_position_embeddings);
  if (s.vocab_size >= 1) ReadPadTokenId(config, &s, &problems);
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
  if (s.num_hidden_layers <= (int64_t{1} << 16) && s.head_dim > 0) {  // sizes positions can use
    ParseSlidingWindows(config, &s, source, &problems);
    ParseRope(config, &s, source, &problems);
    const int64_t rotary = RotaryDim(s);
    if (rotary < 2 || rotary % 2 != 0 || rotary > s.head_dim) {
      problems.push_back("partial_rotary_factor " + std::to_string(s.partial_rotary_factor) +
                         " gives " + std::to_string(rotary) + " rotary dims of head_dim " +
                         std::to_string(s.head_dim) + " (must be even, 2 .. head_dim)");
    }
  }
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
  j["hidden_act"] = IsGemma2(s) ? s.hidden_activation : "silu";
  j["rms_norm_eps"] = s.rms_norm_eps;
  j["rope_theta"] = s.rope_theta;
  j["max_position_embeddings"] = s.max_position_embeddings;
  j["initializer_range"] = s.initializer_range;
  j["tie_word_embeddings"] = s.tie_word_embeddings;
  j["pad_token_id"] = s.pad_token_id ? json(*s.pad_token_id) : json(nullptr);
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  if (s.model_type == "llama") {
    j["attention_bias"] = s.attention_bias;
    j["mlp_bias"] = s.mlp_bias;
    j["bos_token_id"] = s.vocab_size > 128000 ? 128000 : 1;
    j["eos_token_id"] = s.vocab_size > 128000 ? 128001 : 2;
  }
  if (s.model_type == "mistral" || s.model_type == "phi3") {
    j["sliding_window"] = s.sliding_window ? json(*s.sliding_window) : json(nullptr);
  }
  if (s.model_type == "phi3") {
    j["original_max_position_embeddings"] =
        s.rope_scaling ? s.rope_scaling->original_max_position_embeddings : 4096;
  }
  if (s.model_type == "qwen2") {
    j["use_sliding_window"] = s.sliding_window.has_value();
    j["sliding_window"] = s.sliding_window.value_or(s.max_position_embeddings);
    j["max_window_layers"] = 0;  // every layer slides unless layer_types says otherwise
  }
  if (IsGemma2(s)) {  // the keys of google/gemma-2-*'s config.json
    j["hidden_activation"] = s.hidden_activation;
    j["attention_bias"] = s.attention_bias;
    j["attention_dropout"] = 0.0;
    j["query_pre_attn_scalar"] = s.query_pre_attn_scalar;
    j["attn_logit_softcapping"] =
        s.attn_logit_softcapping ? json(*s.attn_logit_softcapping) : json(nullptr);
    j["final_logit_softcapping"] =
        s.final_logit_softcapping ? json(*s.final_logit_softcapping) : json(nullptr);
    j["sliding_window"] = s.sliding_window ? json(*s.sliding_window) : json(nullptr);
    j["cache_implementation"] = "hybrid";
    j["eos_token_id"] = 1;
    j["bos_token_id"] = 2;
  }
  if (!s.sliding_layers.empty()) {
    json types = json::array();
    for (bool slides : s.sliding_layers)
      types.push_back(slides ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  }
  if (s.partial_rotary_factor != 1.0) j["partial_rotary_factor"] = s.partial_rotary_factor;
  j["rope_scaling"] = nullptr;
  if (s.model_type == "mixtral") {
    j["sliding_window"] = s.sliding_window ? json(*s.sliding_window) : json(nullptr);
    j["num_local_experts"] = s.num_experts;
    j["router_jitter_noise"] = 0.0;
  }
  if (s.model_type == "qwen2_moe") {
    // With a window, layer_types (written above) names the layers that slide.
    j["use_sliding_window"] = s.sliding_window.has_value();
    j["sliding_window"] = s.sliding_window.value_or(s.max_position_embeddings);
    j["num_experts"] = s.num_experts;
    j["moe_intermediate_size"] = s.moe_intermediate_size;
    j["shared_expert_intermediate_size"] = s.shared_expert_intermediate_size;
    j["norm_topk_prob"] = s.norm_topk_prob;
    j["decoder_sparse_step"] = s.decoder_sparse_step;
    j["mlp_only_layers"] = s.mlp_only_layers;
    j["qkv_bias"] = s.qkv_bias;
  }
  if (s.num_experts > 0) {
    j["num_experts_per_tok"] = s.num_experts_per_tok;
    j["output_router_logits"] = s.output_router_logits;
    j["router_aux_loss_coef"] = s.router_aux_loss_coef;
  }
  if (s.rope_scaling) {
    const RopeScaling& r = *s.rope_scaling;
    json& out = j["rope_scaling"];
    out = {{"rope_type", RopeTypeName(r.type)}, {"factor", r.factor}};
    if (r.type != RopeScaling::Type::kLinear && r.type != RopeScaling::Type::kDynamic) {
      out["original_max_position_embeddings"] = r.original_max_position_embeddings;
    }
    if (r.type == RopeScaling::Type::kLlama3) {
      out["low_freq_factor"] = r.low_freq_factor;
      out["high_freq_factor"] = r.high_freq_factor;
    } else if (r.type == RopeScaling::Type::kYarn) {
      out["beta_fast"] = r.beta_fast;
      out["beta_slow"] = r.beta_slow;
      out["truncate"] = r.truncate;
      out["attention_factor"] = r.attention_factor;
    } else if (r.type == RopeScaling::Type::kLongrope) {
      out["short_factor"] = r.short_factor;
      out["long_factor"] = r.long_factor;
      out["attention_factor"] = r.attention_factor;
    }
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

bool IsSparseLayer(const LlamaShape& s, int64_t layer) {
  if (s.num_experts <= 0) return false;
  if (std::find(s.mlp_only_layers.begin(), s.mlp_only_layers.end(), layer) !=
      s.mlp_only_layers.end()) {
    return false;
  }
  return (layer + 1) % s.decoder_sparse_step == 0;
}

int64_t SparseLayerCount(const LlamaShape& s) {
  int64_t n = 0;
  for (int64_t l = 0; l < s.num_hidden_layers; ++l) n += IsSparseLayer(s, l) ? 1 : 0;
  return n;
}

std::vector<uint64_t> LlamaLayerTensorNumels(const LlamaShape& s, int64_t layer) {
  const uint64_t h = s.hidden_size, q = s.num_attention_heads * s.head_dim,
                 kv = s.num_key_value_heads * s.head_dim, i = s.intermediate_size;
  // One entry per tensor: norms, attention projections, MLP projections, biases.
  if (FusedProjections(s)) return {h, (q + 2 * kv) * h, q * h, h, 2 * i * h, h * i};
  const bool qkv_bias = s.attention_bias || s.qkv_bias;
  std::vector<uint64_t> t = {h, h * q, h * kv, h * kv, q * h, h};
  if (IsSparseLayer(s, layer)) {
    const uint64_t e = s.moe_intermediate_size;
    t.push_back(static_cast<uint64_t>(s.num_experts) * h);  // the router
    for (int64_t x = 0; x < s.num_experts; ++x) t.insert(t.end(), {e * h, e * h, h * e});
    if (s.shared_expert_intermediate_size > 0) {
      const uint64_t se = s.shared_expert_intermediate_size;
      t.insert(t.end(), {se * h, se * h, h * se, h});  // the shared expert and its gate
    }
  } else {
    t.insert(t.end(), {i * h, i * h, h * i});
  }
  if (qkv_bias) t.insert(t.end(), {q, kv, kv});
  if (s.attention_bias) t.push_back(h);  // o_proj's bias
  if (s.mlp_bias) t.insert(t.end(), {i, i, h});
  if (IsGemma2(s)) t.insert(t.end(), {h, h});  // pre_ and post_feedforward_layernorm
  return t;
}

std::vector<uint64_t> LlamaLayerTensorNumels(const LlamaShape& s) {
  std::vector<uint64_t> largest;
  uint64_t most = 0;
  for (int64_t l = 0; l < std::max<int64_t>(s.num_hidden_layers, 1); ++l) {
    std::vector<uint64_t> t = LlamaLayerTensorNumels(s, l);
    uint64_t n = 0;
    for (uint64_t x : t) n += x;
    if (largest.empty() || n > most) {
      most = n;
      largest = std::move(t);
    }
    if (s.num_experts == 0) break;  // dense layers are all alike
  }
  return largest;
}

uint64_t LlamaLayerParams(const LlamaShape& s, int64_t layer) {
  uint64_t n = 0;
  for (uint64_t x : LlamaLayerTensorNumels(s, layer)) n += x;
  return n;
}

uint64_t LlamaLayerParams(const LlamaShape& s) {
  uint64_t n = 0;
  for (uint64_t x : LlamaLayerTensorNumels(s)) n += x;
  return n;
}

uint64_t LlamaUnitTensors::numel() const {
  uint64_t n = 0;
  for (uint64_t x : tensors) n += x;
  return n;
}

std::vector<LlamaUnitTensors> LlamaLayerUnits(const LlamaShape& s, int64_t layer,
                                              std::vector<uint64_t>* outside) {
  using Kind = LlamaUnitTensors::Kind;
  if (!s.page_experts || s.num_experts == 0 || FusedProjections(s)) {
    return {{Kind::kLayer, LlamaLayerTensorNumels(s, layer)}};
  }
  // The split of LlamaLayerTensorNumels, unit by unit (runtime/models/llama.cc, moe.cc).
  const uint64_t h = s.hidden_size, q = s.num_attention_heads * s.head_dim,
                 kv = s.num_key_value_heads * s.head_dim, i = s.intermediate_size;
  std::vector<LlamaUnitTensors> units;
  LlamaUnitTensors attention{Kind::kAttention, {h * q, h * kv, h * kv, q * h}};
  if (s.attention_bias || s.qkv_bias)
    attention.tensors.insert(attention.tensors.end(), {q, kv, kv});
  if (s.attention_bias) attention.tensors.push_back(h);  // o_proj's bias
  units.push_back(std::move(attention));
  std::vector<uint64_t> rest = {h, h};  // input_layernorm, post_attention_layernorm
  if (IsGemma2(s)) rest.insert(rest.end(), {h, h});
  if (IsSparseLayer(s, layer)) {
    const uint64_t e = s.moe_intermediate_size;
    rest.push_back(static_cast<uint64_t>(s.num_experts) * h);  // the router
    for (int64_t x = 0; x < s.num_experts; ++x) {
      units.push_back({Kind::kExpert, {e * h, e * h, h * e}});
    }
    if (s.shared_expert_intermediate_size > 0) {
      const uint64_t se = s.shared_expert_intermediate_size;
      units.push_back({Kind::kSharedExpert, {se * h, se * h, h * se}});
      rest.push_back(h);  // shared_expert_gate
    }
  } else {
    LlamaUnitTensors mlp{Kind::kMlp, {i * h, i * h, h * i}};
    if (s.mlp_bias) mlp.tensors.insert(mlp.tensors.end(), {i, i, h});
    units.push_back(std::move(mlp));
  }
  if (outside != nullptr) outside->insert(outside->end(), rest.begin(), rest.end());
  return units;
}

double ExpertHitProbability(const LlamaShape& s, double tokens) {
  if (s.num_experts <= 0 || tokens <= 0) return 0;
  const double miss =
      1.0 - static_cast<double>(s.num_experts_per_tok) / static_cast<double>(s.num_experts);
  return 1.0 - std::pow(miss, tokens);
}

uint64_t LlamaResidentParams(const LlamaShape& s) {
  const uint64_t emb = static_cast<uint64_t>(s.vocab_size) * s.hidden_size;
  return emb * (s.tie_word_embeddings ? 1 : 2) + s.hidden_size;
}

uint64_t LlamaTotalParams(const LlamaShape& s) {
  if (s.num_experts == 0) return s.num_hidden_layers * LlamaLayerParams(s) + LlamaResidentParams(s);
  uint64_t n = LlamaResidentParams(s);
  for (int64_t l = 0; l < s.num_hidden_layers; ++l) n += LlamaLayerParams(s, l);
  return n;
}

uint64_t LlamaLargestLayerTensor(const LlamaShape& s) {
  uint64_t most = 0;
  for (uint64_t x : LlamaLayerTensorNumels(s)) most = std::max(most, x);
  if (s.num_experts > 0 && SparseLayerCount(s) < s.num_hidden_layers) {
    most = std::max(most, static_cast<uint64_t>(s.hidden_size) * s.intermediate_size);
  }
  return most;
}

}  // namespace strata::runtime
