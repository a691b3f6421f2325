// Trainer::Impl: the state of one Trainer (trainer.h), shared by the files that implement it:
// trainer_setup.cc builds it (options, config, model, data, ranks, device, engine, resume) and
// trainer.cc runs the steps over it. Internal to runtime/commands/: include only from those.
//
// Members are set by Init on the training thread and then read (and step/samples advanced) by
// that thread alone; declaration order is destruction order reversed (the engine goes before the
// device it uses and the scratch directory it swaps into).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "base/logging.h"
#include "base/status.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/commands/checkpointing.h"
#include "runtime/commands/demo_scratch.h"
#include "runtime/commands/save_dir.h"
#include "runtime/commands/trainer.h"
#include "runtime/config/config.h"
#include "runtime/data/training_data.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/initialize.h"
#include "runtime/models/causal_lm.h"
#include "runtime/persist/checkpoint_store.h"
#include "runtime/plan/memory_plan.h"
#include "tiers/device.h"

namespace strata::runtime {

struct Trainer::Impl {
  TrainerOptions options;
  // The demo's scratch directory (no --config): before the engine, so it is removed after the
  // engine (and its swap space, which removes its own directory) is gone.
  DemoScratch scratch;
  Config config;
  std::unique_ptr<CausalLm> lm;
  int seq_len = 0;
  std::unique_ptr<TrainingData> data;
  std::unique_ptr<TrainingData> eval_data;  // --eval-data; null without
  // --device: a GPU (null: the engine's own host-emulated device) and where libtorch computes.
  // Declared before the engine, which uses them until it is gone.
  std::unique_ptr<DeviceBackend> device;
  torch::Device torch_device = torch::kCPU;
  std::string device_description = "host";
  std::unique_ptr<Engine> engine;
  // The config's text as parsed (the file's, the demo's, or a resumed checkpoint's): saved with
  // every checkpoint, so that a resume without --config trains with it.
  std::string config_text;
  int64_t step = 0;
  uint64_t samples = 0;     // training samples consumed by all ranks (the global data position)
  int64_t saved_step = -1;  // the step of the last checkpoint this process wrote (-1: none)
  // The last evaluation during training ({"step", "loss", "perplexity"}; null before one) and
  // the best by eval loss (--save-best): both recorded in every checkpoint's trainer.json.
  nlohmann::json last_eval;
  std::optional<Trainer::Best> best;
  int64_t trace_from = -1, trace_to = -1;
  // Data-parallel ranks (torchrun's environment, or `strata train --nproc`): the training
  // thread's process group (the engine's, the loss mean, checkpoints) and the gradient
  // hand-off's. One rank: single-rank communicators.
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<Communicator> grad_comm;
  std::shared_ptr<Communicator> gather_comm;  // the engine's ahead all-gathers (null: none)
  int world = 1;
  int local_ranks = 1;  // ranks on this machine (LOCAL_WORLD_SIZE): they share its host memory
  int local_rank = 0;   // LOCAL_RANK: with ranks on GPUs, the GPU this rank computes on
  int rank = 0;
  // Rank 0 with --save: the directory's lock (held while the run lives) and the run lineage its
  // checkpoints record (save_dir.h).
  SaveDirLock save_lock;
  std::string run_id;
  // --resume's checkpoint, opened (and its manifest checked) once: its lineage, its config and
  // its state are read from it.
  std::optional<CheckpointReader> resume_checkpoint;

  Status Init();
  Status ClaimSaveDir();
  // kCancelled (logged, naming `phase`) once options.stop is set, else OK.
  Status CheckStop(const std::string& phase) const {
    if (options.stop == nullptr || !options.stop->load()) return Status::Ok();
    STRATA_LOG(kWarning) << "interrupted while " << phase << ": stopping (nothing was trained or "
                         << "saved by this run)";
    return CancelledError("interrupted while " + phase);
  }
  Status Connect(const std::optional<DistEnv>& env);
  std::string RunSettings() const;
  // The activations of one micro-batch (the model's estimate at the config's micro-batch, seq_len
  // and compute dtype).
  ActivationBytes MicroBatchActivations() const;
  Status CheckActivationsFit() const;
  // --host-memory / strata.host_memory into io's host budget and host-RAM tier budget.
  Status ResolveHostMemory(InitializeOptions& io) const;
  std::string HostCacheText() const;
  // Opens --device (after the config: a GPU's default budget leaves room for the activations;
  // before the ranks meet: ranks on GPUs connect over NCCL on theirs). With ranks, `cuda` and
  // `auto` mean the GPU of LOCAL_RANK.
  Status OpenComputeDevice();
  Status LoadData();
  // The training or evaluation data at `path` (`flag` names it in messages), as the model reads
  // it: bytes of a text for GPT models and Llama presets without data, else token ids.
  Result<std::unique_ptr<TrainingData>> OpenData(const std::string& path,
                                                 const std::string& flag) const;
  // Parses the config (the file, a resumed checkpoint's, or the default) for a run of
  // `total_steps` into `config` and `config_text`; `log`: say what was resolved and warned.
  Status ParseRunConfig(int64_t total_steps, bool log);
  // --epochs: the step count from the data and the global batch.
  Status DeriveStepsFromEpochs();
  uint64_t global_batch() const {
    return static_cast<uint64_t>(config.train_micro_batch_size_per_gpu) *
           static_cast<uint64_t>(config.gradient_accumulation_steps) * static_cast<uint64_t>(world);
  }
  // Epochs of training data consumed after `consumed` samples (0 when an epoch holds none).
  double EpochOf(uint64_t consumed) const;
  // Whether the step that just consumed the global batch ending at `samples` completed an epoch.
  bool CompletedEpoch() const;
  Result<EvalReport> EvaluateOn(const TrainingData& source, int64_t max_batches);
  // OpenData of SFT records (runtime/data/sft_data.h): opened with the run's model, seq_len,
  // seed and --packing, and reported in the log. REQUIRES: IsSftFile(path).
  Result<std::unique_ptr<TrainingData>> LoadSftData(const std::string& path,
                                                    const std::string& flag) const;
  // What the run's checkpoints hold beside the engine state (checkpointing.h).
  CheckpointRun Checkpoints() const;
  Status Resume();
  // The inputs and targets of micro-batch `micro` of the next step: rank r's rows of the global
  // batch. With `trained`, adds the targets that are not kIgnoredTarget to it.
  Status FillMicroBatch(int micro, torch::Tensor* x, torch::Tensor* y,
                        double* trained = nullptr) const;
  // One micro-batch: forward and Backward. Returns its loss: the mean over its targets, or with
  // `sum_scale` (masked data) the sum over its trained targets, the backward then taking the sum
  // times *sum_scale.
  Result<double> MicroBatch(const torch::Tensor& x, const torch::Tensor& y, double* forward_seconds,
                            double* backward_seconds,
                            std::optional<double> sum_scale = std::nullopt);
  // `s` from libtorch during `phase`; a GPU out of memory becomes kResourceExhausted naming the
  // phase, what libtorch asked for, strata's device budget and the settings that shrink it.
  Status ComputeError(const std::string& phase, Status s) const;
};

}  // namespace strata::runtime
