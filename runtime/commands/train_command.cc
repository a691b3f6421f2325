// `strata train`: trains a model (a GPT preset, a Llama-family preset, or a Hugging Face model
// directory: runtime/models/causal_lm.h) with the engine, as a DeepSpeed config says. Without
// flags it runs the demo: the byte-level GPT "small" preset with parameters and optimizer state on
// NVMe (a scratch directory under /tmp), on the English texts of Debian's `fortunes` package.
// --export OUT writes a Hugging Face directory at the end (with --steps 0: the loaded weights). The
// Trainer (trainer.h) runs the steps; this file shows them: a progress line on a terminal (stderr;
// it fits the terminal's width, with elapsed time and ETA), a line every steps_per_print steps
// (stdout) with the engine's wait timers under wall_clock_breakdown (and, with fp16, the loss scale
// and skipped overflow steps), a line per evaluation, one JSON object per step with --log-json,
// and TensorBoard scalars with --tensorboard (tensorboard_log.h). Ctrl-C (SIGINT/SIGTERM) says at
// once what happens next (terminal_text.h: InterruptNotice), finishes the current step, saves if
// --save is set, and exits 130 (143 after SIGTERM); a second Ctrl-C ends the process at once.
// Ranks: rank 0 alone shows and logs info lines.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/file_util.h"
#include "base/log_settings.h"
#include "base/logging.h"
#include "runtime/comm/launcher.h"
#include "runtime/commands/command.h"
#include "runtime/commands/commands.h"
#include "runtime/commands/flag_checks.h"
#include "runtime/commands/tensorboard_log.h"
#include "runtime/commands/terminal_text.h"
#include "runtime/commands/trainer.h"
#include "runtime/commands/training_flags.h"
#include "runtime/persist/hf_export.h"
#include "runtime/plan/model_spec.h"

namespace strata::runtime {
namespace {

// --max-shard-size as transformers spells it ("5GB" = 5e9 bytes; hf_export.h).
CLI::Validator ShardSize() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        Result<uint64_t> bytes = ParseShardSize(text);
        return bytes.ok() ? std::string() : std::string(bytes.status().message());
      },
      "SIZE");
}

std::string Rate(double bytes, double seconds) {
  return seconds > 0 ? FormatGbps(bytes / seconds) : "-";
}

// Renders the Trainer's step reports. Lines are averaged over the steps since the last line.
//
// On a terminal (stderr) the progress line is redrawn in place after every step: "\r", a line that
// fits the terminal's width (read again each step, so a resized window is followed) and "\x1b[K"
// (erase the rest of the row, so a shorter line leaves nothing of a longer one). While it is shown,
// log lines erase it first (SetLogErasesLine) and the stdout lines below are written in its place;
// the next step draws it again. Without a terminal there is no progress line, only the stdout
// lines, which wrap to the width of the terminal stdout is on (one line each when it is not one).
class StepPrinter {
 public:
  StepPrinter(const Config& config, nlohmann::json plan_facts, bool progress_bar,
              std::ofstream* log_json)
      : config_(config),
        plan_facts_(std::move(plan_facts)),
        progress_bar_(progress_bar),
        stdout_tty_(isatty(STDOUT_FILENO) != 0),
        log_json_(log_json) {
    if (progress_bar_) SetLogErasesLine(true);
  }
  // Erases the progress line (an error line or the summary comes next).
  ~StepPrinter() {
    if (!progress_bar_) return;
    SetLogErasesLine(false);
    if (drawn_) std::fputs("\r\x1b[K", stderr);
  }

  void OnStep(const StepReport& r) {
    eta_.Add(r.step, r.elapsed_seconds);
    loss_sum_ += r.loss;
    ++loss_n_;
    if (r.skipped) ++skipped_;
    if (r.eval) last_eval_ = r.eval;
    const double read = static_cast<double>(r.nvme_read_bytes);
    const double written = static_cast<double>(r.nvme_written_bytes);
    if (log_json_->is_open()) {
      nlohmann::json j = {{"step", r.step},
                          {"loss", r.loss},
                          {"lr", r.lr},
                          {"loss_scale", r.loss_scale},
                          {"skipped", r.skipped},
                          {"epoch", r.epoch},
                          {"elapsed_seconds", r.elapsed_seconds},
                          {"tokens_per_second", r.tokens_per_second},
                          {"step_seconds", r.step_seconds},
                          {"forward_seconds", r.forward_seconds},
                          {"backward_seconds", r.backward_seconds},
                          {"optimizer_seconds", r.optimizer_seconds},
                          {"optimizer_wait_seconds", r.optimizer_wait_seconds},
                          {"grad_norm", r.grad_norm},
                          {"nvme_read_bytes", read},
                          {"nvme_written_bytes", written},
                          {"speculative_read_bytes", r.speculative_read_bytes},
                          {"speculative_wasted_bytes", r.speculative_wasted_bytes},
                          {"read_retries", r.read_retries},
                          {"units_updated", r.units_updated},
                          {"units_routed", r.units_routed},
                          {"minor_faults", r.minor_faults},
                          {"major_faults", r.major_faults},
                          {"device", r.device},
                          {"device_used_bytes", r.device_used_bytes},
                          {"device_peak_bytes", r.device_peak_bytes},
                          {"pinned_used_bytes", r.pinned_used_bytes},
                          {"pinned_capacity_bytes", r.pinned_capacity_bytes},
                          {"peak_rss_bytes", PeakResidentBytes()}};
      if (r.eval) {
        j["eval_loss"] = r.eval->loss;
        j["eval_perplexity"] = r.eval->perplexity;
      }
      j.update(plan_facts_);  // what the run was planned for (Trainer::PlanFacts)
      *log_json_ << j.dump() << "\n";
      log_json_->flush();
    }
    const bool print = r.step % std::max(1, config_.steps_per_print) == 0 || r.step == r.steps;
    if (print || r.eval) {
      if (progress_bar_ && drawn_) std::fputs("\r\x1b[K", stderr);  // the lines take its place
      if (print) PrintStepLine(r);
      if (r.eval) {
        std::fprintf(stdout, "eval  step %lld  loss %.4f  ppl %.2f  (%llu batches, %.1f s)\n",
                     static_cast<long long>(r.step), r.eval->loss, r.eval->perplexity,
                     static_cast<unsigned long long>(r.eval->batches), r.eval->seconds);
      }
      std::fflush(stdout);
    }
    if (progress_bar_) DrawProgress(r, read, written);
  }

 private:
  // The stdout line of a print step: every figure of today's one-line form, wrapped onto indented
  // lines where stdout is a terminal narrower than it.
  void PrintStepLine(const StepReport& r) {
    char buf[160];
    std::vector<std::string> segments;
    std::snprintf(buf, sizeof(buf), "step %lld", static_cast<long long>(r.step));
    segments.push_back(buf);
    std::snprintf(buf, sizeof(buf), "loss %.4f (avg %.4f)", r.loss, loss_sum_ / loss_n_);
    segments.push_back(buf);
    std::snprintf(buf, sizeof(buf), "lr %.3g", r.lr);
    segments.push_back(buf);
    // fp16: the scale this step ran with, and the overflow steps skipped since the last line
    // ("SKIPPED" when this one was).
    if (config_.fp16.enabled) {
      std::snprintf(buf, sizeof(buf), "loss scale %.10g%s", r.loss_scale,
                    r.skipped ? " SKIPPED (overflow)" : "");
      std::string fp16 = buf;
      if (skipped_ > (r.skipped ? 1 : 0)) {
        std::snprintf(buf, sizeof(buf), ", %lld skipped since the last line",
                      static_cast<long long>(skipped_));
        fp16 += buf;
      }
      segments.push_back(fp16);
    }
    std::snprintf(buf, sizeof(buf), "%.0f tok/s", r.tokens_per_second);
    segments.push_back(buf);
    std::snprintf(buf, sizeof(buf), "step %.2fs = fwd %.2f + bwd %.2f + opt %.2f", r.step_seconds,
                  r.forward_seconds, r.backward_seconds, r.optimizer_seconds);
    segments.push_back(buf);
    std::string nvme = "NVMe read " + FormatBytes(r.nvme_read_bytes) + " written " +
                       FormatBytes(r.nvme_written_bytes);
    // The layout's bytes for this run's split and device window (step_traffic.h) and the host-RAM
    // tier that keeps the rest off NVMe (Trainer::PlanFacts).
    const uint64_t plan_written = plan_facts_.value("plan_nvme_written_bytes", uint64_t{0});
    const uint64_t tier = plan_facts_.value("host_cache_bytes", uint64_t{0});
    if (plan_written > 0 || tier > 0) {
      nvme += " (plan " + FormatBytes(plan_facts_.value("plan_nvme_read_bytes", uint64_t{0})) +
              " / " + FormatBytes(plan_written);
      if (tier > 0) nvme += ", host tier " + FormatBytes(tier);
      nvme += ")";
    }
    segments.push_back(nvme);
    const int columns = stdout_tty_ ? TerminalColumns(STDOUT_FILENO) : 1 << 20;
    std::fprintf(stdout, "%s\n", WrapSegments(segments, columns, "    ").c_str());
    if (config_.wall_clock_breakdown) {
      std::vector<std::string> wall;
      std::snprintf(buf, sizeof(buf), "  wall clock: gather wait %.3fs,", r.gather_wait_seconds);
      wall.push_back(buf);
      std::snprintf(buf, sizeof(buf), "gradient hand-off wait %.3fs,", r.grad_wait_seconds);
      wall.push_back(buf);
      std::snprintf(buf, sizeof(buf), "optimizer %.3fs", r.engine_optimizer_seconds);
      wall.push_back(buf);
      std::fprintf(stdout, "%s\n", WrapSegments(wall, columns, "    ", " ").c_str());
    }
    loss_sum_ = 0;
    loss_n_ = 0;
    skipped_ = 0;
  }

  // The progress line, its fields by priority: the step, loss, elapsed time and ETA always; then
  // throughput, the last evaluation and the epoch; then the tiers; then the step's breakdown.
  void DrawProgress(const StepReport& r, double read, double written) {
    char buf[160];
    std::vector<LineField> fields;
    // The step padded to the goal's width, so the fields after it stay in place.
    const int digits = static_cast<int>(std::to_string(r.steps).size());
    std::snprintf(buf, sizeof(buf), "%*lld/%lld", digits, static_cast<long long>(r.step),
                  static_cast<long long>(r.steps));
    fields.push_back({buf, 0});
    std::snprintf(buf, sizeof(buf), "loss %.4f", r.loss);
    fields.push_back({buf, 0});
    fields.push_back({"elapsed " + FormatDuration(r.elapsed_seconds), 0});
    fields.push_back({"ETA " + FormatDuration(eta_.SecondsLeft(r.steps)), 0});
    std::snprintf(buf, sizeof(buf), "%.0f tok/s", r.tokens_per_second);
    fields.push_back({buf, 1});
    if (last_eval_) {
      std::snprintf(buf, sizeof(buf), "eval %.4f ppl %.2f", last_eval_->loss,
                    last_eval_->perplexity);
      fields.push_back({buf, 1});
    }
    if (r.epoch > 0) {
      std::snprintf(buf, sizeof(buf), "epoch %.2f", r.epoch);
      fields.push_back({buf, 1});
    }
    fields.push_back(
        {"NVMe r " + Rate(read, r.step_seconds) + " w " + Rate(written, r.step_seconds), 2});
    fields.push_back(
        {"device " + FormatBytes(r.device_used_bytes) + "/" + FormatBytes(r.device_budget_bytes),
         2});
    fields.push_back(
        {"pinned " + FormatBytes(r.pinned_used_bytes) + "/" + FormatBytes(r.pinned_capacity_bytes),
         2});
    std::snprintf(buf, sizeof(buf), "fwd %.2fs bwd %.2fs opt %.2fs", r.forward_seconds,
                  r.backward_seconds, r.optimizer_seconds);
    fields.push_back({buf, 3});
    const double done = r.steps > 0 ? static_cast<double>(r.step) / r.steps : 0;
    const int columns = TerminalColumns(STDERR_FILENO);
    SetLogWrapColumns(columns);  // a resized window
    const std::string line = FitProgressLine(fields, done, columns);
    std::fprintf(stderr, "\r%s\x1b[K", line.c_str());
    std::fflush(stderr);
    drawn_ = true;
  }

  const Config& config_;
  const nlohmann::json plan_facts_;
  const bool progress_bar_;
  const bool stdout_tty_;
  std::ofstream* log_json_;
  bool drawn_ = false;  // a progress line is on the terminal
  EtaEstimator eta_;
  std::optional<EvalReport> last_eval_;
  double loss_sum_ = 0;
  int64_t loss_n_ = 0;
  int64_t skipped_ = 0;  // fp16 overflow steps since the last line
};

class TrainCommand final : public Command {
 public:
  TrainCommand()
      : Command("train",
                "Train or fine-tune a model with offload as a DeepSpeed config says (--model: a "
                "Hugging Face directory or a preset; no flags: the demo, a byte-level GPT with "
                "parameters and optimizer on NVMe under /tmp, on Debian's fortunes texts)") {}
  // It reports while it runs; machines read --log-json.
  bool has_json() const override { return false; }

  void AddFlags(CLI::App& cmd) override {
    TrainerOptions& o = options_;
    cmd.add_option("--config", o.config, "DeepSpeed JSON config (default: the demo's)")
        ->check(flags::InputFile());
    cmd.add_option(
        "--model", o.model,
        "Hugging Face model directory (config.json + safetensors), or a preset: GPT "
        "tiny, small, 125M ... 13B; llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, "
        "llama-2-7b, llama-2-13b, mistral-7b, qwen2.5-7b, llama-3.1-70b (default small)");
    cmd.add_option("--data", o.data,
                   "Training data: token ids (.bin), .jsonl (\"text\" field, or SFT records: "
                   "prompt/completion or prompt_ids/completion_ids, loss on the completion; chat "
                   "\"messages\", loss on the assistant turns) or "
                   ".txt (default: /usr/share/games/fortunes; GPT presets read bytes of a text "
                   "file)")
        ->check(flags::InputFile());
    cmd.add_flag("--packing", o.packing,
                 "SFT records: concatenate them into windows of --seq-len + 1 tokens instead of "
                 "one record per row, padded (TRL's packing)");
    cmd.add_option("--data-dtype", o.data_dtype,
                   "Element type of a .bin: uint16 or uint32 (default: uint16 when the vocabulary "
                   "fits in 16 bits)")
        ->check(CLI::IsMember({"uint16", "uint32"}));
    CLI::Option* steps = cmd.add_option("--steps", o.steps,
                                        "Optimizer steps to reach (default 120; 0 with --export)")
                             ->check(flags::Count(0));
    cmd.add_option("--epochs", o.epochs,
                   "Train this many passes over --data instead of --steps (the step count is "
                   "derived from the data and the global batch, and shown at start; may be "
                   "fractional)")
        ->check(flags::Real(0, 1e6, /*min_open=*/true))
        ->excludes(steps);
    cmd.add_option("--export", export_.dir,
                   "Write a Hugging Face directory (config.json, safetensors shards, tokenizer) "
                   "here at the end")
        ->check(flags::OutputDirectory());
    cmd.add_option("--export-dtype", export_.dtype,
                   "Dtype of exported weights (--export, and --save's DIR/hf/): fp32, bf16, fp16 "
                   "(default: the input's)")
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
    cmd.add_option("--max-shard-size", export_.max_shard_size,
                   "Largest exported safetensors file, as transformers spells it (default 5GB)")
        ->check(ShardSize());
    cmd.add_option("--save", o.save, "Checkpoint directory (saved at the end and on Ctrl-C)")
        ->check(flags::OutputDirectory());
    cmd.add_option("--save-every", save_every_, "Also save every N steps, or after each epoch")
        ->check(EveryValidator());
    cmd.add_option("--save-total-limit", o.save_total_limit,
                   "Checkpoints of this run kept in --save, the newest (default 2; --save-best "
                   "keeps the best beside them)")
        ->check(CLI::Range(1, 1 << 20));
    cmd.add_option("--eval-data", o.eval_data,
                   "Evaluation data (same formats as --data): its loss and perplexity after the "
                   "last step and every --eval-every")
        ->check(flags::InputFile());
    cmd.add_option("--eval-every", eval_every_, "Evaluate --eval-data every N steps, or each epoch")
        ->check(EveryValidator());
    cmd.add_option("--eval-max-batches", o.eval_max_batches,
                   "Evaluate at most this many batches of --eval-data (default: all)")
        ->check(flags::Count());
    cmd.add_flag("--save-best", o.save_best,
                 "Save a checkpoint after each evaluation that lowers the eval loss, and keep the "
                 "best one whatever --save-total-limit prunes (needs --save and --eval-data)");
    cmd.add_flag("--overwrite-save", o.overwrite_save,
                 "Save into a --save directory that holds another run's checkpoints (refused "
                 "otherwise; they are kept: a run prunes only its own)");
    cmd.add_option("--resume", o.resume,
                   "Resume from this checkpoint: a --save directory (its latest) or one checkpoint "
                   "in it (DIR/step-N)")
        ->check(flags::InputDirectory());
    cmd.add_option("--trace", o.trace, "Write a Chrome trace of --trace-steps to this file")
        ->check(flags::OutputFile());
    cmd.add_option("--trace-steps", o.trace_steps, "Steps to trace, N or A-B (default 2)")
        ->check(flags::StepRange());
    cmd.add_option("--log-json", log_json_,
                   "Append one JSON object per step to this file (fields: README; minor_faults and "
                   "major_faults are the page faults the process took during the step)")
        ->check(flags::OutputFile());
    cmd.add_option("--tensorboard", tensorboard_,
                   "Write TensorBoard event files here: train/loss, learning_rate, grad_norm, "
                   "epoch, tokens_per_second, NVMe bytes, eval/loss per step (README)")
        ->check(flags::OutputDirectory());
    cmd.add_option("--seq-len", o.seq_len,
                   "Tokens per sequence (default: a GPT preset's own; " +
                       std::to_string(kDefaultLlamaSeqLen) + " for Llama-family models)")
        ->check(flags::SeqLen());
    AddResourceFlags(cmd, {.device = &o.device,
                           .device_memory = &o.device_memory,
                           .host_memory = &o.host_memory,
                           .threads = &o.threads,
                           .threads_help = "Compute and optimizer threads"});
    cmd.add_option("--seed", o.seed, "Seed of the initialization and the data order")
        ->check(flags::Seed());
    AddPageExpertsFlag(cmd, &o.page_experts);
    cmd.add_flag("--quiet", quiet_, "No progress bar");
    cmd.add_option("--nproc", nproc_,
                   "Start N local data-parallel ranks (like torchrun --nproc_per_node N); without "
                   "it, a process started by torchrun joins its group (RANK, WORLD_SIZE, "
                   "MASTER_ADDR, MASTER_PORT)")
        ->check(CLI::Range(1, 1024));
    flags_.Add(cmd);
  }

  Status Run(CommandContext& ctx, nlohmann::json& /*result*/) override {
    // The flags are good: from here on the run computes (ranks inherit the setting).
    RestartWithPassiveOpenMpWaiting();
    if (nproc_ > 1 && options_.page_experts) return PageExpertsRanksError();
    if (nproc_ > 0) return LaunchRanks(nproc_, CommsTimeout(nproc_));
    const char* rank_env = GetEnv("RANK");
    const bool rank0 = rank_env == nullptr || std::string(rank_env) == "0";
    // Ranks other than 0 would repeat rank 0's info lines: they log warnings and errors only,
    // unless --log-level or STRATA_LOG_LEVEL says otherwise.
    if (!rank0) SetDefaultLogLevel(LogLevel::kWarning);
    const ParseOptions po = flags_.MakeParseOptions(std::nullopt, std::nullopt);
    options_.auto_values = po.auto_values;
    options_.given = po.given;
    STRATA_RETURN_IF_ERROR(
        ParseEvery(save_every_, "--save-every", &options_.save_every, &options_.save_every_epoch));
    STRATA_RETURN_IF_ERROR(
        ParseEvery(eval_every_, "--eval-every", &options_.eval_every, &options_.eval_every_epoch));
    if (!eval_every_.empty() && options_.eval_data.empty()) {
      return InvalidArgumentError("--eval-every " + eval_every_ +
                                  " without --eval-data: give the data to evaluate");
    }
    if (options_.eval_max_batches > 0 && options_.eval_data.empty()) {
      return InvalidArgumentError("--eval-max-batches without --eval-data");
    }
    if (options_.save_best && (options_.save.empty() || options_.eval_data.empty())) {
      return InvalidArgumentError(
          "--save-best keeps the checkpoint with the lowest eval loss: it needs --save DIR and "
          "--eval-data FILE");
    }
    if (options_.steps == 0 && export_.dir.empty()) {
      return InvalidArgumentError(
          "--steps 0 trains nothing: give --export OUT to re-export the "
          "loaded weights, or --steps N >= 1");
    }
    // Output files: regular files (or new), none of the run's inputs (a trace renamed over the
    // training data, a log appended to the config).
    const std::vector<std::pair<std::string, std::string>> inputs = {
        {"--data", options_.data},
        {"--eval-data", options_.eval_data},
        {"--config", options_.config},
        {"the model's config.json", options_.model + "/config.json"}};
    STRATA_RETURN_IF_ERROR(CheckOutputPath(options_.trace, "--trace", inputs));
    STRATA_RETURN_IF_ERROR(CheckOutputPath(log_json_, "--log-json", inputs));
    if (!options_.trace.empty() && options_.trace == log_json_) {
      return InvalidArgumentError("--trace and --log-json name the same file " + log_json_);
    }
    options_.save_export_dtype = export_.dtype;
    options_.save_max_shard_size = export_.max_shard_size;
    // From the start: a signal while the model loads or the initial state is written stops the
    // run there (Trainer::Create checks the flag before each unit).
    // Log lines on a terminal wrap to its width (read again with each progress line).
    if (isatty(STDERR_FILENO)) SetLogWrapColumns(TerminalColumns(STDERR_FILENO));
    ctx.CatchInterrupts();
    options_.stop = ctx.stop_flag();
    // Says what happens next the moment Ctrl-C is pressed (rank 0 for all ranks: they stop
    // together, Trainer::Run).
    InterruptNotice notice(ctx.stop_flag(), options_.save, rank0);
    STRATA_ASSIGN_OR_RETURN(options_.test_hooks, ReadTestHooks());
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(options_));
    if (!export_.dir.empty()) STRATA_RETURN_IF_ERROR(trainer->CheckExport(export_));
    if (trainer->step() >= trainer->steps() && trainer->steps() > 0) {
      return InvalidArgumentError(
          "--resume " + options_.resume + " is at step " + std::to_string(trainer->step()) +
          ", at or past " +
          (options_.epochs > 0 ? "the " + std::to_string(trainer->steps()) + " steps of --epochs"
                               : "--steps " + std::to_string(trainer->steps())) +
          ": nothing to train (give " + (options_.epochs > 0 ? "more --epochs" : "--steps > ") +
          (options_.epochs > 0 ? "" : std::to_string(trainer->step())) + ")");
    }
    std::ofstream log_json;
    if (!log_json_.empty() && rank0) {  // ranks: rank 0 reports the global figures
      log_json.open(log_json_, std::ios::app);
      if (!log_json) return IoErrorFromErrno(errno, "opening --log-json " + log_json_);
    }
    std::unique_ptr<TensorBoardLog> tensorboard;
    if (!tensorboard_.empty() && rank0) {
      STRATA_ASSIGN_OR_RETURN(tensorboard, TensorBoardLog::Open(tensorboard_));
      STRATA_LOG(kInfo) << "--tensorboard: writing " << tensorboard->path();
    }
    // A failed write stops the curves, not the step loop: the ranks go on together to the end
    // (and the save), then the run fails with it.
    Status tensorboard_error;
    auto write_tensorboard = [&](const StepReport& r) {
      if (!tensorboard_error.ok()) return;
      tensorboard_error = tensorboard->Write(r);
      if (!tensorboard_error.ok()) {
        STRATA_LOG(kError) << "--tensorboard: " << tensorboard_error.message()
                           << " (no more curves; the run ends with this error after its last step)";
      }
    };
    // Again once the engine exists: its swap space's own handler then gets the second Ctrl-C.
    ctx.CatchInterrupts();
    const bool progress_bar = isatty(STDERR_FILENO) && !quiet_ && rank0;
    Stopwatch total;
    RunSummary summary;
    notice.set_step(trainer->step() + 1);
    notice.set_phase(InterruptNotice::Phase::kTraining);
    {
      StepPrinter printer(trainer->config(), trainer->PlanFacts(), progress_bar, &log_json);
      STRATA_ASSIGN_OR_RETURN(summary, trainer->Run(
                                           [&](const StepReport& r) {
                                             notice.Poll();  // r.step is the one it finishes
                                             notice.set_step(r.step + 1);
                                             if (rank0) printer.OnStep(r);
                                             if (tensorboard) write_tensorboard(r);
                                           },
                                           ctx.stop_flag()));
    }                               // the progress line is erased
    notice.set_step(summary.step);  // stopped: after this one
    notice.Poll();
    notice.set_phase(InterruptNotice::Phase::kFinishing);
    if (!options_.save.empty()) STRATA_RETURN_IF_ERROR(trainer->Save());
    if (tensorboard && tensorboard_error.ok()) tensorboard_error = tensorboard->Close();
    if (!tensorboard_error.ok()) return tensorboard_error.WithContext("--tensorboard");
    if (!export_.dir.empty() && !summary.interrupted)
      STRATA_RETURN_IF_ERROR(trainer->Export(export_));
    if (rank0 && options_.save_best && trainer->best() && !trainer->best()->tag.empty()) {
      const Trainer::Best best = *trainer->best();
      std::fprintf(stdout, "best checkpoint: %s/%s (step %lld, eval loss %.4f)\n",
                   options_.save.c_str(), best.tag.c_str(), static_cast<long long>(best.step),
                   best.eval_loss);
    }
    if (rank0)
      std::fprintf(stdout, "%s after %lld steps in %.1f s (first loss %.4f), peak RSS %s\n",
                   summary.interrupted ? "stopped (interrupted)" : "done",
                   static_cast<long long>(summary.step), total.Seconds(), summary.first_loss,
                   FormatBytes(PeakResidentBytes()).c_str());
    if (summary.interrupted) return CancelledError("interrupted");
    return Status::Ok();
  }

 private:
  // The config's strata.comms_timeout_seconds (the demo's default when there is no config or it
  // does not parse: the ranks then report what is wrong with it).
  std::chrono::milliseconds CommsTimeout(int nproc) const {
    int64_t seconds = StrataConfig().comms_timeout_seconds;
    if (!options_.config.empty()) {
      ParseOptions po = flags_.MakeParseOptions(std::nullopt, std::nullopt);
      po.world_size = nproc;
      Result<Config> config = LoadConfigFile(options_.config, po);
      if (config.ok()) seconds = config->strata.comms_timeout_seconds;
    }
    return std::chrono::seconds(seconds);
  }

  // `strata train --nproc N ...`: this command line without --nproc, N times, as local ranks.
  // Once a rank fails, the others' collectives fail within the comms timeout: the launcher waits
  // no longer than that (at most its default grace) before ending a rank that is stuck or stopped.
  static Status LaunchRanks(int nproc, std::chrono::milliseconds comms_timeout) {
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    std::vector<std::string> argv;
    for (std::string arg; std::getline(in, arg, '\0');) argv.push_back(arg);
    if (argv.empty()) return InternalError("cannot read /proc/self/cmdline");
    if (GetEnv("RANK") != nullptr) {
      return InvalidArgumentError(
          "--nproc inside a launched rank (RANK is set): start ranks "
          "either with --nproc or with torchrun, not both");
    }
    STRATA_ASSIGN_OR_RETURN(std::vector<std::string> ranks_argv, RemoveNprocFlag(argv));
    LaunchOptions lo;
    lo.grace = std::min(lo.grace, comms_timeout);
    STRATA_ASSIGN_OR_RETURN(int code, LaunchLocalRanks(nproc, ranks_argv, lo));
    if (code == 0) return Status::Ok();
    const std::string what = "a rank failed (exit code " + std::to_string(code) + "; see above)";
    if (code == kExitBadInput) return InvalidArgumentError(what);
    if (code == 130 || code == 143) return CancelledError("interrupted");
    return UnavailableError(what);
  }

  // --save-every / --eval-every: "N" steps or "epoch".
  static CLI::Validator EveryValidator() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
          int64_t n = 0;
          bool epoch = false;
          Status s = ParseEvery(text, "", &n, &epoch);
          return s.ok() ? std::string() : std::string(s.message());
        },
        "N|epoch");
  }
  static Status ParseEvery(const std::string& text, const std::string& flag, int64_t* steps,
                           bool* epoch) {
    *steps = 0;
    *epoch = false;
    if (text.empty()) return Status::Ok();
    if (text == "epoch") {
      *epoch = true;
      return Status::Ok();
    }
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(text.c_str(), &end, 10);
    if (errno != 0 || end == text.c_str() || *end != '\0' || n < 1 || n > flags::kMaxCount) {
      return InvalidArgumentError((flag.empty() ? "" : flag + ": ") + "'" + text +
                                  "' is neither a number of steps >= 1 nor \"epoch\"");
    }
    *steps = n;
    return Status::Ok();
  }

  TrainerOptions options_;
  std::string save_every_, eval_every_;
  int nproc_ = 0;
  ExportOptions export_;
  TrainingFlags flags_;
  std::string log_json_;
  std::string tensorboard_;
  bool quiet_ = false;
};

}  // namespace

std::unique_ptr<Command> NewTrainCommand() { return std::make_unique<TrainCommand>(); }

}  // namespace strata::runtime
