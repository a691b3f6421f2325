// Generate: see generator.h. The loop: prefill (the prompt, one forward), then per new token one
// forward of that token alone on the KV cache (or of the whole sequence without one), each
// followed by the choice of the next token from the last position's logits on the CPU in fp32.
// The cache is turned on before the prefill and off (freed) on every way out.
#include "runtime/commands/generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "base/clock.h"
#include "base/trace.h"
#include "runtime/engine/engine.h"
#include "runtime/models/causal_lm.h"

namespace strata::runtime {
namespace {

// transformers' TopPLogitsWarper (min_tokens_to_keep 1) on one row of scores: the tokens whose
// cumulative probability, summed from the least probable up, is at most 1 - top_p are set to
// -inf.
torch::Tensor TopP(const torch::Tensor& scores, double top_p) {
  auto [sorted, order] = scores.sort(/*dim=*/-1, /*descending=*/false);
  torch::Tensor remove = sorted.softmax(-1).cumsum(-1) <= (1.0 - top_p);
  remove.index_put_({-1}, false);  // the most probable token stays
  remove = remove.scatter(0, order, remove);
  return scores.masked_fill(remove, -std::numeric_limits<float>::infinity());
}

// The next token from the last position's logits [vocab] (CPU, fp32).
int64_t ChooseToken(const torch::Tensor& logits, const Generation& g, at::Generator& rng) {
  if (g.temperature == 0) return logits.argmax().item<int64_t>();
  torch::Tensor scores = logits / g.temperature;  // TemperatureLogitsWarper
  if (g.top_p < 1) scores = TopP(scores, g.top_p);
  return torch::multinomial(scores.softmax(-1), 1, /*replacement=*/false, rng).item<int64_t>();
}

// Turns the model's KV cache on for one generation and off (freed) when it ends.
class KvCacheScope {
 public:
  KvCacheScope(CausalLm& lm, bool on) : lm_(lm), on_(on) {
    if (on_) lm_.SetKvCaching(true);
  }
  ~KvCacheScope() {
    if (on_) lm_.SetKvCaching(false);
  }
  KvCacheScope(const KvCacheScope&) = delete;
  KvCacheScope& operator=(const KvCacheScope&) = delete;

 private:
  CausalLm& lm_;
  bool on_;
};

}  // namespace

Result<GenerationReport> Generate(const Generation& g) {
  if (g.prompt.empty() || g.max_new_tokens < 1) {
    return InvalidArgumentError("Generate: an empty prompt or no new token to generate");
  }
  GenerationReport r;
  r.kv_cache = g.lm->supports_kv_cache();
  at::Generator rng = at::detail::createCPUGenerator(g.seed);
  std::vector<int64_t> sequence = g.prompt;
  torch::NoGradGuard no_grad;
  KvCacheScope cache(*g.lm, r.kv_cache);
  const int64_t rebuild = g.lm->kv_cache_rebuild_length();
  // The logits of the last position after feeding `ids` (the new part with a cache, the whole
  // sequence without) at `offset`.
  auto last_logits = [&](const std::vector<int64_t>& ids, int64_t offset) {
    torch::Tensor x =
        torch::tensor(ids, torch::kLong).reshape({1, static_cast<int64_t>(ids.size())});
    if (!g.device.is_cpu()) x = x.to(g.device);
    const torch::Tensor logits = r.kv_cache ? g.lm->LogitsAt(x, offset) : g.lm->Logits(x);
    // The layers' order is recorded on the first forward and prefetched along on the next ones;
    // the first layers of the next forward start moving while this token is chosen.
    g.engine->EndForward();
    return logits.index({0, -1}).to(torch::kCPU, torch::kFloat32);
  };
  try {
    const uint64_t read_at_start = g.engine->telemetry().nvme_to_pinned;
    Stopwatch prefill;
    int64_t next = 0;
    {
      TraceSpan span("compute", "generate prefill");
      next = ChooseToken(last_logits(sequence, 0), g, rng);
    }
    r.prefill_seconds = prefill.Seconds();
    const uint64_t read_after_prefill = g.engine->telemetry().nvme_to_pinned;
    r.prefill_nvme_read_bytes = read_after_prefill - read_at_start;
    Stopwatch decode;
    while (true) {
      r.ids.push_back(next);
      sequence.push_back(next);
      if (std::find(g.eos_ids.begin(), g.eos_ids.end(), next) != g.eos_ids.end()) {
        r.stop_reason = "eos";
        break;
      }
      if (static_cast<int64_t>(r.ids.size()) >= g.max_new_tokens) {
        r.stop_reason = "max_new_tokens";
        break;
      }
      if (static_cast<int64_t>(sequence.size()) >= g.context) {
        r.stop_reason = "context";
        break;
      }
      TraceSpan span("compute", "generate token");
      const int64_t position = static_cast<int64_t>(sequence.size()) - 1;
      if (r.kv_cache && rebuild > 0 && position == rebuild) {
        // The cache holds keys rotated with the factors of the shorter context (causal_lm.h):
        // the whole sequence again, into a fresh cache, as transformers does.
        g.lm->SetKvCaching(false);
        g.lm->SetKvCaching(true);
        next = ChooseToken(last_logits(sequence, 0), g, rng);
        ++r.cache_rebuilds;
      } else {
        next = ChooseToken(r.kv_cache ? last_logits({next}, position) : last_logits(sequence, 0), g,
                           rng);
      }
      ++r.decode_forwards;
    }
    r.decode_seconds = decode.Seconds();
    // Prefetches the last forward started for a next one that never comes are counted too: what
    // the decode cost the drive.
    r.decode_nvme_read_bytes = g.engine->telemetry().nvme_to_pinned - read_after_prefill;
  } catch (const std::exception& e) {
    g.engine->EndForward();
    Status s = g.engine->ErrorFromException(e);
    return g.compute_error ? g.compute_error("the generation's forward", std::move(s)) : s;
  }
  return r;
}

}  // namespace strata::runtime
