// A tiny Llama checkpoint written by hand (safetensors of pseudo-random fp32 weights, norms 1,
// and its config.json), without libtorch: for the integration tests that train a SentencePiece
// tokenizer in-process, which cannot share a process with libtorch (Note [SentencePiece is loaded
// apart] in runtime/data/sentencepiece_shim.h).
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace strata::testing {

inline constexpr int64_t kTinyLlamaHidden = 32, kTinyLlamaInter = 64, kTinyLlamaLayers = 2,
                         kTinyLlamaHeads = 4, kTinyLlamaKv = 2;

// A Llama checkpoint of pseudo-random fp32 weights (norms 1), written as safetensors by hand.
inline void WriteTinyLlama(const std::string& dir, int64_t vocab) {
  const int64_t hd = kTinyLlamaHidden / kTinyLlamaHeads;
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors = {
      {"model.embed_tokens.weight", {vocab, kTinyLlamaHidden}},
      {"model.norm.weight", {kTinyLlamaHidden}},
      {"lm_head.weight", {vocab, kTinyLlamaHidden}}};
  for (int l = 0; l < kTinyLlamaLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    tensors.push_back({p + "input_layernorm.weight", {kTinyLlamaHidden}});
    tensors.push_back({p + "post_attention_layernorm.weight", {kTinyLlamaHidden}});
    tensors.push_back({p + "self_attn.q_proj.weight", {kTinyLlamaHeads * hd, kTinyLlamaHidden}});
    tensors.push_back({p + "self_attn.k_proj.weight", {kTinyLlamaKv * hd, kTinyLlamaHidden}});
    tensors.push_back({p + "self_attn.v_proj.weight", {kTinyLlamaKv * hd, kTinyLlamaHidden}});
    tensors.push_back({p + "self_attn.o_proj.weight", {kTinyLlamaHidden, kTinyLlamaHeads * hd}});
    tensors.push_back({p + "mlp.gate_proj.weight", {kTinyLlamaInter, kTinyLlamaHidden}});
    tensors.push_back({p + "mlp.up_proj.weight", {kTinyLlamaInter, kTinyLlamaHidden}});
    tensors.push_back({p + "mlp.down_proj.weight", {kTinyLlamaHidden, kTinyLlamaInter}});
  }
  nlohmann::json header;
  std::vector<float> data;
  uint32_t x = 7;
  for (const auto& [name, shape] : tensors) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const uint64_t begin = data.size() * 4;
    for (int64_t i = 0; i < n; ++i) {
      x = x * 1664525u + 1013904223u;
      const float r = (static_cast<float>(x >> 8) / 16777216.0f - 0.5f) * 0.2f;
      data.push_back(name.ends_with("norm.weight") ? 1.0f : r);
    }
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size() * 4}}};
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  std::ofstream out(dir + "/model.safetensors", std::ios::binary);
  const uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  out.write(reinterpret_cast<const char*>(data.data()),
            static_cast<std::streamsize>(data.size() * 4));
  nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                           {"model_type", "llama"},
                           {"vocab_size", vocab},
                           {"hidden_size", kTinyLlamaHidden},
                           {"intermediate_size", kTinyLlamaInter},
                           {"num_hidden_layers", kTinyLlamaLayers},
                           {"num_attention_heads", kTinyLlamaHeads},
                           {"num_key_value_heads", kTinyLlamaKv},
                           {"rms_norm_eps", 1e-5},
                           {"rope_theta", 10000.0},
                           {"hidden_act", "silu"},
                           {"tie_word_embeddings", false},
                           {"torch_dtype", "float32"}};
  std::ofstream(dir + "/config.json") << config.dump(2);
}

}  // namespace strata::testing
