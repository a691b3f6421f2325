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
#include "runtime/commands/save_dir.h"
#include "runtime/commands/trainer.h"
#include "runtime/config/config.h"
#include "runtime/data/training_data.h"
#include "runtime/engine/engine.h"
#include "runtime/models/causal_lm.h"
#include "runtime/persist/checkpoint_store.h"
#include "runtime/plan/memory_plan.h"
#include "tiers/device.h"

namespace strata::runtime {
namespace internal {

// Removes the demo's scratch directory if nothing else is in it (another demo run's swap
// directory may be). Declared before the engine in Impl, so it runs after the engine (and its
// swap space, which removes its own directory) is gone.
struct ScratchDir {
  std::string path;
  ~ScratchDir();
};

}  // namespace internal

struct Trainer::Impl {
  TrainerOptions options;
  internal::ScratchDir scratch;
  Config config;
  std::unique_ptr<CausalLm> lm;
  int seq_len = 0;
  std::unique_ptr<TrainingData> data;
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
  uint64_t samples = 0;  // training samples consumed by all ranks (the global data position)
  int64_t trace_from = -1, trace_to = -1;
  // Data-parallel ranks (torchrun's environment, or `strata train --nproc`): the training
  // thread's process group (the engine's, the loss mean, checkpoints) and the gradient
  // hand-off's. One rank: single-rank communicators.
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<Communicator> grad_comm;
  std::shared_ptr<Communicator> gather_comm;  // the engine's ahead all-gathers (null: none)
  int world = 1;
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
  // Opens --device (after the config: a GPU's default budget leaves room for the activations).
  Status OpenComputeDevice();
  Status LoadData();
  // What the run's checkpoints hold beside the engine state (checkpointing.h).
  CheckpointRun Checkpoints() const;
  Status Resume();
  // The inputs and targets of micro-batch `micro` of the next step: rank r's rows of the global
  // batch.
  Status FillMicroBatch(int micro, torch::Tensor* x, torch::Tensor* y) const;
  // One micro-batch: forward and Backward. Returns its loss.
  Result<double> MicroBatch(const torch::Tensor& x, const torch::Tensor& y, double* forward_seconds,
                            double* backward_seconds);
  // `s` from libtorch during `phase`; a GPU out of memory becomes kResourceExhausted naming the
  // phase, what libtorch asked for, strata's device budget and the settings that shrink it.
  Status ComputeError(const std::string& phase, Status s) const;
};

}  // namespace strata::runtime
