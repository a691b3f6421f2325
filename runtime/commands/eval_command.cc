// `strata eval`: mean next-token cross-entropy (nats) and perplexity of a model over consecutive
// non-overlapping windows of --seq-len + 1 tokens of the data (inputs the first N tokens, targets
// the next N; a trailing partial window is dropped), computed through the engine with the config's
// offload, so a model larger than RAM can be evaluated with parameters on NVMe. Without --config
// nothing is offloaded. The engine is an inference one (no gradients, no optimizer state, no
// optimizer swap files; with --resume a training one, to restore the checkpoint). Batches hold
// train_micro_batch_size_per_gpu windows (--micro-batch).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "runtime/commands/command.h"
#include "runtime/commands/commands.h"
#include "runtime/commands/flag_checks.h"
#include "runtime/commands/trainer.h"
#include "runtime/commands/training_flags.h"

namespace strata::runtime {
namespace {

class EvalCommand final : public Command {
 public:
  EvalCommand()
      : Command("eval",
                "Mean next-token loss and perplexity of a model on token data, through the "
                "engine with the config's offload") {}

  void AddFlags(CLI::App& cmd) override {
    TrainerOptions& o = options_;
    cmd.add_option("--model", o.model, "Hugging Face model directory, or a preset")->required();
    cmd.add_option("--data", o.data,
                   "Token ids (.bin), .jsonl (\"text\" field, or SFT prompt/completion or chat "
                   "\"messages\" records: the loss of the completions or assistant turns) or .txt "
                   "(tokenized with the model's tokenizer)")
        ->required()
        ->check(flags::InputFile());
    cmd.add_flag("--packing", o.packing,
                 "SFT records: packed into windows of --seq-len + 1 tokens, as train --packing");
    cmd.add_option("--data-dtype", o.data_dtype, "Element type of a .bin: uint16 or uint32")
        ->check(CLI::IsMember({"uint16", "uint32"}));
    cmd.add_option("--seq-len", o.seq_len,
                   "Tokens per window fed to the model (N; windows hold N+1)")
        ->required()
        ->check(flags::SeqLen());
    cmd.add_option("--config", o.config, "DeepSpeed JSON config (default: no offload)")
        ->check(flags::InputFile());
    cmd.add_option("--resume", o.resume,
                   "Evaluate the weights of this `strata train --save` checkpoint directory (its "
                   "latest; same model and config as the run that wrote it)")
        ->check(flags::InputDirectory());
    cmd.add_option("--max-batches", max_batches_,
                   "Evaluate at most this many batches (default: all)")
        ->check(flags::Count(0));
    AddResourceFlags(cmd, {.device = &o.device,
                           .device_memory = &o.device_memory,
                           .host_memory = &o.host_memory,
                           .threads = &o.threads,
                           .threads_help = "Compute threads"});
    AddPageExpertsFlag(cmd, &o.page_experts);
    flags_.Add(cmd);
  }

  Status Run(CommandContext& /*ctx*/, nlohmann::json& result) override {
    RestartWithPassiveOpenMpWaiting();
    const ParseOptions po = flags_.MakeParseOptions(std::nullopt, std::nullopt);
    options_.auto_values = po.auto_values;
    options_.given = po.given;
    options_.steps = 0;
    options_.no_offload_default = true;
    options_.inference = true;  // no gradients, no optimizer state (trainer.h)
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(options_));
    STRATA_ASSIGN_OR_RETURN(EvalReport r, trainer->Evaluate(max_batches_));
    result["model"] = options_.model;
    result["data"] = options_.data;
    result["seq_len"] = trainer->seq_len();
    result["loss"] = r.loss;
    result["perplexity"] = r.perplexity;
    result["tokens"] = r.tokens;
    result["windows"] = r.windows;
    result["batches"] = r.batches;
    result["seconds"] = r.seconds;
    result["peak_rss_bytes"] = PeakResidentBytes();
    // What the engine holds, as `strata estimate --mode eval --json` plans it (no optimizer
    // state: inference true, unless --resume needed a training engine).
    result["inference"] = options_.resume.empty();
    result["plan"] = trainer->PlanFacts();
    return Status::Ok();
  }

  void PrintText(const nlohmann::json& r, std::FILE* out) const override {
    std::fprintf(out,
                 "loss %.6f nats/token  perplexity %.4f  (%llu tokens in %llu windows of %d, "
                 "%.1f s, peak RSS %.2f GB)\n",
                 r["loss"].get<double>(), r["perplexity"].get<double>(),
                 static_cast<unsigned long long>(r["tokens"].get<uint64_t>()),
                 static_cast<unsigned long long>(r["windows"].get<uint64_t>()),
                 r["seq_len"].get<int>(), r["seconds"].get<double>(),
                 r["peak_rss_bytes"].get<double>() / 1e9);
  }

 private:
  TrainerOptions options_;
  TrainingFlags flags_;
  int64_t max_batches_ = 0;
};

}  // namespace

std::unique_ptr<Command> NewEvalCommand() { return std::make_unique<EvalCommand>(); }

}  // namespace strata::runtime
