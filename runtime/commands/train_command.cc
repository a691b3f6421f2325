// `strata train`: trains the byte-level GPT (runtime/gpt.h) with the engine, as a DeepSpeed config
// says. Without flags it runs the demo: the "small" preset with parameters and optimizer state on
// NVMe (a scratch directory under /tmp), on the English texts of Debian's `fortunes` package.
//
// Data: the text is one byte stream; micro-batch i of the run takes its sequences at offsets drawn
// from a counter-based hash of (seed, i, row), so the data position is just the number of
// micro-batches consumed and a resumed run sees exactly the batches the straight run would.
// Checkpoints (--save DIR): DIR/step-N/ via CheckpointWriter (engine state + trainer.json), the
// `latest` pointer, the two newest kept, and DIR/model.safetensors (consolidated fp32 weights).
// Ctrl-C (SIGINT/SIGTERM) finishes the current step, saves if --save is set, and exits 130.
#include <CLI/CLI.hpp>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/logging.h"
#include "base/trace.h"
#include "runtime/persist/checkpoint_store.h"
#include "runtime/commands/commands.h"
#include "runtime/config/config.h"
#include "runtime/engine/engine.h"
#include "runtime/models/gpt.h"
#include "runtime/engine/initialize.h"
#include "runtime/plan/model_presets.h"

namespace strata::runtime {
namespace {

constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

struct TrainFlags {
  std::string config;
  std::string model = "small";
  std::string data;
  int64_t steps = 120;
  std::string save;
  int64_t save_every = 0;
  std::string resume;
  std::string trace;
  std::string trace_steps = "2";
  std::string log_json;
  int seq_len = 0;
  std::string device_memory = "0";
  int threads = 0;
  uint64_t seed = 1234;
  bool quiet = false;
};

std::atomic<int> g_stop{0};
void OnSignal(int) { g_stop.store(1); }

const char* kDemoConfig = R"({
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "steps_per_print": 20,
  "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 10}},
  "zero_optimization": {
    "stage": 3,
    "stage3_param_persistence_threshold": 1e4,
    "offload_param": {"device": "nvme", "nvme_path": "NVME"},
    "offload_optimizer": {"device": "nvme", "nvme_path": "NVME"}
  }
})";

Result<std::string> LoadText(const std::string& path) {
  std::string text;
  auto read_file = [&](const std::filesystem::path& p) -> Status {
    std::ifstream f(p, std::ios::binary);
    if (!f) return IoErrorFromErrno(errno, "reading " + p.string());
    text.append(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    return Status::Ok();
  };
  if (path.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(kFortunesDir, ec)) {
      return NotFoundError(std::string("no --data file and the default text (") + kFortunesDir +
                           ", Debian package `fortunes`) is missing: run scripts/setup.sh or "
                           "apt-get install fortunes, or pass --data FILE");
    }
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(kFortunesDir, ec)) {
      if (e.is_regular_file() && !e.path().has_extension()) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& p : files) STRATA_RETURN_IF_ERROR(read_file(p));
    return text;
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return NotFoundError("--data " + path + ": no such file");
  }
  STRATA_RETURN_IF_ERROR(read_file(path));
  return text;
}

uint64_t Hash(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Micro-batch `index`: [batch, seq] inputs and the next-byte targets.
std::pair<torch::Tensor, torch::Tensor> MakeBatch(const std::string& text, int batch, int seq,
                                                  uint64_t seed, uint64_t index) {
  torch::Tensor x = torch::empty({batch, seq}, torch::kLong);
  torch::Tensor y = torch::empty({batch, seq}, torch::kLong);
  auto* xp = x.data_ptr<int64_t>();
  auto* yp = y.data_ptr<int64_t>();
  const uint64_t span = text.size() - seq;  // > 0: checked by the caller
  for (int b = 0; b < batch; ++b) {
    const uint64_t off = Hash(seed ^ Hash(index * 1024 + b)) % span;
    for (int t = 0; t < seq; ++t) {
      xp[b * seq + t] = static_cast<unsigned char>(text[off + t]);
      yp[b * seq + t] = static_cast<unsigned char>(text[off + t + 1]);
    }
  }
  return {x, y};
}

std::string Rate(double bytes, double seconds) {
  return seconds > 0 ? FormatGbps(bytes / seconds) : "-";
}

Status SaveCheckpoint(Engine& engine, const std::string& dir, int64_t step, uint64_t data_pos,
                      const TrainFlags& f, const GptShape& shape) {
  Stopwatch w;
  STRATA_ASSIGN_OR_RETURN(auto writer, CheckpointWriter::Begin(dir, "step-" + std::to_string(step)));
  STRATA_RETURN_IF_ERROR(engine.SaveState(*writer));
  nlohmann::json t;
  t["step"] = step;
  t["data_position"] = data_pos;
  t["seed"] = f.seed;
  t["model"] = {{"name", shape.name}, {"n_layers", shape.n_layers}, {"d_model", shape.d_model},
                {"n_heads", shape.n_heads}, {"seq_len", shape.seq_len}};
  t["lr"] = engine.learning_rate();
  STRATA_RETURN_IF_ERROR(writer->WriteJson("trainer.json", t));
  STRATA_RETURN_IF_ERROR(writer->Commit());
  STRATA_RETURN_IF_ERROR(PruneCheckpoints(dir, 2));
  STRATA_RETURN_IF_ERROR(engine.ExportSafetensors(
      dir + "/model.safetensors",
      {{"format", "pt"}, {"step", std::to_string(step)}, {"model", shape.name}}));
  STRATA_LOG(kInfo) << "saved step " << step << " to " << dir << " (and " << dir
                    << "/model.safetensors) in " << w.Seconds() << " s";
  return Status::Ok();
}

Status RunTrain(const TrainFlags& f) {
  if (f.steps < 1) return InvalidArgumentError("--steps must be >= 1");
  STRATA_ASSIGN_OR_RETURN(GptShape shape, FindGptPreset(f.model));
  if (f.seq_len > 0) shape.seq_len = f.seq_len;
  const int threads = f.threads > 0 ? f.threads : static_cast<int>(std::thread::hardware_concurrency());
  torch::set_num_threads(threads);

  // Config: the file, or the demo's with a scratch NVMe directory.
  std::string scratch;
  Result<Config> config = InvalidArgumentError("");
  ParseOptions po;
  po.auto_values.hidden_size = shape.d_model;
  po.auto_values.total_num_steps = f.steps;
  if (f.config.empty()) {
    scratch = "/tmp/strata-demo-" + std::to_string(getpid());
    std::string text = kDemoConfig;
    for (size_t p; (p = text.find("NVME")) != std::string::npos;) text.replace(p, 4, scratch);
    po.source = "demo config";
    config = ParseConfig(text, po);
  } else {
    config = LoadConfigFile(f.config, po);
  }
  if (!config.ok()) return config.status();
  for (const auto& w : config->warnings) STRATA_LOG(kWarning) << w;
  struct Scratch {
    std::string dir;
    ~Scratch() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } scratch_guard{scratch};

  STRATA_ASSIGN_OR_RETURN(std::string text, LoadText(f.data));
  if (text.size() < static_cast<size_t>(shape.seq_len) + 2) {
    return InvalidArgumentError("training text (" + std::to_string(text.size()) +
                                " bytes) is shorter than one sequence of " +
                                std::to_string(shape.seq_len) + " tokens");
  }

  GptOptions go;
  go.n_layers = shape.n_layers;
  go.d_model = shape.d_model;
  go.n_heads = shape.n_heads;
  go.seq_len = shape.seq_len;
  // With parameters offloaded, blocks are initialized one at a time as the engine takes them, so
  // host memory never holds the whole model.
  go.deferred_init = config->zero.offload_param.device != Home::kDevice;
  torch::manual_seed(static_cast<int64_t>(f.seed));
  Stopwatch build_watch;
  Gpt model(go);
  InitializeOptions io;
  if (go.deferred_init) io.initialize_unit = [&model](int unit) { model->InitializeBlock(unit); };
  STRATA_ASSIGN_OR_RETURN(io.device_budget, ParseBytes(f.device_memory));
  io.optimizer_threads = threads;
  STRATA_ASSIGN_OR_RETURN(auto engine, Initialize(model.ptr(), *config, io));
  STRATA_LOG(kInfo) << "model " << shape.name << ": " << TotalParams(shape) / 1e6
                    << "M parameters, " << shape.n_layers << " blocks x " << shape.d_model
                    << ", seq " << shape.seq_len << "; params on "
                    << HomeName(engine->options().params) << ", optimizer on "
                    << HomeName(engine->options().optimizer) << "; pinned arena "
                    << FormatBytes(engine->pinned_arena_bytes()) << "; ready in "
                    << build_watch.Seconds() << " s";

  int64_t step = 0;
  uint64_t data_pos = 0;
  if (!f.resume.empty()) {
    STRATA_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(f.resume));
    STRATA_RETURN_IF_ERROR(engine->LoadState(reader));
    STRATA_ASSIGN_OR_RETURN(nlohmann::json t, reader.ReadJson("trainer.json"));
    try {
      step = t.at("step").get<int64_t>();
      data_pos = t.at("data_position").get<uint64_t>();
      if (t.at("seed").get<uint64_t>() != f.seed) {
        STRATA_LOG(kWarning) << "resuming with --seed " << f.seed << ", the checkpoint used "
                             << t.at("seed").get<uint64_t>() << ": batches will differ";
      }
    } catch (const nlohmann::json::exception& e) {
      return DataLossError(f.resume + ": trainer.json: " + e.what());
    }
    STRATA_LOG(kInfo) << "resumed from " << f.resume << " (" << reader.tag() << ") at step "
                      << step;
  }

  std::ofstream log_json;
  if (!f.log_json.empty()) {
    log_json.open(f.log_json, std::ios::app);
    if (!log_json) return IoErrorFromErrno(errno, "opening --log-json " + f.log_json);
  }
  int64_t trace_from = -1, trace_to = -1;
  if (!f.trace.empty()) {
    const auto dash = f.trace_steps.find('-');
    trace_from = std::stoll(f.trace_steps.substr(0, dash));
    trace_to = dash == std::string::npos ? trace_from : std::stoll(f.trace_steps.substr(dash + 1));
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);

  const int mbs = static_cast<int>(config->train_micro_batch_size_per_gpu);
  const int gas = static_cast<int>(config->gradient_accumulation_steps);
  const bool tty = isatty(STDERR_FILENO) && !f.quiet;
  const int print_every = std::max(1, config->steps_per_print);
  double first_loss = NAN, loss_avg = 0;
  int64_t avg_n = 0;
  Stopwatch total;
  while (step < f.steps && !g_stop.load()) {
    if (step + 1 == trace_from) {
      TraceRecorder::Global().Clear();
      TraceRecorder::Global().Enable(true);
    }
    const TierTelemetry before = engine->telemetry();
    Stopwatch w;
    double fwd = 0, bwd = 0, loss_sum = 0;
    for (int m = 0; m < gas; ++m) {
      auto [x, y] = MakeBatch(text, mbs, shape.seq_len, f.seed, data_pos++);
      Stopwatch fw;
      torch::Tensor loss;
      try {
        TraceSpan span("compute", "forward");
        loss = model->Loss(x, y);
      } catch (const std::exception& e) {  // a unit's gather failed (e.g. an NVMe read error)
        return engine->ErrorFromException(e);
      }
      fwd += fw.Seconds();
      loss_sum += loss.item<double>();
      Stopwatch bw;
      {
        TraceSpan span("compute", "backward");
        STRATA_RETURN_IF_ERROR(engine->Backward(loss));
      }
      bwd += bw.Seconds();
    }
    const double lr = engine->learning_rate();
    Stopwatch ow;
    STRATA_RETURN_IF_ERROR(engine->Step());
    const double opt = ow.Seconds();
    const double secs = w.Seconds();
    ++step;
    const TierTelemetry after = engine->telemetry();
    const double read = static_cast<double>(after.nvme_to_pinned - before.nvme_to_pinned);
    const double written = static_cast<double>(after.pinned_to_nvme - before.pinned_to_nvme);
    const double loss = loss_sum / gas;
    if (std::isnan(first_loss)) first_loss = loss;
    loss_avg += loss;
    ++avg_n;
    const double tokens = static_cast<double>(mbs) * gas * shape.seq_len;
    if (step == trace_to && trace_from >= 0) {
      TraceRecorder::Global().Enable(false);
      STRATA_RETURN_IF_ERROR(TraceRecorder::Global().WriteJson(f.trace));
      STRATA_LOG(kInfo) << "wrote the Chrome trace of steps " << f.trace_steps << " to "
                        << f.trace;
    }
    const Engine::Occupancy occ = engine->occupancy();
    if (log_json.is_open()) {
      nlohmann::json j = {{"step", step},
                          {"loss", loss},
                          {"lr", lr},
                          {"loss_scale", 1.0},
                          {"tokens_per_second", tokens / secs},
                          {"step_seconds", secs},
                          {"forward_seconds", fwd},
                          {"backward_seconds", bwd},
                          {"optimizer_seconds", opt},
                          {"grad_norm", engine->last_grad_norm()},
                          {"nvme_read_bytes", read},
                          {"nvme_written_bytes", written},
                          {"device_used_bytes", occ.device_used},
                          {"pinned_used_bytes", occ.pinned_used}};
      log_json << j.dump() << "\n";
      log_json.flush();
    }
    if (tty) {
      const int width = 24;
      const int filled = static_cast<int>(width * step / f.steps);
      std::fprintf(stderr,
                   "\r[%s%s] step %lld/%lld  loss %.4f  %.0f tok/s  fwd %.2fs bwd %.2fs opt %.2fs  "
                   "NVMe r %s w %s  device %s/%s  pinned %s/%s  ",
                   std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                   static_cast<long long>(step), static_cast<long long>(f.steps), loss,
                   tokens / secs, fwd, bwd, opt, Rate(read, secs).c_str(),
                   Rate(written, secs).c_str(), FormatBytes(occ.device_used).c_str(),
                   FormatBytes(occ.device_budget).c_str(), FormatBytes(occ.pinned_used).c_str(),
                   FormatBytes(occ.pinned_capacity).c_str());
    }
    if (step % print_every == 0 || step == f.steps) {
      if (tty) std::fprintf(stderr, "\n");
      std::fprintf(stdout,
                   "step %lld  loss %.4f (avg %.4f)  lr %.3g  %.0f tok/s  step %.2fs = fwd %.2f + "
                   "bwd %.2f + opt %.2f  NVMe read %s written %s\n",
                   static_cast<long long>(step), loss, loss_avg / avg_n, lr, tokens / secs, secs,
                   fwd, bwd, opt, FormatBytes(static_cast<uint64_t>(read)).c_str(),
                   FormatBytes(static_cast<uint64_t>(written)).c_str());
      std::fflush(stdout);
      if (config->wall_clock_breakdown) {
        const StepTimes& t = engine->times();
        std::fprintf(stdout,
                     "  wall clock: gather wait %.3fs, gradient hand-off wait %.3fs, optimizer "
                     "%.3fs\n",
                     t.gather_wait_seconds, t.grad_wait_seconds, t.optimizer_seconds);
      }
      loss_avg = 0;
      avg_n = 0;
    }
    if (!f.save.empty() && f.save_every > 0 && step % f.save_every == 0 && step < f.steps) {
      STRATA_RETURN_IF_ERROR(SaveCheckpoint(*engine, f.save, step, data_pos, f, shape));
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  const bool interrupted = g_stop.load() != 0;
  if (!f.save.empty()) {
    STRATA_RETURN_IF_ERROR(SaveCheckpoint(*engine, f.save, step, data_pos, f, shape));
  }
  std::fprintf(stdout, "%s after %lld steps in %.1f s (first loss %.4f)\n",
               interrupted ? "stopped (interrupted)" : "done", static_cast<long long>(step),
               total.Seconds(), first_loss);
  if (interrupted) return CancelledError("interrupted");
  return Status::Ok();
}

}  // namespace

void AddTrainCommand(CLI::App& app, int* exit_code) {
  auto f = std::make_shared<TrainFlags>();
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train the byte-level GPT with offload as a DeepSpeed config says (no flags: the demo, "
      "parameters and optimizer on NVMe under /tmp, on Debian's fortunes texts)");
  cmd->add_option("--config", f->config, "DeepSpeed JSON config (default: the demo's)");
  cmd->add_option("--model", f->model, "Model preset (tiny, small, 125M ... 13B; default small)");
  cmd->add_option("--data", f->data, "Training text file (default: /usr/share/games/fortunes)");
  cmd->add_option("--steps", f->steps, "Optimizer steps to reach (default 120)");
  cmd->add_option("--save", f->save, "Checkpoint directory (saved at the end and on Ctrl-C)");
  cmd->add_option("--save-every", f->save_every, "Also save every N steps");
  cmd->add_option("--resume", f->resume, "Resume from this checkpoint directory (its latest)");
  cmd->add_option("--trace", f->trace, "Write a Chrome trace of --trace-steps to this file");
  cmd->add_option("--trace-steps", f->trace_steps, "Steps to trace, N or A-B (default 2)");
  cmd->add_option("--log-json", f->log_json, "Append one JSON object per step to this file");
  cmd->add_option("--seq-len", f->seq_len, "Override the preset's sequence length");
  cmd->add_option("--device-memory", f->device_memory,
                  "Device budget for host emulation, e.g. 2G (default: all parameters fit)");
  cmd->add_option("--threads", f->threads, "Compute and optimizer threads (default: all cores)");
  cmd->add_option("--seed", f->seed, "Seed of the initialization and the data order");
  cmd->add_flag("--quiet", f->quiet, "No progress bar");
  cmd->callback([f, exit_code] {
    Status s = RunTrain(*f);
    if (s.ok()) {
      *exit_code = 0;
      return;
    }
    if (s.code() == StatusCode::kCancelled) {
      *exit_code = 130;
      return;
    }
    std::fprintf(stderr, "strata train: %s\n", s.ToString().c_str());
    *exit_code = s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kNotFound ? 2 : 1;
  });
}

}  // namespace strata::runtime
