// Generate: what `strata generate` computes, the continuation of a prompt by a causal LM whose
// parameters the engine pages in (runtime/engine: an inference engine, weights at the config's
// offload_param), one forward per new token.
//
// Decoding follows transformers' model.generate for one sequence:
//   - the prompt in one forward (prefill), then one forward per new token on the KV cache
//     (CausalLm::SetKvCaching + LogitsAt); a family without a cache (supports_kv_cache() false:
//     the GPT presets) recomputes the whole sequence for every token instead, with the same ids;
//   - temperature 0: greedy (do_sample=False): the argmax of the last position's logits, the
//     lowest id on ties (torch.argmax's);
//   - temperature > 0: sampling (do_sample=True) of softmax(logits / temperature) after
//     TopPLogitsWarper(top_p) (sorted ascending, the tokens whose cumulative probability is at
//     most 1 - top_p are removed, the most probable token always kept; top_p 1 keeps every token),
//     with torch.multinomial under a CPU generator seeded by `seed`. transformers' default top_k
//     of 50 is not applied (there is no top-k: as top_k=0). Logits are taken to the CPU in fp32
//     before choosing, so a seed gives the same tokens on every device and in every offload mode
//     whose logits are the same;
//   - it stops after max_new_tokens, at an id in `eos_ids` (which is kept, as transformers keeps
//     it), or when the sequence reaches `context` tokens.
//
// Errors: Status; an exception out of the model's forward becomes the engine's Status
// (Engine::ErrorFromException), then `compute_error` of it. Ownership: Generation borrows what it
// points to. Threads: the engine's training thread.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"

namespace strata::runtime {

class CausalLm;
class Engine;

struct Generation {
  Engine* engine = nullptr;  // holds the model's parameters
  CausalLm* lm = nullptr;
  c10::Device device = c10::kCPU;  // where the model computes (the ids are moved there)
  std::vector<int64_t> prompt;     // REQUIRES: not empty, shorter than `context`
  int64_t max_new_tokens = 1;      // REQUIRES: >= 1
  double temperature = 0;          // 0: greedy; > 0: sampling
  double top_p = 1;                // (0, 1]; sampling only
  uint64_t seed = 0;               // sampling only
  std::vector<int64_t> eos_ids;    // stop at any of them; empty: none known
  int64_t context = 0;             // the longest sequence the model takes (prompt + new tokens)
  // What an error out of libtorch's forward (taken through Engine::ErrorFromException) becomes,
  // given the phase; null: itself.
  std::function<Status(const std::string& phase, Status)> compute_error;
};

struct GenerationReport {
  std::vector<int64_t> ids;     // the new tokens (an EOS that stopped it included)
  std::string stop_reason;      // "max_new_tokens", "eos" or "context"
  bool kv_cache = false;        // one token per forward (else the sequence was recomputed)
  double prefill_seconds = 0;   // the prompt's forward and the first token's choice
  double decode_seconds = 0;    // the forwards and choices of the other new tokens
  int64_t decode_forwards = 0;  // forwards after the prompt's (new tokens - 1)
  // Times the KV cache was rebuilt over the whole sequence (CausalLm::kv_cache_rebuild_length).
  int64_t cache_rebuilds = 0;
  // Bytes the engine read from NVMe (Engine::telemetry: parameters paged in; 0 unless
  // offload_param is nvme) during the prefill and during the decode forwards.
  uint64_t prefill_nvme_read_bytes = 0;
  uint64_t decode_nvme_read_bytes = 0;
};

// Generates as the file comment says.
Result<GenerationReport> Generate(const Generation& g);

}  // namespace strata::runtime
