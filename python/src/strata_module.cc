// strata._C: the Python package's compiled part, a thin layer over runtime::Engine.
//
// A Python model is handed over as its offload units (each unit's parameters by name, relative to
// the unit) and its resident parameters. Engine builds a libtorch module tree that holds the very
// same tensors (the Python parameters share their TensorImpl with the C++ ones), with an
// OffloadUnit at each unit's path, so the engine's layout, names, checkpoints and exports are the
// Python model's. The Python side (strata/_units.py) drives the units: it calls gather/release
// and gradients_ready around each unit's forward and its recomputing backward, the way
// offload_unit.cc does for C++ models; the C++ OffloadUnits' own forward is never called.
//
// Errors: every failing Status is raised as the Python exception strata.errors maps its code to
// (one table, strata/errors.py), with the code and message; a hook's failure inside libtorch
// comes back with its code through Engine::ErrorFromException.
//
// Threads and the GIL: every call comes from the Python thread that trains. Calls that may wait
// (backward, step, gather, checkpoints, exports, Create) release the GIL; the Python callbacks
// they make (a unit's recomputation inside backward, initialize_unit) take it again.
#include <malloc.h>
#include <torch/extension.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/bytes.h"
#include "base/status.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/commands/checkpointing.h"
#include "runtime/commands/flag_checks.h"
#include "runtime/commands/model_export.h"
#include "runtime/commands/save_dir.h"
#include "runtime/config/config.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/host_tensor_cache.h"
#include "runtime/engine/initialize.h"
#include "runtime/engine/offload_unit.h"
#include "runtime/models/causal_lm.h"
#include "runtime/persist/checkpoint_store.h"
#include "tiers/tier.h"

namespace py = pybind11;

namespace strata::python {
namespace {

using runtime::Engine;

// A failing Status on its way to Python (translated by the translator registered below).
struct StatusException {
  Status status;
};

void ThrowIfError(Status s) {
  if (!s.ok()) throw StatusException{std::move(s)};
}

template <typename T>
T ValueOrThrow(Result<T> r) {
  if (!r.ok()) throw StatusException{r.status()};
  return std::move(*r);
}

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

std::vector<std::string> SplitPath(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = path.find('.', start);
    const size_t end = dot == std::string::npos ? path.size() : dot;
    parts.push_back(path.substr(start, end - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

// Builds nested plain modules under a root as dotted names ask for them.
class ModuleTree {
 public:
  explicit ModuleTree(std::shared_ptr<torch::nn::Module> root) { modules_[""] = std::move(root); }

  // The module at dotted `path` (created, with its parents, if missing).
  std::shared_ptr<torch::nn::Module> At(const std::string& path) {
    if (auto it = modules_.find(path); it != modules_.end()) return it->second;
    const size_t dot = path.rfind('.');
    const std::string parent = dot == std::string::npos ? "" : path.substr(0, dot);
    const std::string leaf = dot == std::string::npos ? path : path.substr(dot + 1);
    auto m = std::make_shared<torch::nn::Module>("Module");
    At(parent)->register_module(leaf, m);
    modules_[path] = m;
    return m;
  }
  void Put(const std::string& path, std::shared_ptr<torch::nn::Module> m) {
    const size_t dot = path.rfind('.');
    const std::string parent = dot == std::string::npos ? "" : path.substr(0, dot);
    const std::string leaf = dot == std::string::npos ? path : path.substr(dot + 1);
    At(parent)->register_module(leaf, m);
    modules_[path] = std::move(m);
  }
  void AddParameter(const std::string& name, const torch::Tensor& t) {
    const size_t dot = name.rfind('.');
    const std::string parent = dot == std::string::npos ? "" : name.substr(0, dot);
    const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
    At(parent)->register_parameter(leaf, t, t.requires_grad());
  }

 private:
  std::map<std::string, std::shared_ptr<torch::nn::Module>> modules_;
};

// The config as strata.initialize's options resolve its "auto" values.
Result<runtime::Config> ParseConfigFor(const std::string& text, const nlohmann::json& o,
                                       int world) {
  runtime::ParseOptions po;
  po.source = o.value("config_source", std::string("config"));
  po.world_size = world;
  po.auto_values = runtime::DefaultAutoValues();
  if (o.contains("micro_batch")) po.auto_values.train_micro_batch_size_per_gpu = o["micro_batch"];
  if (o.contains("hidden_size")) po.auto_values.hidden_size = o["hidden_size"];
  if (o.contains("total_num_steps")) po.auto_values.total_num_steps = o["total_num_steps"];
  if (o.contains("lr")) po.auto_values.lr = o["lr"];
  if (o.contains("weight_decay")) po.auto_values.weight_decay = o["weight_decay"];
  if (o.contains("eps")) po.auto_values.eps = o["eps"];
  if (o.contains("betas")) po.auto_values.betas = {o["betas"][0], o["betas"][1]};
  return runtime::ParseConfig(text, po);
}

int WorldFromEnvironment() {
  const std::optional<runtime::DistEnv> env = ValueOrThrow(runtime::DistEnvFromEnvironment());
  return env ? env->world_size : 1;
}

// What the Python side needs before it builds the engine (the units, the batch sizes).
py::dict ParseConfigDict(const std::string& text, const std::string& options_json) {
  const nlohmann::json o = nlohmann::json::parse(options_json);
  const runtime::Config c = ValueOrThrow(ParseConfigFor(text, o, WorldFromEnvironment()));
  py::dict d;
  d["train_batch_size"] = c.train_batch_size;
  d["train_micro_batch_size_per_gpu"] = c.train_micro_batch_size_per_gpu;
  d["gradient_accumulation_steps"] = c.gradient_accumulation_steps;
  d["offload_unit_classes"] = c.strata.offload_unit_classes;
  d["has_optimizer"] = c.optimizer.has_value();
  d["bf16"] = c.bf16.enabled;
  d["fp16"] = c.fp16.enabled;
  d["has_scheduler"] = c.scheduler.has_value();
  d["warnings"] = c.warnings;
  d["auto_resolved"] = c.auto_resolved;
  return d;
}

Status CheckName(const std::string& name) {
  for (const std::string& part : SplitPath(name)) {
    if (part.empty()) return InvalidArgumentError("parameter or module name '" + name + "'");
  }
  return Status::Ok();
}

class PyEngine {
 public:
  // `units`: (path, [(name relative to the unit, tensor)]); `resident`: [(name, tensor)];
  // `options_json`: what a DeepSpeed config cannot say (see strata/_engine.py);
  // `initialize_unit`: None or a callable(unit index) filling that unit's parameters.
  PyEngine(const std::vector<std::pair<std::string, NamedTensors>>& units,
           const NamedTensors& resident, const std::string& config_text,
           const std::string& options_json, py::object initialize_unit) {
    const nlohmann::json o = nlohmann::json::parse(options_json);
    auto root = std::make_shared<torch::nn::Module>("PythonModel");
    ModuleTree tree(root);
    nlohmann::json identity = nlohmann::json::array();
    for (const auto& [path, params] : units) {
      ThrowIfError(CheckName(path));
      auto inner = std::make_shared<torch::nn::Module>("Unit");
      ModuleTree inner_tree(inner);
      for (const auto& [name, t] : params) {
        ThrowIfError(CheckName(name));
        inner_tree.AddParameter(name, t);
        identity.push_back({path + "." + name, t.sizes().vec()});
      }
      OffloadUnitImpl::RunFn run = [path](const torch::Tensor&, const UnitInputs&) {
        TORCH_CHECK(false, "offload unit ", path, " is run from Python");
        return torch::Tensor();
      };
      tree.Put(path, OffloadUnit(inner, std::move(run)).ptr());
    }
    for (const auto& [name, t] : resident) {
      ThrowIfError(CheckName(name));
      tree.AddParameter(name, t);
      identity.push_back({name, t.sizes().vec()});
    }
    nlohmann::json model_identity = {
        {"python_model", o.value("model_class", std::string("torch.nn.Module"))},
        {"parameters", identity}};
    std::function<Status(int)> init;
    if (!initialize_unit.is_none()) {
      initialize_unit_ = initialize_unit;
      init = [this](int unit) -> Status {
        py::gil_scoped_acquire acquire;
        try {
          initialize_unit_(unit);
        } catch (py::error_already_set& e) {
          return InvalidArgumentError("initializing offload unit " + std::to_string(unit) + ": " +
                                      e.what());
        }
        return Status::Ok();
      };
    }
    Start(root, std::move(model_identity), config_text, o, std::move(init));
  }

  // A model strata builds itself (runtime/models: a GPT or Llama-family preset, or a Hugging Face
  // directory streamed into the tiers unit by unit): strata.from_pretrained.
  PyEngine(const std::string& model, const std::string& config_text,
           const std::string& options_json) {
    const nlohmann::json o = nlohmann::json::parse(options_json);
    runtime::ModelOptions mo;
    mo.spec = model;
    mo.seed = o.value("seed", uint64_t{1234});
    mo.seq_len = o.value("seq_len", int64_t{0});
    {
      py::gil_scoped_release release;
      lm_ = ValueOrThrow(runtime::OpenModel(mo));
    }
    model_spec_ = model;
    nlohmann::json with_hidden = o;
    if (!with_hidden.contains("hidden_size")) with_hidden["hidden_size"] = lm_->hidden_size();
    Start(lm_->module(), lm_->Identity(), config_text, with_hidden, lm_->UnitInitializer());
  }

  // The rest of construction, for either kind of model.
  void Start(std::shared_ptr<torch::nn::Module> root, nlohmann::json identity,
             const std::string& config_text, const nlohmann::json& o,
             std::function<Status(int)> initialize_unit) {
    model_identity_ = std::move(identity);
    seq_len_ = o.value("seq_len", 0) > 0 ? o.value("seq_len", 0) : 1;
    // Ranks, as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
    const std::optional<runtime::DistEnv> env = ValueOrThrow(runtime::DistEnvFromEnvironment());
    const int world = env ? env->world_size : 1;

    config_text_ = config_text;
    config_ = ValueOrThrow(ParseConfigFor(config_text, o, world));
    for (const std::string& w : config_.warnings) warnings_.push_back(w);
    for (const std::string& r : config_.auto_resolved) auto_resolved_.push_back(r);

    if (world > 1) {
      const auto timeout = std::chrono::seconds(config_.strata.comms_timeout_seconds);
      py::gil_scoped_release release;
      auto groups = ValueOrThrow(
          runtime::ConnectGloo(*env, 3, timeout, "model=" + model_identity_.dump() + "\n"));
      comm_ = groups[0];
      grad_comm_ = groups[1];
      gather_comm_ = groups[2];
    } else {
      comm_ = runtime::MakeSingleRankCommunicator();
      grad_comm_ = runtime::MakeSingleRankCommunicator();
    }

    runtime::InitializeOptions io;
    io.device_budget = o.value("device_memory", uint64_t{0});
    io.pinned_bytes = o.value("pinned_memory", uint64_t{0});
    io.host_memory_budget = o.value("host_memory", uint64_t{0});
    io.host_memory_source = "strata.initialize(host_memory=...)";
    io.io_backend = o.value("io_backend", std::string("auto"));
    io.keep_swap_files = o.value("keep_swap_files", false);
    // Python's own SIGINT handling stays (KeyboardInterrupt); the swap files are removed when the
    // engine is closed or the interpreter exits (swap_cleanup.h's exit hook).
    io.swap_signal_handlers = false;
    io.optimizer_threads = o.value("optimizer_threads", 0);
    io.communicator = comm_;
    io.grad_communicator = grad_comm_;
    io.gather_communicator = gather_comm_;
    io.initialize_unit = std::move(initialize_unit);
    // strata's own model (from_pretrained) steps experts without tokens as transformers 5 does;
    // a Python model's parameters without .grad are skipped, as torch.optim skips them.
    io.step_without_gradient = lm_ != nullptr;
    model_ = root;
    for (const auto& m : model_->modules()) {
      num_units_ += dynamic_cast<OffloadUnitImpl*>(m.get()) != nullptr;
    }
    {
      py::gil_scoped_release release;
      engine_ = ValueOrThrow(runtime::Initialize(model_, config_, io));
    }
    for (const std::string& w : engine_->options().warnings) warnings_.push_back(w);
    ThrowIfError(NewRunIdInto());
  }

  ~PyEngine() { Close(); }

  void Close() {
    if (engine_ == nullptr) return;
    py::gil_scoped_release release;
    engine_.reset();
  }

  Engine& engine() {
    if (engine_ == nullptr) {
      throw StatusException{FailedPreconditionError("this strata engine was closed")};
    }
    return *engine_;
  }

  // The offload units' hooks (strata/_units.py).
  void Gather(int unit, bool tracked) {
    Engine& e = engine();
    CheckUnit(unit);
    py::gil_scoped_release release;
    try {
      e.Gather(unit, tracked);
    } catch (const std::exception& ex) {
      ThrowIfError(e.ErrorFromException(ex));
    }
  }
  void Release(int unit) {
    Engine& e = engine();
    CheckUnit(unit);
    try {
      e.Release(unit);
    } catch (const std::exception& ex) {
      ThrowIfError(e.ErrorFromException(ex));
    }
  }
  std::vector<torch::Tensor> GradParameters(int unit) {
    CheckUnit(unit);
    return engine().GradParameters(unit);
  }
  void GradientsReady(int unit, std::vector<std::optional<torch::Tensor>> grads) {
    Engine& e = engine();
    CheckUnit(unit);
    if (grads.size() != e.GradParameters(unit).size()) {
      throw StatusException{InvalidArgumentError(
          "unit " + std::to_string(unit) + ": " + std::to_string(grads.size()) + " gradients for " +
          std::to_string(e.GradParameters(unit).size()) + " parameters")};
    }
    std::vector<torch::Tensor> g;
    g.reserve(grads.size());
    for (auto& t : grads) g.push_back(t ? std::move(*t) : torch::Tensor());
    py::gil_scoped_release release;
    try {
      e.GradientsReady(unit, std::move(g));
    } catch (const std::exception& ex) {
      ThrowIfError(e.ErrorFromException(ex));
    }
  }

  void Backward(const torch::Tensor& loss) {
    Engine& e = engine();
    Status s;
    {
      py::gil_scoped_release release;
      s = e.Backward(loss);
    }
    // A Python exception raised in a unit's backward (the package keeps it and raises it again)
    // can leave the interpreter's error indicator set on its way through libtorch.
    if (!s.ok() && PyErr_Occurred() != nullptr) PyErr_Clear();
    ThrowIfError(std::move(s));
  }
  void Step() {
    Engine& e = engine();
    py::gil_scoped_release release;
    ThrowIfError(e.Step());
  }
  void FinishStep() {
    Engine& e = engine();
    py::gil_scoped_release release;
    ThrowIfError(e.FinishStep());
  }

  // Returns the tag written.
  std::string SaveCheckpoint(const std::string& root, const std::string& tag,
                             const std::optional<py::bytes>& client_state) {
    Engine& e = engine();
    runtime::CheckpointRun run = Run();
    run.tag = tag.empty() ? "global_step" + std::to_string(e.global_steps()) : tag;
    if (client_state) run.extra_entries.emplace_back("client_state.pt", std::string(*client_state));
    runtime::TrainingPosition at;
    at.step = e.global_steps();
    at.samples =
        static_cast<uint64_t>(e.global_steps()) * static_cast<uint64_t>(config_.train_batch_size);
    py::gil_scoped_release release;
    ThrowIfError(runtime::SaveCheckpoint(run, root, at));
    return run.tag;
  }

  // (tag, client_state bytes or None).
  std::pair<std::string, py::object> LoadCheckpoint(const std::string& root,
                                                    const std::string& tag) {
    Engine& e = engine();
    std::optional<runtime::CheckpointReader> reader;
    std::string client;
    bool has_client = false;
    {
      py::gil_scoped_release release;
      reader.emplace(ValueOrThrow(runtime::CheckpointReader::Open(root, tag)));
      const std::string name = reader->dir();
      runtime::CheckpointRun run = Run();
      ValueOrThrow(runtime::ResumeCheckpoint(run, *reader, name));
      if (reader->HasEntry("client_state.pt")) {
        const uint64_t size = ValueOrThrow(reader->EntrySize("client_state.pt"));
        client.resize(size);
        ThrowIfError(reader->ReadEntry("client_state.pt", 0, client.data(), size));
        has_client = true;
      }
    }
    (void)e;
    return {reader->tag(), has_client ? py::object(py::bytes(client)) : py::none()};
  }

  void ExportSafetensors(const std::string& path) {
    Engine& e = engine();
    py::gil_scoped_release release;
    ThrowIfError(e.ExportSafetensors(path));
  }
  NamedTensors ParameterValues() {
    Engine& e = engine();
    py::gil_scoped_release release;
    return ValueOrThrow(e.ParameterValues());
  }

  // strata.from_pretrained's model: loss of predicting `targets` from `ids` ([B, T] int64), and
  // the logits.
  torch::Tensor Loss(const torch::Tensor& ids, const torch::Tensor& targets) {
    Engine& e = engine();
    CheckNative();
    py::gil_scoped_release release;
    try {
      return lm_->Loss(ids, targets);
    } catch (const std::exception& ex) {
      ThrowIfError(e.ErrorFromException(ex));
    }
    return {};
  }
  torch::Tensor Logits(const torch::Tensor& ids) {
    Engine& e = engine();
    CheckNative();
    py::gil_scoped_release release;
    try {
      return lm_->Logits(ids);
    } catch (const std::exception& ex) {
      ThrowIfError(e.ErrorFromException(ex));
    }
    return {};
  }
  // A Hugging Face directory of the current weights (Llama-family models).
  void SavePretrained(const std::string& dir, const std::string& dtype,
                      const std::string& max_shard_size) {
    Engine& e = engine();
    CheckNative();
    runtime::ExportOptions eo;
    eo.dir = dir;
    eo.dtype = dtype;
    eo.max_shard_size = max_shard_size;
    ThrowIfError(runtime::CheckHfExport(*lm_, model_spec_, eo));
    py::gil_scoped_release release;
    ThrowIfError(
        runtime::ExportHf(e, *lm_, model_spec_, comm_->rank(), comm_->world_size(), nullptr, eo));
  }
  py::dict ModelInfo() {
    CheckNative();
    py::dict d;
    d["family"] = lm_->family();
    d["description"] = lm_->Describe();
    d["parameters"] = lm_->num_parameters();
    d["vocab_size"] = lm_->vocab_size();
    d["hidden_size"] = lm_->hidden_size();
    d["max_seq_len"] = lm_->max_seq_len();
    d["hf_dir"] = lm_->hf_dir();
    return d;
  }

  py::dict Info() {
    Engine& e = engine();
    py::dict d;
    d["offloaded"] = e.offloaded();
    d["params"] = std::string(HomeName(e.options().params));
    d["optimizer"] = std::string(HomeName(e.options().optimizer));
    d["train_batch_size"] = config_.train_batch_size;
    d["train_micro_batch_size_per_gpu"] = config_.train_micro_batch_size_per_gpu;
    d["gradient_accumulation_steps"] = config_.gradient_accumulation_steps;
    d["gradient_clipping"] = config_.gradient_clipping;
    d["world_size"] = comm_->world_size();
    d["rank"] = comm_->rank();
    d["warnings"] = warnings_;
    d["auto_resolved"] = auto_resolved_;
    d["pinned_arena_bytes"] = e.pinned_arena_bytes();
    const Engine::Occupancy occ = e.occupancy();
    d["device_peak_bytes"] = occ.device_peak;
    d["device_budget_bytes"] = occ.device_budget;
    const TierTelemetry t = e.telemetry();
    d["nvme_read_bytes"] = t.nvme_to_pinned;
    d["nvme_write_bytes"] = t.pinned_to_nvme;
    // The host-emulated device's cache of freed large CPU tensors (host_tensor_cache.h).
    d["host_tensor_cache_bytes"] = runtime::HostTensorCache::stats().cached_bytes;
    return d;
  }

  int64_t global_steps() { return engine().global_steps(); }
  int64_t micro_steps() { return engine().micro_steps(); }
  int64_t applied_steps() { return engine().applied_steps(); }
  int64_t skipped_steps() { return engine().skipped_steps(); }
  double learning_rate() { return engine().learning_rate(); }
  double loss_scale() { return engine().loss_scale(); }
  double last_grad_norm() { return engine().last_grad_norm(); }
  bool last_step_skipped() { return engine().last_step_skipped(); }
  int num_units() const { return num_units_; }

 private:
  void CheckNative() {
    if (lm_ == nullptr) {
      throw StatusException{
          FailedPreconditionError("this engine trains a Python model: call the model itself")};
    }
  }
  void CheckUnit(int unit) {
    if (unit < 0 || unit >= num_units() || !engine().offloaded()) {
      throw StatusException{
          InvalidArgumentError("no offload unit " + std::to_string(unit) + " in this engine")};
    }
  }
  Status NewRunIdInto() {
    STRATA_ASSIGN_OR_RETURN(run_id_, runtime::NewRunId());
    return Status::Ok();
  }
  runtime::CheckpointRun Run() {
    runtime::CheckpointRun run;
    run.engine = engine_.get();
    run.comm = comm_.get();
    run.model = model_identity_;
    run.seq_len = seq_len_;  // the model's sequence length when given (checked at resume)
    run.micro_batch = config_.train_micro_batch_size_per_gpu;
    run.gradient_accumulation_steps = config_.gradient_accumulation_steps;
    run.run_id = run_id_;
    run.config_text = config_text_;
    return run;
  }

  std::shared_ptr<torch::nn::Module> model_;
  nlohmann::json model_identity_;
  runtime::Config config_;
  std::string config_text_;
  std::string run_id_;
  std::vector<std::string> warnings_, auto_resolved_;
  std::shared_ptr<runtime::Communicator> comm_, grad_comm_, gather_comm_;
  py::object initialize_unit_;
  std::unique_ptr<runtime::CausalLm> lm_;  // strata.from_pretrained's model; null for Python's
  std::string model_spec_;
  int seq_len_ = 1;
  int num_units_ = 0;
  // Declared last: destroyed first, while the model it trains still exists.
  std::unique_ptr<Engine> engine_;
};

uint64_t ParseByteSize(const std::string& text) { return ValueOrThrow(ParseBytes(text)); }

// strata.initialize / from_pretrained's memory sizes: the range the command's --device-memory,
// --pinned-memory and --host-memory flags accept (flags::ByteSize), named by the keyword.
uint64_t CheckedByteSize(const std::string& text, const std::string& what) {
  Result<uint64_t> r = runtime::flags::ParseByteSizeIn(text, 0, runtime::flags::kMaxBytes);
  if (!r.ok()) ThrowIfError(r.status().WithContext(what));
  return *r;
}

// strata.initialize(config=PATH): the file as the command's --config reads it (runtime/config).
py::bytes ReadConfigBytes(const std::string& path) {
  std::string text;
  {
    py::gil_scoped_release release;
    ThrowIfError(runtime::ReadConfigFile(path, &text));
  }
  return py::bytes(text);
}

}  // namespace
}  // namespace strata::python

PYBIND11_MODULE(_C, m) {
  using strata::python::PyEngine;
  m.doc() = "strata's engine (the compiled part of the strata package)";
  // Host memory must not grow with the model (ARCHITECTURE.md §1). glibc's mmap threshold rises
  // as large blocks are freed, moving them into the heap, where a unit's initial values (freed as
  // the engine takes them) and each backward's per-unit gradients, interleaved with longer-lived
  // Python and autograd objects, left the heap fragmented in proportion to the layers: +43 MiB of
  // peak RSS for 20 more layers of d=256 (tests/python/test_large_models.py), 3 MiB with this. A
  // fixed 256 KiB threshold keeps every block from a unit-sized gradient up as its own mapping
  // (blocks of 1 MiB and more go to the host tensor cache first, host_tensor_cache.h); the trim
  // slack is the strata binary's (tools/strata/main.cc). Process-wide: set at import.
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const strata::python::StatusException& e) {
      if (PyErr_Occurred() != nullptr) PyErr_Clear();  // this exception replaces it
      py::object make = py::module_::import("strata.errors").attr("_from_status");
      py::object exc = make(std::string(strata::StatusCodeName(e.status.code())),
                            std::string(e.status.message()), e.status.sys_errno());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });
  m.def("parse_bytes", &strata::python::ParseByteSize, "bytes in a size such as '2G' or '512M'");
  m.def("byte_size", &strata::python::CheckedByteSize,
        "a memory size keyword's bytes, range-checked as the command's flags are");
  m.def("read_config_file", &strata::python::ReadConfigBytes,
        "a config file's bytes, read as `strata train --config` reads it");
  m.def("parse_config", &strata::python::ParseConfigDict,
        "the DeepSpeed config's resolved batch sizes and strata keys (raises on a bad config)");
  py::class_<PyEngine>(m, "Engine")
      .def(py::init<const std::vector<std::pair<std::string, strata::python::NamedTensors>>&,
                    const strata::python::NamedTensors&, const std::string&, const std::string&,
                    py::object>())
      .def(py::init<const std::string&, const std::string&, const std::string&>())
      .def("close", &PyEngine::Close)
      .def("loss", &PyEngine::Loss)
      .def("logits", &PyEngine::Logits)
      .def("save_pretrained", &PyEngine::SavePretrained)
      .def("model_info", &PyEngine::ModelInfo)
      .def("gather", &PyEngine::Gather)
      .def("release", &PyEngine::Release)
      .def("grad_parameters", &PyEngine::GradParameters)
      .def("gradients_ready", &PyEngine::GradientsReady)
      .def("backward", &PyEngine::Backward)
      .def("step", &PyEngine::Step)
      .def("finish_step", &PyEngine::FinishStep)
      .def("save_checkpoint", &PyEngine::SaveCheckpoint)
      .def("load_checkpoint", &PyEngine::LoadCheckpoint)
      .def("export_safetensors", &PyEngine::ExportSafetensors)
      .def("parameter_values", &PyEngine::ParameterValues)
      .def("info", &PyEngine::Info)
      .def_property_readonly("global_steps", &PyEngine::global_steps)
      .def_property_readonly("micro_steps", &PyEngine::micro_steps)
      .def_property_readonly("applied_steps", &PyEngine::applied_steps)
      .def_property_readonly("skipped_steps", &PyEngine::skipped_steps)
      .def_property_readonly("learning_rate", &PyEngine::learning_rate)
      .def_property_readonly("loss_scale", &PyEngine::loss_scale)
      .def_property_readonly("last_grad_norm", &PyEngine::last_grad_norm)
      .def_property_readonly("last_step_skipped", &PyEngine::last_step_skipped)
      .def_property_readonly("num_units", &PyEngine::num_units);
}
