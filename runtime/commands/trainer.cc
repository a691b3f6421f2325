// Trainer: see trainer.h.
//
// Create reproduces the order in which a run consumes randomness: the seed is set, then the model
// is built (its initial values), then the engine reads them; Run draws micro-batch i from the text
// by its index alone. Together with the checkpointed step and data position, that is what makes a
// resumed run bitwise equal to a straight one (tests/integration/train_cli_test.cc).
#include "runtime/commands/trainer.h"

#include <torch/torch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/json_text.h"
#include "base/json_values.h"
#include "base/logging.h"
#include "base/trace.h"
#include "runtime/commands/checkpointing.h"
#include "runtime/commands/evaluator.h"
#include "runtime/commands/flag_checks.h"
#include "runtime/commands/model_export.h"
#include "runtime/data/text_data.h"
#include "runtime/data/token_data.h"
#include "runtime/data/training_data.h"
#include "runtime/data/windows.h"
#include "runtime/engine/compute_device.h"
#include "runtime/engine/engine.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/engine/initialize.h"
#include "runtime/models/causal_lm.h"
#include "runtime/persist/checkpoint_store.h"
#include "runtime/persist/hf_export.h"
#include "runtime/commands/save_dir.h"
#include "runtime/plan/machine_info.h"

namespace strata::runtime {
namespace {

// The demo: ZeRO-3 with parameters and optimizer state on NVMe (nvme_path: a scratch directory),
// sized so that both really stream from NVMe every step: the pinned arena (~23 MiB) is a third of
// the state kept on NVMe (~65 MB), with two parameter slots for the small preset's four units
// (each forward and backward reads units back), sub-groups of 2e5 elements of which the optimizer's
// pools hold three (its whole state is read and written every step), and no unit kept in CPU
// memory (max_in_cpu 0; DeepSpeed's default keeps a model this size there entirely). Micro-batch 4
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
  }
})";

// Removes the demo's scratch directory if nothing else is in it (another demo run's swap
// directory may be). Declared before the engine in Impl, so it runs after the engine (and its
// swap space, which removes its own directory) is gone.
struct ScratchDir {
  std::string path;
  ~ScratchDir() {
    if (!path.empty()) ::rmdir(path.c_str());
  }
};

}  // namespace

struct Trainer::Impl {
  TrainerOptions options;
  ScratchDir scratch;
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
  CheckpointRun Checkpoints() const {
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
    return c;
  }
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

void RestartWithPassiveOpenMpWaiting() {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) {
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
    // Started by torchrun or srun, whose output may not say which rank a line comes from:
    // every line this rank logs says it (`strata train --nproc` prefixes lines itself).
    if (world > 1 && std::getenv("STRATA_LAUNCHER_PREFIXES") == nullptr) {
      SetLogPrefix("[rank " + std::to_string(rank) + "] ");
    }
  }
  if (o.seq_len < 0) return InvalidArgumentError("--seq-len must be >= 1");
  STRATA_RETURN_IF_ERROR(ClaimSaveDir());
  if (!o.trace.empty())
    STRATA_RETURN_IF_ERROR(flags::ParseStepRange(o.trace_steps, "--trace-steps", &trace_from, &trace_to));
  Stopwatch build_watch;
  ModelOptions mo;
  mo.spec = o.model;
  mo.seed = o.seed;
  mo.seq_len = o.seq_len;
  STRATA_ASSIGN_OR_RETURN(lm, OpenModel(mo));
  if (!o.save.empty() && !lm->hf_dir().empty()) {  // --save writes SAVE/hf
    STRATA_RETURN_IF_ERROR(CheckOutsideModelDir((std::filesystem::path(o.save) / "hf").string(),
                                                lm->hf_dir(), "--save (its hf/ directory)", true));
  }
  seq_len = o.seq_len > 0 ? o.seq_len
            : lm->family() == "gpt" ? static_cast<int>(lm->max_seq_len())
                                    : kDefaultLlamaSeqLen;
  if (seq_len > lm->max_seq_len()) {
    return InvalidArgumentError("--seq-len " + std::to_string(seq_len) + " is longer than " +
                                o.model + " attends (" + std::to_string(lm->max_seq_len()) +
                                " tokens: its sliding window, which strata does not implement)");
  }
  const int threads =
      o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  torch::set_num_threads(threads);

  // The config: the file, or the demo's with a scratch NVMe directory.
  ParseOptions po;
  po.auto_values = o.auto_values;
  po.auto_values.hidden_size = static_cast<int>(lm->hidden_size());
  po.auto_values.total_num_steps = std::max<int64_t>(o.steps, 1);  // --steps 0: export only
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
    STRATA_LOG(kInfo) << "config: the one checkpoint " << o.resume
                      << " was trained with (give --config to use another)";
  } else if (o.config.empty() && o.no_offload_default) {
    nlohmann::json plain = {{"train_micro_batch_size_per_gpu", "auto"}};
    po.source = "default config (no offload)";
    config_text = plain.dump();
    STRATA_ASSIGN_OR_RETURN(config, ParseConfig(config_text, po));
  } else if (o.config.empty()) {
    // One scratch parent per user, not per run: each run's swap directory inside it is locked
    // while the run lives, and the next demo run (or `strata clean --path` on it) removes those
    // of runs that died (kill -9, a second Ctrl-C, the OOM killer).
    scratch.path = "/tmp/strata-demo-" + std::to_string(getuid());
    if (::mkdir(scratch.path.c_str(), 0700) != 0 && errno != EEXIST) {
      return IoErrorFromErrno(errno, "creating the demo's scratch directory " + scratch.path);
    }
    nlohmann::json demo = nlohmann::json::parse(kDemoConfig);
    demo["zero_optimization"]["offload_param"]["nvme_path"] = scratch.path;
    demo["zero_optimization"]["offload_optimizer"]["nvme_path"] = scratch.path;
    // The demo is ours: a flag the user gives replaces its value instead of contradicting it.
    if (po.given.lr) demo["optimizer"]["params"]["lr"] = *po.given.lr;
    if (po.given.train_micro_batch_size_per_gpu) {
      demo["train_micro_batch_size_per_gpu"] = *po.given.train_micro_batch_size_per_gpu;
    }
    if (po.given.gradient_accumulation_steps) {
      demo["gradient_accumulation_steps"] = *po.given.gradient_accumulation_steps;
    }
    if (po.given.gradient_clipping) demo["gradient_clipping"] = *po.given.gradient_clipping;
    if (po.given.warmup_num_steps) {
      demo["scheduler"]["params"]["warmup_num_steps"] = *po.given.warmup_num_steps;
    }
    po.source = "demo config";
    config_text = demo.dump();
    STRATA_ASSIGN_OR_RETURN(config, ParseConfig(config_text, po));
  } else {
    STRATA_ASSIGN_OR_RETURN(config, LoadConfigFile(o.config, po, &config_text));
  }
  for (const auto& w : config.warnings) STRATA_LOG(kWarning) << w;
  if (!config.auto_resolved.empty()) {
    std::string lines;
    for (const auto& r : config.auto_resolved) lines += "\n  " + r;
    STRATA_LOG(kInfo) << "config: " << config.auto_resolved.size() << " \"auto\" value"
                      << (config.auto_resolved.size() == 1 ? "" : "s") << " resolved:" << lines;
  }

  STRATA_RETURN_IF_ERROR(CheckActivationsFit());
  STRATA_RETURN_IF_ERROR(CheckStop("reading the config and the model"));
  STRATA_RETURN_IF_ERROR(LoadData());
  STRATA_RETURN_IF_ERROR(CheckStop("reading the data"));
  STRATA_RETURN_IF_ERROR(Connect(env));
  STRATA_RETURN_IF_ERROR(CheckStop("meeting the other ranks"));

  // Units are filled one at a time as the engine takes them (causal_lm.h), so host memory never
  // holds the whole model, and the values do not depend on the offload mode. A stop is noticed
  // before each unit (loading a Hugging Face model and writing the initial state to NVMe take
  // minutes for large models).
  InitializeOptions io;
  io.initialize_unit = [this, fill = lm->UnitInitializer()](int unit) -> Status {
    STRATA_RETURN_IF_ERROR(CheckStop(
        (lm->hf_dir().empty() ? "initializing" : "loading") + std::string(" the model (unit ") +
        std::to_string(unit) + " of " + std::to_string(lm->num_units()) + ")"));
    return fill(unit);
  };
  STRATA_RETURN_IF_ERROR(OpenComputeDevice());
  STRATA_ASSIGN_OR_RETURN(io.device_budget, ParseBytes(o.device_memory));
  io.device = device.get();
  io.torch_device = torch_device;
  STRATA_ASSIGN_OR_RETURN(io.host_memory_budget, ParseBytes(o.host_memory));
  io.host_memory_source = "--host-memory";
  io.optimizer_threads = threads;
  // The train command catches signals from its start (a first one stops the run between units or
  // steps, a second removes the swap files and ends it): the swap spaces' own handlers would
  // delete the files under a run still setting up.
  io.swap_signal_handlers = options.stop == nullptr;
  io.communicator = comm;
  io.grad_communicator = grad_comm;
  io.gather_communicator = gather_comm;
  STRATA_ASSIGN_OR_RETURN(engine, Initialize(lm->module(), config, io));
  for (const auto& w : engine->options().warnings) STRATA_LOG(kWarning) << w;
  STRATA_LOG(kInfo) << "model " << lm->Describe() << "; seq " << seq_len << "; params on "
                    << HomeName(engine->options().params) << ", optimizer on "
                    << HomeName(engine->options().optimizer) << "; device "
                    << (device ? device_description
                               : "host (emulated; libtorch computes on the CPU)")
                    << "; pinned arena "
                    << FormatBytes(engine->pinned_arena_bytes()) << "; ready in "
                    << build_watch.Seconds() << " s";
  if (!o.resume.empty()) STRATA_RETURN_IF_ERROR(Resume());
  return CheckStop("preparing the run");
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
  out << "precision=" << (config.fp16.enabled ? "fp16" : config.bf16.enabled ? "bf16" : "fp32")
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
  out << "data=" << data->Fingerprint() << "\n";
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
  STRATA_ASSIGN_OR_RETURN(auto groups, ConnectGloo(*env, 3, timeout, RunSettings()));
  comm = groups[0];
  grad_comm = groups[1];
  gather_comm = groups[2];
  STRATA_LOG(kInfo) << "rank " << rank << " of " << world << " joined " << env->master_addr << ":"
                    << env->master_port << " (gloo) in " << watch.Seconds() << " s";
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
  const uint64_t need = act.checkpoint > UINT64_MAX - act.working ? UINT64_MAX
                                                                   : act.checkpoint + act.working;
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
  const std::string& spec = options.device;
  if (spec == "auto" && world > 1) {
    STRATA_LOG(kInfo) << "device auto: " << world << " ranks train on the host-emulated device "
                      << "(ranks on GPUs need c10d's ProcessGroupNCCL, which strata does not use "
                         "yet)";
    return Status::Ok();
  }
  STRATA_ASSIGN_OR_RETURN(const uint64_t given, ParseBytes(options.device_memory));
  STRATA_ASSIGN_OR_RETURN(ComputeDevice opened, runtime::OpenComputeDevice(spec, given));
  if (opened.device == nullptr) return Status::Ok();  // the host-emulated device
  if (world > 1) {
    return InvalidArgumentError(
        "--device " + spec + " with " + std::to_string(world) +
        " ranks: ranks on GPUs need c10d's ProcessGroupNCCL, which strata does not use yet; "
        "train one rank per GPU machine or use --device host");
  }
  if (given == 0) {
    // The budget CudaDevice took (90% of the free memory) less what libtorch needs beside
    // strata's parameter copies: the activations of a micro-batch and a workspace.
    const ActivationBytes act = MicroBatchActivations();
    const uint64_t reserve = act.checkpoint + act.working + (uint64_t{1} << 30);
    const uint64_t budget = opened.device->info().budget_bytes;
    if (reserve >= budget) {
      return ResourceExhaustedError(
          "--device " + spec + ": " + opened.device->info().name + " has " +
          FormatBytes(budget) +
          " free for strata, less than the activations of a micro-batch and libtorch's "
          "workspace (" + FormatBytes(reserve) +
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

Status Trainer::Impl::LoadData() {
  const TrainerOptions& o = options;
  const bool bytes = lm->family() == "gpt" || (o.data.empty() && lm->hf_dir().empty());
  if (bytes) {
    if (!o.data_dtype.empty()) {
      return InvalidArgumentError("--data-dtype is for .bin token files of Llama-family models");
    }
    STRATA_ASSIGN_OR_RETURN(std::string text, LoadText(o.data));
    if (text.size() < static_cast<size_t>(seq_len) + 2) {
      return InvalidArgumentError("training text (" + std::to_string(text.size()) +
                                  " bytes) is shorter than one sequence of " +
                                  std::to_string(seq_len) + " tokens");
    }
    data = NewByteTextData(std::move(text), o.seed);
    return Status::Ok();
  }
  if (o.data.empty()) {
    return InvalidArgumentError(
        "--data is required with a Hugging Face model: token ids (.bin, uint16/uint32 as "
        "nanoGPT writes them; see `strata tokenize`), or .jsonl with a \"text\" field, or .txt "
        "(tokenized with the model's tokenizer.model)");
  }
  TokenDataOptions to;
  to.path = o.data;
  to.dtype = o.data_dtype;
  to.model_dir = lm->hf_dir();
  to.vocab_size = lm->vocab_size();
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<TokenData> tokens, TokenData::Open(to));
  const uint64_t size = tokens->size();
  const uint64_t windows = WindowCount(size, seq_len);
  if (windows == 0) {
    return InvalidArgumentError(o.data + ": " + std::to_string(size) +
                                " tokens, fewer than one window of --seq-len + 1 = " +
                                std::to_string(seq_len + 1));
  }
  data = NewTokenWindowData(std::move(tokens), seq_len, o.seed);
  STRATA_LOG(kInfo) << "data " << o.data << ": " << size << " tokens, " << windows
                    << " windows of " << seq_len + 1;
  return Status::Ok();
}

Status Trainer::Impl::Resume() {
  // (resume_checkpoint: opened by ClaimSaveDir.)
  STRATA_ASSIGN_OR_RETURN(const TrainingPosition at,
                          ResumeCheckpoint(Checkpoints(), *resume_checkpoint, options.resume));
  step = at.step;
  samples = at.samples;
  return Status::Ok();
}

Status Trainer::Impl::FillMicroBatch(int micro, torch::Tensor* x, torch::Tensor* y) const {
  const int batch = static_cast<int>(config.train_micro_batch_size_per_gpu);
  *x = torch::empty({batch, seq_len}, torch::kLong);
  *y = torch::empty({batch, seq_len}, torch::kLong);
  // The step's global batch is samples [samples, samples + micro × gas × world): micro-batch k of
  // rank r takes rows (k × world + r) × micro onwards.
  const uint64_t first =
      samples + (static_cast<uint64_t>(micro) * world + rank) * static_cast<uint64_t>(batch);
  STRATA_RETURN_IF_ERROR(
      data->Train(batch, seq_len, first, x->data_ptr<int64_t>(), y->data_ptr<int64_t>()));
  if (!torch_device.is_cpu()) {  // to the GPU once per micro-batch
    *x = x->to(torch_device);
    *y = y->to(torch_device);
  }
  return Status::Ok();
}

Result<double> Trainer::Impl::MicroBatch(const torch::Tensor& x, const torch::Tensor& y,
                                         double* forward_seconds, double* backward_seconds) {
  Stopwatch fw;
  torch::Tensor loss;
  try {
    TraceSpan span("compute", "forward");
    loss = lm->Loss(x, y);
  } catch (const std::exception& e) {  // a unit's gather failed (e.g. an NVMe read error)
    return ComputeError("the forward", engine->ErrorFromException(e));
  }
  double value = 0;
  try {
    value = loss.item<double>();  // on a GPU: waits for the forward
  } catch (const std::exception& e) {
    return ComputeError("the forward", engine->ErrorFromException(e));
  }
  *forward_seconds += fw.Seconds();
  Stopwatch bw;
  {
    TraceSpan span("compute", "backward");
    STRATA_RETURN_IF_ERROR(ComputeError("the backward", engine->Backward(loss)));
    STRATA_RETURN_IF_ERROR(ComputeError("the backward", engine->WaitForCompute()));
  }
  *backward_seconds += bw.Seconds();
  return value;
}

Status Trainer::Impl::ComputeError(const std::string& phase, Status s) const {
  if (s.ok()) return s;
  const std::string what(s.message());
  if (what.find("out of memory") == std::string::npos) return s;
  // libtorch's message says what it tried to allocate and what was free; the first line is enough.
  const std::string first = what.substr(0, std::min(what.find('\n'), size_t{400}));
  const uint64_t budget = device != nullptr ? device->info().budget_bytes : 0;
  return ResourceExhaustedError(
      "the device ran out of memory in " + phase + " (" + first + "); strata's parameter copies " +
      "may take " + FormatBytes(budget) + " of it (--device-memory): lower " +
      "train_micro_batch_size_per_gpu or --seq-len, set --device-memory lower, or offload the " +
      "parameters (zero_optimization.offload_param)");
}

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::Create(const TrainerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  STRATA_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

const Config& Trainer::config() const { return impl_->config; }
int64_t Trainer::step() const { return impl_->step; }
int Trainer::seq_len() const { return impl_->seq_len; }
std::string Trainer::model_description() const { return impl_->lm->Describe(); }

Result<RunSummary> Trainer::Run(const std::function<void(const StepReport&)>& on_step,
                                const std::atomic<bool>* stop) {
  Impl& m = *impl_;
  const TrainerOptions& o = m.options;
  const int gas = static_cast<int>(m.config.gradient_accumulation_steps);
  RunSummary summary;
  summary.first_loss = NAN;
  auto stopping = [&]() -> Result<bool> {
    double stop_now = stop != nullptr && stop->load() ? 1 : 0;
    // Ranks stop together (a signal reaches them at different moments), between the same steps.
    if (m.world > 1) STRATA_RETURN_IF_ERROR(m.comm->AllReduceSum(&stop_now, 1));
    return stop_now > 0;
  };
  for (;;) {
    if (m.step >= o.steps) break;
    STRATA_ASSIGN_OR_RETURN(const bool stop_now, stopping());
    if (stop_now) {
      if (m.rank == 0) {
        STRATA_LOG(kWarning) << "interrupted: stopping after step " << m.step
                             << (o.save.empty() ? "" : ", saving a checkpoint first (a second "
                                                       "Ctrl-C ends the process at once)");
      }
      break;
    }
    if (m.step + 1 == m.trace_from) {
      TraceRecorder::Global().Clear();
      TraceRecorder::Global().Enable(true);
    }
    const TierTelemetry before = m.engine->telemetry();
    const PageFaults faults_before = ProcessPageFaults();
    Stopwatch w;
    StepReport r;
    double loss_sum = 0;
    int first_bad = 0;  // the first micro-batch (1-based) whose loss is not finite, or 0
    bool bad_is_nan = false;
    // The step's data is read before its first forward: a token file that changed under the
    // run ends it between steps, where its state can still be saved.
    std::vector<torch::Tensor> xs(gas), ys(gas);
    Status filled;
    for (int micro = 0; micro < gas && filled.ok(); ++micro) {
      filled = m.FillMicroBatch(micro, &xs[micro], &ys[micro]);
    }
    double data_failed = filled.ok() ? 0 : 1;
    if (m.world > 1) STRATA_RETURN_IF_ERROR(m.comm->AllReduceSum(&data_failed, 1));
    if (data_failed > 0) {
      if (filled.ok()) {
        filled = DataLossError("step " + std::to_string(m.step + 1) +
                               ": another rank could not read its training data");
      }
      if (!o.save.empty()) {
        STRATA_LOG(kWarning) << "saving step " << m.step << " before stopping: "
                             << filled.message();
        if (Status saved = Save(); !saved.ok()) {
          STRATA_LOG(kError) << "the save before stopping failed: " << saved.ToString();
        }
      }
      return filled;
    }
    for (int micro = 0; micro < gas; ++micro) {
      STRATA_ASSIGN_OR_RETURN(
          double loss, m.MicroBatch(xs[micro], ys[micro], &r.forward_seconds, &r.backward_seconds));
      if (!std::isfinite(loss) && first_bad == 0) {
        first_bad = micro + 1;
        bad_is_nan = std::isnan(loss);
      }
      loss_sum += loss;
    }
    // The logged loss is the global batch's mean (runs on any number of ranks compare), and ranks
    // decide together whether a loss was not finite, so that they all stop at the same point.
    double sums[2] = {loss_sum, first_bad != 0 ? 1.0 : 0.0};
    if (m.world > 1) STRATA_RETURN_IF_ERROR(m.comm->AllReduceSum(sums, 2));
    // Outside fp16 (whose loss scaler skips the step) a non-finite loss is a diverged or broken
    // run: stop before its gradients reach the optimizer, so the state of the last step (and
    // every checkpoint written so far) stays good.
    if (sums[1] > 0 && !m.config.fp16.enabled) {
      const std::string which =
          first_bad != 0 ? "the loss of micro-batch " + std::to_string(first_bad) + " of " +
                               std::to_string(gas) + " is " + (bad_is_nan ? "NaN" : "infinite") +
                               (m.world > 1 ? " on rank " + std::to_string(m.rank) : "")
                         : "the loss of a micro-batch on another rank is not finite";
      return FailedPreconditionError(
          "step " + std::to_string(m.step + 1) + ": " + which +
          "; training stops before the optimizer step. Parameters and optimizer "
          "state are those of step " + std::to_string(m.step) +
          ", so checkpoints saved before are intact. Lower the learning rate, check the data "
          "and the model's weights, or train in bf16 or with fp16 loss scaling");
    }
    loss_sum = sums[0];
    r.lr = m.engine->learning_rate();
    r.loss_scale = m.engine->loss_scale();  // what the backward passes above multiplied by
    Stopwatch ow;
    STRATA_RETURN_IF_ERROR(m.engine->Step());
    m.samples += static_cast<uint64_t>(m.config.train_micro_batch_size_per_gpu) * gas * m.world;
    r.skipped = m.engine->last_step_skipped();
    r.optimizer_seconds = ow.Seconds();
    r.step_seconds = w.Seconds();
    const PageFaults faults_after = ProcessPageFaults();
    r.minor_faults = faults_after.minor - faults_before.minor;
    r.major_faults = faults_after.major - faults_before.major;
    r.step = ++m.step;
    r.steps = o.steps;
    const TierTelemetry after = m.engine->telemetry();
    r.nvme_read_bytes = after.nvme_to_pinned - before.nvme_to_pinned;
    r.nvme_written_bytes = after.pinned_to_nvme - before.pinned_to_nvme;
    r.read_retries = after.read_retries - before.read_retries;
    r.loss = loss_sum / (static_cast<double>(gas) * m.world);
    if (std::isnan(summary.first_loss)) summary.first_loss = r.loss;
    r.tokens =
        static_cast<double>(m.config.train_micro_batch_size_per_gpu) * gas * m.world * m.seq_len;
    r.tokens_per_second = r.tokens / r.step_seconds;
    if (r.step == m.trace_to) {
      TraceRecorder::Global().Enable(false);
      STRATA_RETURN_IF_ERROR(TraceRecorder::Global().WriteJson(o.trace));
      STRATA_LOG(kInfo) << "wrote the Chrome trace of steps " << o.trace_steps << " to " << o.trace;
    }
    r.grad_norm = m.engine->last_grad_norm();
    const Engine::Occupancy occ = m.engine->occupancy();
    r.device_used_bytes = occ.device_used;
    r.device_budget_bytes = occ.device_budget;
    r.device_peak_bytes = occ.device_peak;
    r.device = m.device_description;
    r.pinned_used_bytes = occ.pinned_used;
    r.pinned_capacity_bytes = occ.pinned_capacity;
    const StepTimes& times = m.engine->times();
    r.gather_wait_seconds = times.gather_wait_seconds;
    r.grad_wait_seconds = times.grad_wait_seconds;
    r.engine_optimizer_seconds = times.optimizer_seconds;
    // The waits for the previous step's deferred updates were spent in forward (gathers) and at
    // Backward's start: they are optimizer time.
    r.optimizer_wait_seconds = times.optimizer_wait_seconds;
    const double from_forward = std::min(r.forward_seconds, r.optimizer_wait_seconds);
    r.forward_seconds -= from_forward;
    r.backward_seconds = std::max(0.0, r.backward_seconds - (r.optimizer_wait_seconds - from_forward));
    r.optimizer_seconds += r.optimizer_wait_seconds;
    if (on_step) on_step(r);
    if (!o.save.empty() && o.save_every > 0 && r.step % o.save_every == 0 && r.step < o.steps) {
      STRATA_RETURN_IF_ERROR(Save());
    }
  }
  summary.step = m.step;
  summary.interrupted = m.step < o.steps;
  return summary;
}

Status Trainer::Save() {
  Impl& m = *impl_;
  const std::string& dir = m.options.save;
  if (dir.empty()) return FailedPreconditionError("Trainer::Save without a checkpoint directory");
  Stopwatch w;
  STRATA_RETURN_IF_ERROR(SaveCheckpoint(m.Checkpoints(), dir, {m.step, m.samples}));
  // Rank 0 alone prunes; its error is returned after the export, whose gathers every rank takes
  // part in.
  Status pruned;
  if (m.rank == 0) pruned = PruneRunCheckpoints(dir, m.run_id);
  if (m.lm->HfConfig().is_null()) {
    STRATA_RETURN_IF_ERROR(m.engine->ExportSafetensors(
        dir + "/model.safetensors",
        {{"format", "pt"}, {"step", std::to_string(m.step)}, {"model", m.options.model}}));
    if (m.rank == 0) {
      STRATA_LOG(kInfo) << "saved step " << m.step << " to " << dir << " (and " << dir
                        << "/model.safetensors) in " << w.Seconds() << " s";
    }
  } else {
    ExportOptions eo;
    eo.dir = dir + "/hf";
    eo.dtype = m.options.save_export_dtype;
    eo.max_shard_size = m.options.save_max_shard_size;
    STRATA_RETURN_IF_ERROR(Export(eo));
    if (m.rank == 0) {
      STRATA_LOG(kInfo) << "saved step " << m.step << " to " << dir << " (and the Hugging Face "
                        << "directory " << eo.dir << ") in " << w.Seconds() << " s";
    }
  }
  return pruned;
}

Status Trainer::CheckExport(const ExportOptions& eo) const {
  return CheckHfExport(*impl_->lm, impl_->options.model, eo);
}

Status Trainer::Export(const ExportOptions& eo) {
  Impl& m = *impl_;
  return ExportHf(*m.engine, *m.lm, m.options.model, m.rank, m.world, m.options.stop, eo);
}

Result<EvalReport> Trainer::Evaluate(int64_t max_batches) {
  Impl& m = *impl_;
  Evaluation e;
  e.engine = m.engine.get();
  e.lm = m.lm.get();
  e.data = m.data.get();
  e.batch = static_cast<int>(m.config.train_micro_batch_size_per_gpu);
  e.seq_len = m.seq_len;
  e.device = m.torch_device;
  e.compute_error = [&m](const std::string& phase, Status s) {
    return m.ComputeError(phase, std::move(s));
  };
  return runtime::Evaluate(e, max_batches);
}

}  // namespace strata::runtime
