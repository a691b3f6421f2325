// Trainer set-up (Trainer::Impl::Init, trainer_impl.h): the ranks known from the environment, the
// --save directory claimed, the model built, the config chosen (the file, the one a resumed
// checkpoint was trained with, or the demo's), the data opened, the ranks met, the compute device
// opened, the engine initialized unit by unit, and the resumed checkpoint loaded. Create
// reproduces the order in which a run consumes randomness: the seed is set, then the model is
// built (its initial values), then the engine reads them.
#include <sys/stat.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/json_text.h"
#include "base/logging.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/commands/checkpointing.h"
#include "runtime/commands/flag_checks.h"
#include "runtime/commands/save_dir.h"
#include "runtime/commands/trainer.h"
#include "runtime/commands/trainer_impl.h"
#include "runtime/commands/training_flags.h"
#include "runtime/data/sft_data.h"
#include "runtime/data/text_data.h"
#include "runtime/data/token_data.h"
#include "runtime/data/training_data.h"
#include "runtime/data/windows.h"
#include "runtime/engine/compute_device.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/initialize.h"
#include "runtime/models/causal_lm.h"
#include "runtime/persist/checkpoint_store.h"
#include "runtime/plan/machine_info.h"

namespace strata::runtime {
namespace {

// The demo: ZeRO-3 with parameters and optimizer state on NVMe (nvme_path: a scratch directory),
// sized so that both really stream from NVMe every step: the pinned arena (~23 MiB) is a third of
// the state kept on NVMe (~65 MB), with two parameter slots for the small preset's four units
// (each forward and backward reads units back), sub-groups of 2e5 elements of which the optimizer's
// pools hold three (its whole state is read and written every step), and no unit kept in CPU
// memory (max_in_cpu 0; DeepSpeed's default keeps a model this size there entirely) and no host-RAM
// tier (strata.host_memory 0: the default budget would keep all of it in RAM). Micro-batch 4
// keeps the 120 steps within about two minutes on two cores.
const char* kDemoConfig = R"({
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "steps_per_print": 20,
  "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 10}},
  "zero_optimization": {
    "stage": 3,
    "stage3_param_persistence_threshold": 1e4,
    "sub_group_size": 2e5,
    "offload_param": {"device": "nvme", "buffer_count": 2, "max_in_cpu": 0},
    "offload_optimizer": {"device": "nvme", "buffer_count": 4}
  },
  "strata": {"host_memory": 0}
})";

// `v` as a person writes it: 2, 0.5, 1.25.
std::string ShortNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

}  // namespace

void RestartWithPassiveOpenMpWaiting() {
  if (GetEnv("OMP_WAIT_POLICY") != nullptr || GetEnv("GOMP_SPINCOUNT") != nullptr) {
    return;
  }
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string arg; std::getline(in, arg, '\0');) args.push_back(arg);
  if (args.empty() || ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv("/proc/self/exe", argv.data());  // returns only on failure: go on spinning
}

uint64_t PeakResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
}

Status Trainer::Impl::Init() {
  const TrainerOptions& o = options;
  if (o.steps < 0) return InvalidArgumentError("--steps must be >= 0");
  // Ranks: known from the environment before anything is built (the config's batch sizes are
  // checked against the world size); connected once the config gives the timeout.
  STRATA_ASSIGN_OR_RETURN(const std::optional<DistEnv> env, DistEnvFromEnvironment());
  if (env) {
    world = env->world_size;
    rank = env->rank;
    local_ranks = env->local_world_size;
    local_rank = env->local_rank;
    // Started by torchrun or srun, whose output may not say which rank a line comes from:
    // every line this rank logs says it (`strata train --nproc` prefixes lines itself).
    if (world > 1 && GetEnv("STRATA_LAUNCHER_PREFIXES") == nullptr) {
      SetLogPrefix("[rank " + std::to_string(rank) + "] ");
    }
  }
  if (o.seq_len < 0) return InvalidArgumentError("--seq-len must be >= 1");
  STRATA_RETURN_IF_ERROR(ClaimSaveDir());
  if (!o.trace.empty())
    STRATA_RETURN_IF_ERROR(
        flags::ParseStepRange(o.trace_steps, "--trace-steps", &trace_from, &trace_to));
  Stopwatch build_watch;
  STRATA_ASSIGN_OR_RETURN(ModelSpec spec, ResolveModel(o.model, o.seq_len, Weights::kRequired));
  seq_len = spec.seq_len;  // the flag, else the model's default (model_spec.h)
  STRATA_RETURN_IF_ERROR(ApplyPageExperts(o.page_experts, o.model, spec));
  if (o.page_experts && world > 1) return PageExpertsRanksError();
  STRATA_ASSIGN_OR_RETURN(lm, OpenModel(std::move(spec), o.seed));
  if (!o.save.empty() && !lm->hf_dir().empty()) {  // --save writes SAVE/hf
    STRATA_RETURN_IF_ERROR(CheckOutsideModelDir((std::filesystem::path(o.save) / "hf").string(),
                                                lm->hf_dir(), "--save (its hf/ directory)", true));
  }
  if (seq_len > lm->max_seq_len()) {
    return InvalidArgumentError("--seq-len " + std::to_string(seq_len) + " is longer than " +
                                o.model + " attends (" + std::to_string(lm->max_seq_len()) +
                                " tokens)");
  }
  const int threads =
      o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  torch::set_num_threads(threads);

  // The config for the run's steps; with --epochs the steps come from the data and the config's
  // global batch, and the config is parsed again for them ("auto" total_num_steps).
  STRATA_RETURN_IF_ERROR(ParseRunConfig(o.epochs > 0 ? int64_t{1} << 30 : o.steps, o.epochs <= 0));
  STRATA_RETURN_IF_ERROR(CheckActivationsFit());
  STRATA_RETURN_IF_ERROR(CheckStop("reading the config and the model"));
  if (!o.no_data) STRATA_RETURN_IF_ERROR(LoadData());
  if (o.epochs > 0) STRATA_RETURN_IF_ERROR(DeriveStepsFromEpochs());
  if (!o.eval_data.empty()) {
    STRATA_ASSIGN_OR_RETURN(eval_data, OpenData(o.eval_data, "--eval-data"));
    if (eval_data->Windows(seq_len) == 0) {
      return InvalidArgumentError(
          "--eval-data " + o.eval_data +
          " holds no full window of --seq-len + 1 = " + std::to_string(seq_len + 1) + " tokens");
    }
  }
  STRATA_RETURN_IF_ERROR(CheckStop("reading the data"));
  STRATA_RETURN_IF_ERROR(OpenComputeDevice());
  STRATA_RETURN_IF_ERROR(Connect(env));
  STRATA_RETURN_IF_ERROR(CheckStop("meeting the other ranks"));

  // Units are filled one at a time as the engine takes them (causal_lm.h), so host memory never
  // holds the whole model, and the values do not depend on the offload mode. A stop is noticed
  // before each unit (loading a Hugging Face model and writing the initial state to NVMe take
  // minutes for large models).
  InitializeOptions io;
  io.initialize_unit = [this, fill = lm->UnitInitializer()](int unit) -> Status {
    STRATA_RETURN_IF_ERROR(CheckStop((lm->hf_dir().empty() ? "initializing" : "loading") +
                                     std::string(" the model (unit ") + std::to_string(unit) +
                                     " of " + std::to_string(lm->num_units()) + ")"));
    return fill(unit);
  };
  STRATA_ASSIGN_OR_RETURN(io.device_budget, ParseBytes(o.device_memory));
  io.device = device.get();
  io.torch_device = torch_device;
  STRATA_RETURN_IF_ERROR(ResolveHostMemory(io));
  io.optimizer_threads = threads;
  // The train command catches signals from its start (a first one stops the run between units or
  // steps, a second removes the swap files and ends it): the swap spaces' own handlers would
  // delete the files under a run still setting up.
  io.swap_signal_handlers = options.stop == nullptr;
  io.nan_gradient = options.test_hooks.nan_gradient;
  io.step_without_gradient = true;  // strata's own model: experts step as transformers 5's do
  io.communicator = comm;
  io.grad_communicator = grad_comm;
  io.gather_communicator = gather_comm;
  // Inference without gradients or optimizer state, unless a checkpoint must be restored (its
  // weights are the optimizer's fp32 masters: LoadState needs a training engine's state).
  io.inference = o.inference && o.resume.empty();
  if (o.inference && !io.inference) {
    STRATA_LOG(kInfo) << "--resume: the engine keeps optimizer state to restore the checkpoint "
                         "into (inference without it needs a Hugging Face directory: "
                         "`strata train --export`)";
  }
  STRATA_ASSIGN_OR_RETURN(engine, Initialize(lm->module(), config, io));
  for (const auto& w : engine->options().warnings) STRATA_LOG(kWarning) << w;
  STRATA_LOG(kInfo) << "model " << lm->Describe() << "; seq " << seq_len << "; params on "
                    << HomeName(engine->options().params)
                    << (io.inference ? ", inference (no gradients or optimizer state)"
                                     : ", optimizer on " +
                                           std::string(HomeName(engine->options().optimizer)))
                    << "; device "
                    << (device ? device_description
                               : "host (emulated; libtorch computes on the CPU)")
                    << "; pinned arena " << FormatBytes(engine->pinned_arena_bytes())
                    << HostCacheText() << "; ready in " << build_watch.Seconds() << " s";
  if (!o.resume.empty()) STRATA_RETURN_IF_ERROR(Resume());
  return CheckStop("preparing the run");
}

// ", host-RAM tier 1.2 GiB (gradients ..., state ..., parameters ...)" for the ready line, or ""
// without one.
std::string Trainer::Impl::HostCacheText() const {
  std::optional<PlanInput> in = engine->plan_input();
  if (!in || in->host_cache_bytes == 0) return "";
  const HostCacheSplit split = SplitHostCache(*in);
  return " (of which host-RAM tier " + FormatBytes(split.bytes()) + ": gradients " +
         FormatBytes(split.grad_bytes) + ", optimizer state " + FormatBytes(split.state_bytes) +
         ", parameters " + FormatBytes(split.unit_bytes) + " kept off NVMe)";
}

// The host budget: --host-memory, else strata.host_memory, else STRATA_HOST_MEMORY, else "auto".
// It bounds the process's host memory (the arena, the host-RAM tier and what is beside them:
// memory_plan.h HostBeside); the ranks on this machine share it equally. A size caps the run (a
// plan that needs more is refused) and sizes the tier; "auto" sizes the tier by DefaultHostBudget
// of the memory this process may still take and caps nothing (a run that fits the machine runs,
// with no tier when nothing is left for one); 0: no tier and no cap (every offloaded block on NVMe,
// DeepSpeed's placement).
Status Trainer::Impl::ResolveHostMemory(InitializeOptions& io) const {
  const bool flag = !options.host_memory.empty();
  const bool key = !flag && !config.strata.host_memory.empty();
  const std::string spec = flag  ? options.host_memory
                           : key ? config.strata.host_memory
                                 : DefaultHostMemorySpec();
  io.host_memory_source = flag  ? "--host-memory"
                          : key ? "strata.host_memory"
                                : "STRATA_HOST_MEMORY (or the default, auto)";
  Result<HostMemory> host = ReadHostMemory();
  Result<HostBudget> parsed = ParseHostBudget(spec, host);
  if (!parsed.ok()) return parsed.status().WithContext(io.host_memory_source);
  io.host_process_reserve = kHostProcessReserve;
  const uint64_t ranks = static_cast<uint64_t>(std::max(1, local_ranks));
  if (parsed->automatic) {
    if (!host.ok()) {
      STRATA_LOG(kWarning) << io.host_memory_source << ": " << host.status().message()
                           << "; no host-RAM tier (every offloaded block on NVMe)";
    }
    io.host_cache_budget = parsed->budget / ranks;
    return Status::Ok();
  }
  const uint64_t budget = parsed->budget;
  if (budget == 0) return Status::Ok();
  if (host.ok() && host->limit() != 0 && budget > host->limit()) {
    return InvalidArgumentError(
        io.host_memory_source + " " + FormatBytes(budget) + " is more than this machine's " +
        FormatBytes(host->limit()) + " of memory" +
        (host->cgroup_limit != 0 && host->cgroup_limit < host->total
             ? " (its cgroup's memory.max; the machine has " + FormatBytes(host->total) + ")"
             : std::string(" (MemTotal)")) +
        ": give at most that, or \"auto\"");
  }
  io.host_memory_budget = budget / ranks;
  io.host_cache_budget = budget / ranks;
  return Status::Ok();
}

// The config: the file, the one a resumed checkpoint was trained with, or the default (the demo's
// with a scratch NVMe directory; no offload for `strata eval`).
Status Trainer::Impl::ParseRunConfig(int64_t total_steps, bool log) {
  const TrainerOptions& o = options;
  ParseOptions po;
  po.auto_values = o.auto_values;
  po.auto_values.hidden_size = static_cast<int>(lm->hidden_size());
  po.auto_values.total_num_steps = std::max<int64_t>(total_steps, 1);  // --steps 0: export only
  po.given = o.given;
  po.world_size = world;
  // Resuming without --config: the config the checkpoint was trained with (checkpoints of
  // earlier builds have none: then the default below, as before).
  std::string saved_config;
  if (o.config.empty() && resume_checkpoint) {
    const CheckpointReader& reader = *resume_checkpoint;
    if (reader.HasEntry("config.json")) {
      STRATA_ASSIGN_OR_RETURN(nlohmann::json saved, reader.ReadJson("config.json"));
      saved_config = saved.dump();
    }
  }
  if (!saved_config.empty()) {
    po.source = "the config saved with " + o.resume;
    config_text = saved_config;
    STRATA_ASSIGN_OR_RETURN(config, ParseConfig(saved_config, po));
    if (log) {
      STRATA_LOG(kInfo) << "config: the one checkpoint " << o.resume
                        << " was trained with (give --config to use another)";
    }
  } else if (o.config.empty() && o.no_offload_default) {
    nlohmann::json plain = {{"train_micro_batch_size_per_gpu", "auto"}};
    po.source = "default config (no offload)";
    config_text = plain.dump();
    STRATA_ASSIGN_OR_RETURN(config, ParseConfig(config_text, po));
  } else if (o.config.empty()) {
    // One scratch parent per user, not per run: each run's swap directory inside it is locked
    // while the run lives, and the next demo run (or `strata clean --path` on it) removes those
    // of runs that died (kill -9, a second Ctrl-C, the OOM killer).
    STRATA_RETURN_IF_ERROR(scratch.Open(DemoScratchPath()));
    nlohmann::json demo = nlohmann::json::parse(kDemoConfig);
    demo["zero_optimization"]["offload_param"]["nvme_path"] = scratch.path();
    demo["zero_optimization"]["offload_optimizer"]["nvme_path"] = scratch.path();
    // The demo is ours: a flag the user gives replaces its value instead of contradicting it.
    if (po.given.lr) demo["optimizer"]["params"]["lr"] = *po.given.lr;
    if (po.given.train_micro_batch_size_per_gpu) {
      demo["train_micro_batch_size_per_gpu"] = *po.given.train_micro_batch_size_per_gpu;
    }
    if (po.given.gradient_accumulation_steps) {
      demo["gradient_accumulation_steps"] = *po.given.gradient_accumulation_steps;
    }
    if (po.given.gradient_clipping) demo["gradient_clipping"] = *po.given.gradient_clipping;
    if (po.given.lr_scheduler_type || po.given.min_lr || po.given.min_lr_rate) {
      demo.erase("scheduler");  // the flags' Hugging Face schedule replaces the demo's
    } else if (po.given.warmup_ratio && po.given.warmup_num_steps.value_or(0) == 0) {
      demo["scheduler"]["params"]["warmup_num_steps"] = "auto";  // answered by --warmup-ratio
    } else if (po.given.warmup_num_steps) {
      demo["scheduler"]["params"]["warmup_num_steps"] = *po.given.warmup_num_steps;
    }
    po.source = "demo config";
    config_text = demo.dump();
    STRATA_ASSIGN_OR_RETURN(config, ParseConfig(config_text, po));
  } else {
    STRATA_ASSIGN_OR_RETURN(config, LoadConfigFile(o.config, po, &config_text));
  }
  // A demo checkpoint resumed (its saved config names the demo's scratch directory) shares that
  // directory with other demo runs as a demo run does: locked, so none removes it under this one.
  const std::string demo_scratch = DemoScratchPath();
  if (scratch.path().empty() && (config.zero.offload_param.nvme_path == demo_scratch ||
                                 config.zero.offload_optimizer.nvme_path == demo_scratch)) {
    STRATA_RETURN_IF_ERROR(scratch.Open(demo_scratch));
  }
  // A schedule the flags made goes into the config a checkpoint keeps: a run resumed without
  // the flags continues it (and one resumed with other flags is refused by the parse).
  if (config.strata.lr_scheduler) {
    STRATA_ASSIGN_OR_RETURN(
        nlohmann::json root,
        ParseJsonText(config_text, po.source, {.max_bytes = 16 << 20, .allow_comments = true}));
    root["strata"]["lr_scheduler"] = *config.strata.lr_scheduler;
    config_text = root.dump();
  }
  if (!log) return Status::Ok();
  for (const auto& w : config.warnings) STRATA_LOG(kWarning) << w;
  if (!config.auto_resolved.empty()) {
    std::string lines;
    for (const auto& r : config.auto_resolved) lines += "\n  " + r;
    STRATA_LOG(kInfo) << "config: " << config.auto_resolved.size() << " \"auto\" value"
                      << (config.auto_resolved.size() == 1 ? "" : "s") << " resolved:" << lines;
  }
  const double lr = config.optimizer.value_or(cpu_optimizer::OptimizerOptions{}).lr;
  STRATA_LOG(kInfo) << "lr schedule: " << DescribeLrSchedule(config.scheduler, lr);
  return Status::Ok();
}

// Before anything is built: a --save directory in use by another live run, or holding another
// run's checkpoints, is refused (save_dir.h). Every rank learns the lineage (only rank 0 writes
// trainer.json and prunes; rank 0 alone locks, the directory being shared by the ranks).
Status Trainer::Impl::ClaimSaveDir() {
  const TrainerOptions& o = options;
  if (o.resume.empty()) {
    STRATA_ASSIGN_OR_RETURN(run_id, NewRunId());
  } else {
    STRATA_ASSIGN_OR_RETURN(resume_checkpoint, OpenCheckpoint(o.resume));
    STRATA_ASSIGN_OR_RETURN(run_id, RunIdOfCheckpoint(*resume_checkpoint));
  }
  if (o.save.empty() || rank != 0) return Status::Ok();
  STRATA_ASSIGN_OR_RETURN(save_lock, SaveDirLock::Acquire(o.save));
  const bool resume_in_save = !o.resume.empty() && CheckpointIsIn(o.resume, o.save);
  return CheckSaveDirOwnership(o.save, run_id, resume_in_save, o.overwrite_save);
}

// What every rank of one run must agree on, compared when the ranks meet (ConnectGloo): ranks
// started with different models, lengths, precisions, optimizers, seeds or data would otherwise
// train numbers no setting gives, or fail inside a collective whose sizes differ.
std::string Trainer::Impl::RunSettings() const {
  std::ostringstream out;
  out.precision(17);
  out << "model=" << lm->Identity().dump() << "\n";
  out << "seq_len=" << seq_len << "\n";
  // Ranks on GPUs talk over NCCL, ranks on the host over Gloo: all on one kind or none.
  out << "device=" << (torch_device.is_cpu() ? "host" : "cuda") << "\n";
  out << "precision="
      << (config.fp16.enabled   ? "fp16"
          : config.bf16.enabled ? "bf16"
                                : "fp32")
      << (config.bf16.enabled && config.bf16.optimizer_states ? " (bf16 moments)" : "") << "\n";
  out << "train_micro_batch_size_per_gpu=" << config.train_micro_batch_size_per_gpu << "\n";
  out << "gradient_accumulation_steps=" << config.gradient_accumulation_steps << "\n";
  if (config.optimizer) {
    const cpu_optimizer::OptimizerOptions& op = *config.optimizer;
    out << "optimizer=" << cpu_optimizer::OptimizerTypeName(op.type) << "\n";
    out << "lr=" << op.lr << "\n";
    out << "betas=" << op.beta1 << "," << op.beta2 << "\n";
    out << "eps=" << op.eps << "\n";
    out << "weight_decay=" << op.weight_decay << "\n";
  }
  if (config.scheduler) {
    out << "scheduler=" << config.scheduler->type << " " << config.scheduler->params.dump() << "\n";
  }
  out << "gradient_clipping=" << config.gradient_clipping << "\n";
  out << "zero_stage=" << config.zero.stage << "\n";
  out << "sub_group_size=" << config.zero.sub_group_size << "\n";
  out << "stage3_param_persistence_threshold=" << config.zero.param_persistence_threshold << "\n";
  out << "seed=" << options.seed << "\n";
  out << "steps=" << options.steps << "\n";
  // The data by content (paths may differ between machines): its length and a hash of its first
  // and last tokens (or of the whole text).
  out << "data=" << data->Fingerprint() << (options.packing ? " packed" : "") << "\n";
  // What decides when ranks evaluate and save (collectives): every rank must do the same.
  out << "eval_data=" << (eval_data ? eval_data->Fingerprint() : "none") << "\n";
  out << "eval_every=" << options.eval_every << (options.eval_every_epoch ? " epoch" : "")
      << " max_batches=" << options.eval_max_batches << "\n";
  out << "save_every=" << options.save_every << (options.save_every_epoch ? " epoch" : "")
      << " save_best=" << options.save_best << "\n";
  return out.str();
}

Status Trainer::Impl::Connect(const std::optional<DistEnv>& env) {
  if (!env || env->world_size == 1) {
    comm = MakeSingleRankCommunicator();
    grad_comm = MakeSingleRankCommunicator();
    return Status::Ok();
  }
  Stopwatch watch;
  const auto timeout = std::chrono::seconds(config.strata.comms_timeout_seconds);
  // Ranks on GPUs: NCCL on this rank's GPU for the data, Gloo for barriers and host messages.
  const int nccl_device = torch_device.is_cuda() ? torch_device.index() : -1;
  STRATA_ASSIGN_OR_RETURN(auto groups, ConnectGloo(*env, 3, timeout, RunSettings(), nccl_device));
  comm = groups[0];
  grad_comm = groups[1];
  gather_comm = groups[2];
  STRATA_LOG(kInfo) << "rank " << rank << " of " << world << " joined " << env->master_addr << ":"
                    << env->master_port << " (" << comm->backend()
                    << (nccl_device >= 0 ? " on " + torch_device.str() : std::string()) << ") in "
                    << watch.Seconds() << " s";
  return Status::Ok();
}

// A batch whose activations exceed the machine's memory would fail deep inside an allocation (or
// be killed by the kernel); refuse it up front with the numbers. On a GPU the activations live in
// device memory, which is smaller than any host that drives it, so the host's total memory is a
// bound that never refuses a run that could work.
ActivationBytes Trainer::Impl::MicroBatchActivations() const {
  const int compute_bytes = config.fp16.enabled || config.bf16.enabled ? 2 : 4;
  return lm->Activations(static_cast<int>(config.train_micro_batch_size_per_gpu), seq_len,
                         compute_bytes);
}

Status Trainer::Impl::CheckActivationsFit() const {
  const int micro_batch = static_cast<int>(config.train_micro_batch_size_per_gpu);
  const ActivationBytes act = MicroBatchActivations();
  const uint64_t need =
      act.checkpoint > UINT64_MAX - act.working ? UINT64_MAX : act.checkpoint + act.working;
  Result<HostMemory> host = ReadHostMemory();
  if (!host.ok() || host->total == 0 || need <= host->total) return Status::Ok();
  return InvalidArgumentError(
      "sequences of " + std::to_string(seq_len) + " tokens (--seq-len) in micro-batches of " +
      std::to_string(micro_batch) + " (train_micro_batch_size_per_gpu) need about " +
      FormatBytes(need) + " of activations per micro-batch for " + lm->Describe() +
      ", more than this machine's " + FormatBytes(host->total) +
      " of memory: lower --seq-len or the micro-batch");
}

Status Trainer::Impl::OpenComputeDevice() {
  std::string spec = options.device;
  if (world > 1 && spec != "host" && spec.rfind("host:", 0) != 0) {
    // Ranks on GPUs: one GPU per rank (LOCAL_RANK's, as torchrun and DeepSpeed place them), the
    // collectives over NCCL. Every rank of a machine decides alike (the same build, the same GPU
    // count), so `auto` never puts some ranks on GPUs and others on the host.
    const int64_t gpus = static_cast<int64_t>(torch::cuda::device_count());
    std::string why_not;
    if (!NcclBuilt()) {
      why_not =
          "ranks on GPUs need c10d's ProcessGroupNCCL, which this build does not have "
          "(built against a libtorch without CUDA: scripts/gpu-bundle.sh builds against "
          "PyTorch's)";
    } else if (gpus < local_ranks) {
      why_not = std::to_string(local_ranks) + " ranks on this machine (LOCAL_WORLD_SIZE) need " +
                std::to_string(local_ranks) + " GPUs, one each; libtorch sees " +
                std::to_string(gpus);
    }
    if (!why_not.empty()) {
      if (spec == "auto") {
        STRATA_LOG(kInfo) << "device auto: " << world << " ranks train on the host-emulated "
                          << "device: " << why_not;
        return Status::Ok();
      }
      return InvalidArgumentError("--device " + spec + " with " + std::to_string(world) +
                                  " ranks: " + why_not + "; use --device host (or auto)");
    }
    const std::string mine = "cuda:" + std::to_string(local_rank);
    if (spec.rfind("cuda:", 0) == 0 && local_ranks > 1 && spec != mine) {
      return InvalidArgumentError(
          "--device " + spec + " with " + std::to_string(local_ranks) +
          " ranks on this machine (LOCAL_WORLD_SIZE): each rank computes on the GPU of its "
          "LOCAL_RANK; pass --device cuda (or auto)");
    }
    if (spec == "cuda" || spec == "auto") spec = mine;
  }
  STRATA_ASSIGN_OR_RETURN(const uint64_t given, ParseBytes(options.device_memory));
  STRATA_ASSIGN_OR_RETURN(ComputeDevice opened, runtime::OpenComputeDevice(spec, given));
  if (opened.device == nullptr) return Status::Ok();  // the host-emulated device
  if (given == 0) {
    // The budget CudaDevice took (90% of the free memory) less what libtorch needs beside
    // strata's parameter copies: the activations of a micro-batch and a workspace; with ranks
    // also NCCL's buffers for the three communicators and their staging (NCCL starts after the
    // device is opened, when the ranks meet).
    const ActivationBytes act = MicroBatchActivations();
    const uint64_t nccl = world > 1 ? uint64_t{3} * (uint64_t{512} << 20) : 0;
    const uint64_t reserve = act.checkpoint + act.working + (uint64_t{1} << 30) + nccl;
    const uint64_t budget = opened.device->info().budget_bytes;
    if (reserve >= budget) {
      return ResourceExhaustedError(
          "--device " + spec + ": " + opened.device->info().name + " has " + FormatBytes(budget) +
          " free for strata, less than the activations of a micro-batch and libtorch's "
          "workspace" +
          (nccl > 0 ? std::string(" and NCCL's buffers") : std::string()) + " (" +
          FormatBytes(reserve) +
          "): lower train_micro_batch_size_per_gpu or --seq-len, or set --device-memory");
    }
    const std::string gpu = opened.spec;
    opened.device.reset();  // one device at a time: reopened with the budget that leaves the room
    STRATA_ASSIGN_OR_RETURN(opened, runtime::OpenComputeDevice(gpu, budget - reserve));
  }
  device = std::move(opened.device);
  torch_device = opened.torch_device;
  device_description = opened.spec + " (" + device->info().name + ", " +
                       FormatBytes(device->info().budget_bytes) + " for parameters)";
  // Buffers the model keeps outside its parameters compute where it does.
  try {
    torch::NoGradGuard no_grad;
    for (auto& b : lm->module()->buffers()) b.set_data(b.to(torch_device));
  } catch (const std::exception& e) {
    return FailedPreconditionError("--device " + spec + ": libtorch cannot compute there (" +
                                   std::string(e.what()).substr(0, 300) + ")");
  }
  return Status::Ok();
}

// SFT records (sft_data.h) for any model; their start-up report says what the loss trains on.
Result<std::unique_ptr<TrainingData>> Trainer::Impl::LoadSftData(const std::string& path,
                                                                 const std::string& flag) const {
  const TrainerOptions& o = options;
  if (!o.data_dtype.empty() && flag == "--data") {
    return InvalidArgumentError("--data-dtype is for .bin token files, not " + path);
  }
  SftDataOptions so;
  so.path = path;
  so.model_dir = lm->hf_dir();
  so.vocab_size = lm->vocab_size();
  so.seq_len = seq_len;
  so.packing = o.packing;
  so.seed = o.seed;
  // Padding is never a target and, attention being causal, cannot change an earlier position's
  // logits; the model's pad_token_id keeps the inputs what transformers would feed.
  const nlohmann::json hf = lm->HfConfig();
  if (hf.is_object() && hf.contains("pad_token_id") && hf["pad_token_id"].is_number_integer()) {
    const int64_t pad = hf["pad_token_id"].get<int64_t>();
    if (pad >= 0 && pad < lm->vocab_size()) so.pad_id = pad;
  }
  SftSummary s;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<TrainingData> sft, OpenSftData(so, &s));
  std::ostringstream line;
  line << (flag == "--data" ? "data " : "eval data ") << path << ": " << s.records << " " << s.kind
       << " records, " << s.tokens << " tokens (" << s.completion_tokens << " in completions); ";
  if (o.packing) {
    line << "packed into " << s.samples << " windows of " << seq_len + 1 << " tokens ("
         << s.dropped_tokens << " tokens of the tail dropped)";
  } else {
    line << "one per row of " << seq_len + 1 << " tokens, padded; " << s.truncated
         << " truncated to it";
    if (s.truncated > 0) {
      line << ", cutting " << s.truncated_completion_tokens << " completion tokens";
      if (s.untrained_records > 0) line << " (" << s.untrained_records << " left with none)";
    }
  }
  line << "; loss on the " << s.trained_tokens
       << " completion tokens an epoch trains on (prompt and padding ignored)";
  STRATA_LOG(kInfo) << line.str();
  if (s.truncated > 0) {
    STRATA_LOG(kWarning) << s.truncated << " of " << s.records << " records of " << path
                         << " are longer than --seq-len + 1 = " << seq_len + 1
                         << " tokens: their ends (" << s.truncated_completion_tokens
                         << " completion tokens) are not trained on; raise --seq-len or use "
                            "--packing";
  }
  if (s.prompt_mismatches > 0) {
    STRATA_LOG(kWarning) << s.prompt_mismatches << " records of " << path
                         << ": the tokenized prompt is not the start of the tokenized prompt + "
                            "completion (the tokenizer merged across the boundary); their first "
                            "len(prompt ids) tokens are masked as the prompt, as TRL does";
  }
  return sft;
}

Status Trainer::Impl::LoadData() {
  STRATA_ASSIGN_OR_RETURN(data, OpenData(options.data, "--data"));
  return Status::Ok();
}

Result<std::unique_ptr<TrainingData>> Trainer::Impl::OpenData(const std::string& path,
                                                              const std::string& flag) const {
  const TrainerOptions& o = options;
  STRATA_ASSIGN_OR_RETURN(const bool sft, path.empty() ? false : IsSftFile(path));
  if (sft) return LoadSftData(path, flag);
  if (o.packing) {
    return InvalidArgumentError(
        "--packing is for SFT data (.jsonl with prompt/completion records); " + flag + " " +
        (path.empty() ? std::string("(the default text)") : path) + " holds none");
  }
  const bool bytes = lm->family() == "gpt" || (o.data.empty() && lm->hf_dir().empty());
  if (bytes) {
    if (!o.data_dtype.empty() && flag == "--data") {
      return InvalidArgumentError("--data-dtype is for .bin token files of Llama-family models");
    }
    STRATA_ASSIGN_OR_RETURN(std::string text, LoadText(path));
    if (text.size() < static_cast<size_t>(seq_len) + 2) {
      return InvalidArgumentError(flag + " " + (path.empty() ? "(the default text)" : path) + ": " +
                                  std::to_string(text.size()) +
                                  " bytes, shorter than one sequence of " +
                                  std::to_string(seq_len) + " tokens");
    }
    return NewByteTextData(std::move(text), o.seed);
  }
  if (path.empty()) {
    return InvalidArgumentError(
        flag +
        " is required with a Hugging Face model: token ids (.bin, uint16/uint32 as "
        "nanoGPT writes them; see `strata tokenize`), or .jsonl with a \"text\" field, or .txt "
        "(tokenized with the model's tokenizer), or SFT .jsonl (prompt/completion or chat "
        "\"messages\")");
  }
  TokenDataOptions to;
  to.path = path;
  // --data-dtype describes --data; a .bin --eval-data takes the vocabulary's default.
  to.dtype = flag == "--data" ? o.data_dtype : "";
  to.model_dir = lm->hf_dir();
  to.vocab_size = lm->vocab_size();
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<TokenData> tokens, TokenData::Open(to));
  const uint64_t size = tokens->size();
  const uint64_t windows = WindowCount(size, seq_len);
  if (windows == 0) {
    return InvalidArgumentError(
        flag + " " + path + ": " + std::to_string(size) +
        " tokens, fewer than one window of --seq-len + 1 = " + std::to_string(seq_len + 1));
  }
  STRATA_LOG(kInfo) << (flag == "--data" ? "data " : "eval data ") << path << ": " << size
                    << " tokens, " << windows << " windows of " << seq_len + 1;
  return NewTokenWindowData(std::move(tokens), seq_len, o.seed);
}

Status Trainer::Impl::DeriveStepsFromEpochs() {
  const uint64_t per_epoch = data->Windows(seq_len);
  const uint64_t batch = global_batch();
  // E × samples per epoch, whole when it is within rounding of a whole number (1.1 × 100 is
  // 110.00000000000001 in binary, which ceil would make 111).
  double samples = options.epochs * static_cast<double>(per_epoch);
  if (std::abs(samples - std::round(samples)) <= 1e-9 * std::max(1.0, samples)) {
    samples = std::round(samples);
  }
  samples = std::ceil(samples);
  const double steps = std::ceil(samples / static_cast<double>(batch));
  if (per_epoch == 0 || !(steps >= 1) || steps > static_cast<double>(flags::kMaxCount)) {
    return InvalidArgumentError("--epochs " + ShortNumber(options.epochs) + " of " +
                                std::to_string(per_epoch) + " samples in global batches of " +
                                std::to_string(batch) + " is not a step count strata can run");
  }
  options.steps = static_cast<int64_t>(steps);
  // The schedule's "auto" total_num_steps follows the derived count.
  STRATA_RETURN_IF_ERROR(ParseRunConfig(options.steps, true));
  if (rank == 0) {
    STRATA_LOG(kInfo) << "--epochs " << ShortNumber(options.epochs) << ": " << per_epoch
                      << " samples of " << seq_len + 1 << " tokens per epoch, global batch "
                      << batch << " (" << config.train_micro_batch_size_per_gpu << " x "
                      << config.gradient_accumulation_steps << " accumulation x " << world
                      << " rank(s)) -> " << options.steps << " steps"
                      << (static_cast<uint64_t>(samples) % batch != 0
                              ? " (the last step takes its remaining rows from the next epoch)"
                              : "");
  }
  return Status::Ok();
}

double Trainer::Impl::EpochOf(uint64_t consumed) const {
  const uint64_t per_epoch = data ? data->Windows(seq_len) : 0;
  return per_epoch == 0 ? 0 : static_cast<double>(consumed) / static_cast<double>(per_epoch);
}

bool Trainer::Impl::CompletedEpoch() const {
  const uint64_t per_epoch = data ? data->Windows(seq_len) : 0;
  const uint64_t batch = global_batch();
  if (per_epoch == 0 || samples < batch) return false;
  return samples / per_epoch > (samples - batch) / per_epoch;
}

Status Trainer::Impl::Resume() {
  // (resume_checkpoint: opened by ClaimSaveDir.)
  STRATA_ASSIGN_OR_RETURN(const TrainingPosition at,
                          ResumeCheckpoint(Checkpoints(), *resume_checkpoint, options.resume));
  step = at.step;
  samples = at.samples;
  // The last evaluation and the best checkpoint of the run so far (--save-best keeps comparing
  // against it). A checkpoint of an older build records neither.
  if (auto it = at.trainer_state.find("eval"); it != at.trainer_state.end()) last_eval = *it;
  if (auto it = at.trainer_state.find("best"); it != at.trainer_state.end()) {
    const nlohmann::json& b = *it;
    if (b.contains("step") && b["step"].is_number_integer() && b.contains("eval_loss") &&
        b["eval_loss"].is_number() && b.contains("tag") && b["tag"].is_string()) {
      best = Trainer::Best{b["step"].get<int64_t>(), b["eval_loss"].get<double>(),
                           b["tag"].get<std::string>()};
      // Saving elsewhere than the resumed checkpoint's directory: the best checkpoint is not
      // there, so it is compared against but not named (nor kept out of pruning).
      if (options.save.empty() || !CheckpointIsIn(options.resume, options.save)) best->tag.clear();
    } else {
      STRATA_LOG(kWarning) << options.resume << ": trainer.json's \"best\" is malformed ("
                           << b.dump() << "): the best checkpoint is chosen afresh";
    }
  }
  return Status::Ok();
}

CheckpointRun Trainer::Impl::Checkpoints() const {
  CheckpointRun c;
  c.engine = engine.get();
  c.comm = comm.get();
  c.model = lm->Identity();
  c.seq_len = seq_len;
  c.seed = options.seed;
  c.micro_batch = config.train_micro_batch_size_per_gpu;
  c.gradient_accumulation_steps = config.gradient_accumulation_steps;
  c.run_id = run_id;
  c.config_text = config_text;
  c.kill_at_save = options.test_hooks.kill_at_save;
  return c;
}

}  // namespace strata::runtime
