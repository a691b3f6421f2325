// CausalLm: what the Trainer and `strata eval` need of a model, whichever it is, and OpenModel,
// the registry that builds one from `--model` (a GPT preset, a Llama-family preset, or a Hugging
// Face model directory).
//
//   ModelOptions mo;  mo.spec = "/models/Llama-3.2-1B";  mo.seed = 1234;
//   auto lm = OpenModel(mo).value();                       // parameters allocated, not filled
//   InitializeOptions io;  io.initialize_unit = lm->UnitInitializer();
//   auto engine = Initialize(lm->module(), config, io).value();   // fills each unit as it takes it
//   torch::Tensor loss = lm->Loss(inputs, targets);
//
// Deferred initialization (ARCHITECTURE.md §5): OpenModel fills only the parameters outside the
// offload units (embeddings, final norm, head); each unit's parameters are allocated but not
// written (their pages are not resident) until the engine calls UnitInitializer() for that unit
// just before it copies the unit out, so host memory holds a few units at a time, never the model.
// Values come from the checkpoint's shards (read straight into the parameter tensors, upcast to
// fp32), or, for presets, from a generator seeded by (seed, parameter name): the values do not
// depend on the order in which units are taken, so every offload mode starts from the same model.
//
// Threads: one thread (the training thread). Errors: Status; OpenModel refuses a checkpoint whose
// tensors do not match the config (missing, extra, wrong shape, unreadable) before any training,
// naming the file and the tensor.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/plan/memory_plan.h"
#include "runtime/plan/model_spec.h"

namespace strata::runtime {

class CausalLm {
 public:
  virtual ~CausalLm() = default;

  virtual std::shared_ptr<torch::nn::Module> module() = 0;
  // logits [B, T, vocab] for token ids [B, T] (int64).
  virtual torch::Tensor Logits(const torch::Tensor& ids) = 0;
  // Generation: logits of ids [B, T] at positions offset .. offset + T - 1, the earlier positions
  // being in every attention layer's KV cache (SetKvCaching(true) and the forwards before).
  // Families without a cache (supports_kv_cache() false) take only offset 0: generation then
  // recomputes the whole sequence each token.
  virtual torch::Tensor LogitsAt(const torch::Tensor& ids, int64_t position_offset);
  virtual bool supports_kv_cache() const { return false; }
  // Generation with a KV cache rebuilds the cache once, over the whole sequence, when the sequence
  // first grows to this many tokens plus one (0: never): Phi-3's longrope switches from the short
  // to the long factors past original_max_position_embeddings, and transformers
  // (Phi3ForCausalLM.prepare_inputs_for_generation) then drops the cache computed with the short
  // ones.
  virtual int64_t kv_cache_rebuild_length() const { return 0; }
  // Turns every attention layer's KV cache (models/attention.h CachingAttention) on, empty, or
  // off, freeing it.
  void SetKvCaching(bool on);
  // What the model adds to the cross-entropy of the last Logits call's tokens (a scalar, fp32,
  // in that call's graph): a mixture of experts' router_aux_loss_coef × load-balancing loss when
  // its config has output_router_logits (models/moe.h); undefined for every other model.
  virtual torch::Tensor AuxiliaryLoss() { return torch::Tensor(); }
  // Mean next-token cross-entropy (nats, fp32) of predicting targets [B, T] from ids [B, T], plus
  // AuxiliaryLoss() (transformers' loss with labels).
  torch::Tensor Loss(const torch::Tensor& ids, const torch::Tensor& targets);

  // Writes unit `unit`'s initial values into its parameter tensors (see the file comment).
  virtual Status InitializeUnit(int unit) = 0;
  // For InitializeOptions::initialize_unit. REQUIRES: this model outlives the engine's creation.
  std::function<Status(int)> UnitInitializer() {
    return [this](int unit) { return InitializeUnit(unit); };
  }
  virtual int num_units() const = 0;

  // "gpt" or "llama" (the family); a one-line description for logs.
  virtual std::string family() const = 0;
  virtual std::string Describe() const = 0;
  virtual uint64_t num_parameters() const = 0;
  virtual int64_t vocab_size() const = 0;
  // Longest sequence the model accepts (GPT: its position table; Llama: its sliding window if it
  // has one, else no limit: the config's max_position_embeddings is advisory, as in transformers).
  virtual int64_t max_seq_len() const = 0;
  // Width of the hidden state (what "auto" hidden_size answers).
  virtual int64_t hidden_size() const = 0;
  // Activation bytes of one micro-batch of `micro_batch` sequences of `seq_len` tokens at
  // `compute_bytes` per value (runtime/plan/memory_plan.h's count; saturates, never wraps), so a
  // run can refuse a batch that cannot fit before allocating it.
  virtual ActivationBytes Activations(int micro_batch, int seq_len, int compute_bytes) const = 0;

  // The Hugging Face directory it was loaded from, or empty (presets).
  virtual std::string hf_dir() const { return {}; }
  // config.json of an export (the input's, or one written for a preset); null for GPT models.
  virtual nlohmann::json HfConfig() const { return nullptr; }
  // The dtype each tensor is exported in by default ("F32", "BF16", "F16"): the input
  // checkpoint's dtype of that tensor, or the preset's torch_dtype.
  virtual std::string ExportDtype(const std::string& name) const { return "F32"; }
  // Model identity saved in checkpoints (trainer.json), compared on resume.
  virtual nlohmann::json Identity() const = 0;
};

struct ModelOptions {
  std::string spec = "small";  // GPT preset, Llama preset, or a Hugging Face model directory
  uint64_t seed = 1234;        // random initialization of presets
  int64_t seq_len = 0;         // > 0: --seq-len (a GPT preset's position table follows it)
  // Fill every unit at once (for a model used without an engine, e.g. tests); otherwise units
  // are filled through UnitInitializer.
  bool eager = false;
};

// Builds the model `options.spec` names, resolved by ResolveModel (runtime/plan/model_spec.h: a
// directory is a Hugging Face model, else a GPT preset, else a Llama-family preset; its weights
// are required). NotFound lists the presets when nothing matches.
Result<std::unique_ptr<CausalLm>> OpenModel(const ModelOptions& options);
// The same for a spec already resolved (its weights, if any, are moved into the model).
Result<std::unique_ptr<CausalLm>> OpenModel(ModelSpec spec, uint64_t seed, bool eager = false);

// Mean cross-entropy of logits [B, T, vocab] against targets [B, T], in fp32 whatever the
// compute dtype (bf16 logits are widened exactly).
torch::Tensor NextTokenLoss(const torch::Tensor& logits, const torch::Tensor& targets);

// A generator for the parameter `name` under `seed` (the same values in any initialization order).
at::Generator NamedGenerator(uint64_t seed, const std::string& name);

}  // namespace strata::runtime
