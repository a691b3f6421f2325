// Trainer: the step loop of `strata train` and the evaluation of `strata eval`, apart from how they
// are shown. It trains a model from the registry (runtime/models/causal_lm.h: the byte-level GPT
// presets, the Llama-family presets, a Hugging Face model directory) with the engine as a
// DeepSpeed config says, and reports each step through a callback; it prints nothing (it logs
// set-up and checkpoints through base/logging.h). train_command.cc and eval_command.cc render the
// reports; tests read them.
//
// Data (runtime/data/training_data.h): GPT models read bytes of a text file (text_data.h there).
// Llama-family models read token ids (token_data.h: .bin, .jsonl, .txt tokenized with the model's
// tokenizer.model) in packed windows of seq_len + 1 tokens (windows.h); a Llama preset without
// --data reads the default text's bytes as token ids. A .jsonl of prompt/completion records
// (sft_data.h; any model) trains on the completion tokens only: a step's loss is the sum of its
// global batch's token losses over the number of completion tokens in it (as transformers'
// Trainer does with num_items_in_batch), so every split of the batch gives the same numbers.
//
//   TrainerOptions o;  o.model = "tiny";  o.config = "ds.json";  o.data = "text.txt";  o.steps =
//   10; auto trainer = Trainer::Create(o).value(); RunSummary s = trainer->Run([](const StepReport&
//   r) { ... }, &stop).value(); if (!o.save.empty()) CHECK_OK(trainer->Save());
//
// A step is gradient_accumulation_steps micro-batches of train_micro_batch_size_per_gpu rows
// (forward, engine Backward each), then the engine's Step. Micro-batches come from the
// TrainingData, so the data position is the count of micro-batches consumed. Checkpoints
// (options.save, checkpointing.h): DIR/step-N/ via CheckpointWriter (engine state + trainer.json
// with step, data position, seed and model), the `latest` pointer, the two newest kept, and
// DIR/model.safetensors (consolidated fp32 weights); for Llama-family models DIR/hf/, a Hugging
// Face directory (Export, model_export.h). A run resumed from a checkpoint (options.resume)
// continues bitwise as the straight run would have.
//
// Errors: every failure is a Status. An exception out of the model's forward (a unit's gather
// failed, e.g. an NVMe read error) becomes the Status the engine put in it
// (Engine::ErrorFromException), so its code and message survive the libtorch boundary.
//
// Threads: one thread calls Create, Run and Save (the engine's training thread). `stop` may be
// set from any thread or a signal handler.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "runtime/commands/evaluator.h"
#include "runtime/commands/model_export.h"
#include "runtime/config/config.h"
#include "runtime/engine/test_hooks.h"

namespace strata::runtime {

class CausalLm;
class Engine;

// The process's peak resident set size so far (VmHWM), in bytes; 0 if unknown.
uint64_t PeakResidentBytes();

// libtorch's intra-op pool is GNU OpenMP, whose idle threads spin (GOMP_SPINCOUNT: up to ~0.3 s
// of busy-waiting) between parallel regions, taking the cores strata's own threads need (I/O
// completions, copy streams, the CPU optimizer): on 2 cores the default --threads trained 2.2x
// slower than --threads 1. libgomp reads OMP_WAIT_POLICY once, when it is loaded (before main),
// so a command that is about to compute calls this first: unless the user set OMP_WAIT_POLICY or
// GOMP_SPINCOUNT, it sets OMP_WAIT_POLICY=PASSIVE and re-executes the same command line (same
// pid, ~0.4 s of start-up). Returns only when nothing was re-executed.
void RestartWithPassiveOpenMpWaiting();

struct TrainerOptions {
  TestHooks test_hooks;  // faults a test asks for (test_hooks.h; `strata train` reads them)
  std::string config;    // DeepSpeed JSON file; empty: the demo's, NVMe under /tmp/strata-demo-UID
  std::string model = "small";  // GPT preset, Llama preset or Hugging Face directory
  std::string data;             // text or token file; empty: the fortunes texts (text_data.h)
  std::string data_dtype;       // .bin element type: "" (by vocab), "uint16", "uint32"
  // SFT records (runtime/data/sft_data.h): packed into windows instead of one padded per row.
  bool packing = false;
  int64_t steps = 120;  // optimizer steps to reach, resumed ones included (0: none)
  // The config when `config` is empty: the demo's (NVMe offload under a scratch directory) or,
  // with no_offload_default, no offload at all (`strata eval`).
  bool no_offload_default = false;
  // The engine for inference (EngineOptions::inference: `strata eval`, `strata generate`): the
  // parameters at the config's offload_param, no gradients, no optimizer state; Run is then
  // refused. With `resume` the engine is a training one (a checkpoint restores into the optimizer
  // state's fp32 masters), as the log says.
  bool inference = false;
  // No training data (`strata generate`): `data` is not read and Evaluate is refused.
  bool no_data = false;
  // > 0 (--epochs): `steps` is derived from the data: ceil(epochs × samples per epoch / global
  // batch), samples per epoch being TrainingData::Windows (a global batch that straddles two
  // epochs takes the rest of its rows from the next epoch's order, so every sample is seen
  // `epochs` times when epochs is whole).
  double epochs = 0;
  std::string save;               // checkpoint directory; empty: none
  int64_t save_every = 0;         // Run saves after every such step but the last (Save does that)
  bool save_every_epoch = false;  // also after each step that completes an epoch
  int save_total_limit = 2;       // checkpoints of this run kept (the newest; plus the best)
  // Evaluation during training (--eval-data: same formats as `data`): after every eval_every
  // steps (or each epoch) and after the last step, at most eval_max_batches batches (0: all).
  std::string eval_data;
  int64_t eval_every = 0;
  bool eval_every_epoch = false;
  int64_t eval_max_batches = 0;
  // --save-best: a checkpoint is written after each evaluation that improves on the best eval
  // loss so far, and kept however many newer ones follow (REQUIRES: save and eval_data).
  bool save_best = false;
  std::string resume;  // checkpoint to continue from (ROOT or ROOT/TAG); empty: fresh
  // How Save writes DIR/hf/ for Hugging Face and Llama-family models (--export-dtype and
  // --max-shard-size, as --export).
  std::string save_export_dtype;
  std::string save_max_shard_size = "5GB";
  // Save into a --save directory holding another run's checkpoints (save_dir.h); they are kept.
  bool overwrite_save = false;
  // Set (by a signal handler) to stop: Create checks it between its phases and before each unit
  // it initializes or loads (kCancelled, "interrupted while ..."), Run before each step, Export
  // before each tensor. Null: never stops.
  const std::atomic<bool>* stop = nullptr;
  std::string trace;              // Chrome trace file of `trace_steps`; empty: no trace
  std::string trace_steps = "2";  // "N" or "A-B", 1-based steps
  int seq_len = 0;                // > 0: the sequence length; 0: the model's (ResolveModel)
  // Where the model computes (--device): "host" (the emulated device; libtorch on the CPU),
  // "cuda" / "cuda:N" (a GPU: libtorch on CUDA, parameters gathered into its memory), or "auto"
  // (cuda:0 when a GPU is visible, else host; the log says which).
  std::string device = "auto";
  // The device memory strata's parameter copies may take ("0": host: all of them fit; a GPU: its
  // free memory less the activations' estimate and 1 GiB for libtorch's workspace).
  std::string device_memory = "0";
  // --host-memory: "auto", a size (the pinned arena's cap and the host-RAM tier's budget) or "0"
  // (none); empty: not given (strata.host_memory, else none). See ResolveHostMemory.
  std::string host_memory;
  int threads = 0;       // compute and optimizer threads; 0: every core
  uint64_t seed = 1234;  // initialization and data order
  // Mixtures of experts: each expert its own offload unit (--page-experts, LlamaShape).
  bool page_experts = false;
  // What answers the config's "auto" values (the train command's flags, training_flags.h); the
  // Trainer adds the model's hidden size and `steps`. `given`: the values the user set.
  AutoValues auto_values = DefaultAutoValues();
  AutoValues given;
};

// One optimizer step, as it happened.
struct StepReport {
  int64_t step = 0;   // steps done, this one included
  int64_t steps = 0;  // the goal, TrainerOptions::steps
  double loss = 0;    // mean over the step's micro-batches (unscaled)
  double lr = 0;      // the learning rate this step applied
  double tokens = 0;  // tokens consumed by the step
  double tokens_per_second = 0;
  // The optimizer's updates of offloaded units run while the next step's forward computes
  // (EngineOptions::defer_optimizer); the time that step waits for them (optimizer_wait_seconds)
  // is counted in its optimizer_seconds, not its forward_seconds/backward_seconds.
  double step_seconds = 0, forward_seconds = 0, backward_seconds = 0, optimizer_seconds = 0;
  double optimizer_wait_seconds = 0;
  double grad_norm = 0;  // the global gradient norm, before clipping (last applied step's)
  // Epochs of training data consumed after the step, as Hugging Face's Trainer logs it:
  // samples consumed / samples per epoch (fractional; 0 when the data has no epochs).
  double epoch = 0;
  // Set on the steps after which the run evaluated its --eval-data: that evaluation's result.
  std::optional<EvalReport> eval;
  // Seconds since Run started (the ETA is the printer's: steps left × the recent step time).
  double elapsed_seconds = 0;
  double loss_scale = 1;  // fp16: the loss scale this step's backward ran with; else 1
  bool skipped = false;   // fp16: gradients overflowed, the step changed no parameter
  uint64_t nvme_read_bytes = 0, nvme_written_bytes = 0;  // by this step
  // --page-experts: of nvme_read_bytes, the experts read ahead of their routing by the router's
  // history, and those the routing then did not use (Engine::speculative_reads).
  uint64_t speculative_read_bytes = 0, speculative_wasted_bytes = 0;
  uint64_t read_retries = 0;  // reads that failed and were done again (each logged) this step
  // Offload units the step's optimizer updated (every unit: an expert no token reached steps on a
  // zero gradient), and those some token reached (with --page-experts, each layer's attention and
  // the experts routed to); -1 without offload.
  int64_t units_updated = -1;
  int64_t units_routed = -1;
  // Page faults the whole process took during the step (getrusage, all threads): minor ones are
  // mostly first touches of newly mapped memory.
  uint64_t minor_faults = 0, major_faults = 0;
  // Tier occupancy after the step.
  uint64_t device_used_bytes = 0, device_budget_bytes = 0, device_peak_bytes = 0;
  std::string device;  // where the model computes: "host", "cuda:0 (NVIDIA H100 ...)"
  uint64_t pinned_used_bytes = 0, pinned_capacity_bytes = 0;
  // The engine's wait timers (what wall_clock_breakdown shows).
  double gather_wait_seconds = 0, grad_wait_seconds = 0, engine_optimizer_seconds = 0;
};

struct RunSummary {
  int64_t step = 0;          // steps done, resumed ones included
  double first_loss = 0;     // loss of this run's first step (NaN if it ran none)
  bool interrupted = false;  // `stop` ended the run before TrainerOptions::steps
};

class Trainer {
 public:
  // Loads the config and the text, builds the model and the engine, and restores options.resume.
  // InvalidArgument/NotFound for bad options, config or data; the engine's errors otherwise.
  static Result<std::unique_ptr<Trainer>> Create(const TrainerOptions& options);
  ~Trainer();  // closes the engine, then removes the demo's scratch directory
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Runs steps until TrainerOptions::steps are done or `stop` (may be null) is set, which is
  // checked between steps. After each step: evaluates eval_data when due (the result goes into
  // the step's report), calls `on_step`, then saves if the step is a multiple of save_every,
  // completes an epoch (save_every_epoch) or improved the best eval loss (save_best). Does not
  // save at the end: call Save, also after an interrupted run. A failed
  // step ends the run with its Status; the trainer is then only good for destruction.
  Result<RunSummary> Run(const std::function<void(const StepReport&)>& on_step,
                         const std::atomic<bool>* stop);

  // Writes a checkpoint of the current step to TrainerOptions::save (nothing when this step was
  // saved already), then removes this run's checkpoints beyond save_total_limit, never the best.
  // REQUIRES: save not empty, between steps.
  Status Save();

  // Writes the current weights as a Hugging Face directory (Llama-family models only): config.json
  // (the input's, torch_dtype set), safetensors shards of at most max_shard_size with
  // model.safetensors.index.json, tensors named as the input's and in its dtypes (or
  // options.dtype), the tokenizer files of the input directory copied. Streams unit by unit.
  // REQUIRES: between steps.
  Status Export(const ExportOptions& options);
  // What Export would refuse before writing anything (a GPT model, a bad dtype or shard size), so
  // a run can fail before training rather than after.
  Status CheckExport(const ExportOptions& options) const;

  // Mean next-token loss over consecutive windows of seq_len + 1 tokens of the data (the training
  // data for `strata eval`; TrainerOptions::eval_data during training: see Run) (batches of
  // train_micro_batch_size_per_gpu windows, at most max_batches of them if > 0), computed through
  // the engine without gradients. A batch whose loss is not finite ends it with
  // kFailedPrecondition naming the first parameter that holds a NaN or an infinity.
  // REQUIRES: between steps.
  Result<EvalReport> Evaluate(int64_t max_batches);

  // The model and its engine (`strata generate` computes with them), and where libtorch computes.
  CausalLm& model();
  Engine& engine();
  c10::Device torch_device() const;
  // "host (emulated; ...)" or the GPU's description.
  std::string device_description() const;
  // An error out of libtorch during `phase` (already taken through Engine::ErrorFromException),
  // as the Trainer reports its own (a GPU out of memory names the settings that shrink it).
  Status ComputeError(const std::string& phase, Status s);

  const Config& config() const;
  int64_t step() const;   // steps done, resumed ones included
  int64_t steps() const;  // the goal: TrainerOptions::steps, or what --epochs derived
  // The best evaluation so far (--save-best): its step, eval loss and checkpoint tag; nullopt
  // before the first evaluation.
  struct Best {
    int64_t step = 0;
    double eval_loss = 0;
    std::string tag;  // empty until saved
  };
  std::optional<Best> best() const;
  int seq_len() const;
  // What the run was planned for, as `strata estimate --json` reports it for the same flags:
  // seq_len, micro_batch, and with offload the layout (units, unit_params, resident_params) and
  // pinned_arena_bytes. Written into every --log-json record.
  nlohmann::json PlanFacts() const;
  std::string model_description() const;

 private:
  struct Impl;
  explicit Trainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::runtime
