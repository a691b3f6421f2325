// ModelSpec: what `--model` and `--seq-len` name, resolved once for every command (train, eval,
// estimate, bench), without libtorch; and PlanInputFor, the memory plan's input for a spec under a
// config, so `strata estimate` plans exactly what `strata train` allocates.
//
//   ModelSpec spec = ResolveModel("/models/Llama-3.2-1B", /*seq_len=*/0,
//   Weights::kRequired).value(); spec.seq_len;                                      //
//   kDefaultLlamaSeqLen: no --seq-len given PlanInput in = PlanInputFor(spec, config, /*world=*/1,
//   /*rank=*/0);
//
// The one resolution order: an existing directory is read as a Hugging Face model (config.json,
// and its safetensors weights: required to train, optional to estimate); otherwise a GPT preset
// (tiny, small, 125M ...), otherwise a Llama-family preset (llama-tiny, llama-3.2-1b ...). A
// directory named like a preset wins: the user made it.
//
// The one default sequence length: a GPT preset's own (its position table), kDefaultLlamaSeqLen
// for the Llama family. A GPT preset's position table follows --seq-len.
//
// A tied config over weights that hold a distinct lm_head.weight is untied, as transformers 5 does
// (4.47 tied it) (UntieADistinctHead), here, so every command sees the same head.
//
// Threads: pure functions (ResolveModel reads files). Errors: NotFound (no such preset or
// directory, no config.json, no weights where required), InvalidArgument (a file, not a
// directory; a config.json strata cannot train), each naming the path.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "base/status.h"
#include "runtime/config/config.h"
#include "runtime/persist/hf_checkpoint.h"
#include "runtime/plan/llama_shape.h"
#include "runtime/plan/memory_plan.h"
#include "runtime/plan/model_presets.h"

namespace strata::runtime {

// Sequence length of a Llama-family model when --seq-len is not given.
inline constexpr int kDefaultLlamaSeqLen = 512;

enum class Weights { kRequired, kOptional };

// Move-only (it owns the opened weights).
struct ModelSpec {
  std::string name;             // the model's name: the preset's, or the directory's last part
  std::optional<GptShape> gpt;  // exactly one of gpt and llama is set
  std::optional<LlamaShape> llama;
  std::string hf_dir;        // the Hugging Face directory read; "" for presets
  nlohmann::json hf_config;  // its config.json (tie_word_embeddings false when untied)
  std::unique_ptr<HfCheckpoint> checkpoint;  // its weights; null for presets (and kOptional)
  int seq_len = 0;  // the run's sequence length (the flag, else the default)

  std::string family() const { return gpt ? "gpt" : "llama"; }
  // The preset names, for error messages: "GPT presets: ...; Llama-family presets: ...".
  static std::string PresetNames();
};

// Resolves `model` (see the file comment) at `seq_len` (> 0: the flag; 0: the model's default).
[[nodiscard]] Result<ModelSpec> ResolveModel(const std::string& model, int seq_len,
                                             Weights weights);

// Model-independent settings a DeepSpeed config gives the memory plan: the compute precision,
// the optimizer state per element, the micro-batch and the offload buffers (DeepSpeed's keys, as
// the engine reads them: engine/initialize.cc takes its buffers from here too).
struct PlanSettings {
  int compute_bytes = 4;               // 2 with fp16 or bf16
  std::string dtype = "fp32";          // "fp32", "bf16", "fp16"
  std::optional<int> state_bytes;      // with an optimizer section: master + moments per element
  std::optional<int> micro_batch;      // train_micro_batch_size_per_gpu when given
  int param_buffer_count = 5;          // offload_param.buffer_count
  uint64_t param_buffer_size = 0;      // offload_param.buffer_size; 0: not given
  uint64_t max_in_cpu = 0;             // offload_param.max_in_cpu; 0: not given
  int optimizer_buffer_count = 4;      // offload_optimizer.buffer_count
  bool pipeline = false;               // offload_optimizer.pipeline_read || pipeline_write
  uint64_t sub_group_size = 0;         // zero_optimization.sub_group_size
  uint64_t persistence_threshold = 0;  // stage3_param_persistence_threshold
  // min(stage3_prefetch_bucket_size, stage3_max_live_parameters)
  uint64_t device_prefetch_elements = 50'000'000;
};
PlanSettings PlanSettingsFor(const Config& config);

// The memory plan's input for `spec` at `micro_batch` and `compute_bytes` under `settings`: its
// units (the model's layers) and resident group cut into sub-groups, this rank's slices of them
// over `world` ranks, its activations at micro_batch × spec.seq_len, the offload buffers.
// params/optimizer homes and io_align keep PlanInput's defaults (the caller places them).
PlanInput PlanInputFor(const ModelSpec& spec, const PlanSettings& settings, int micro_batch,
                       int compute_bytes, int world, int rank = 0);

// The offload buffers and optimizer state size of `settings` into `in` (what PlanInputFor sets
// beyond the model's layout, for a layout given by counts).
void ApplyPlanSettings(const PlanSettings& settings, PlanInput* in);

// DeepSpeed's L for the estimator: the largest parameter count of one leaf module.
uint64_t LargestLeafParams(const ModelSpec& spec);
// Every parameter of the model.
uint64_t TotalParams(const ModelSpec& spec);

}  // namespace strata::runtime
