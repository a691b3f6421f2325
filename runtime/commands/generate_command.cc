// `strata generate`: continues a prompt with a model whose weights the engine pages in as an
// inference engine (no gradients, no optimizer state): the config's offload_param decides where
// the weights live (device, pinned CPU memory, NVMe: DeepSpeed's ZeRO-Inference); without --config
// they are on the device. The prompt goes in one forward, then one token per forward on the KV
// cache (generator.h says how tokens are chosen and when it stops).
//
// Prompt and text: --prompt TEXT is tokenized with the model directory's tokenizer as
// transformers' tokenizer(TEXT) does (runtime/data/tokenizer.h: transformers itself for
// tokenizer.json, SentencePiece for a tokenizer.model alone), and the new ids are decoded with it
// (skip_special_tokens). GPT presets are byte-level: bytes in, bytes out. Models without a
// tokenizer strata can run (Llama-family presets, or no Python with transformers for a
// tokenizer.json) take --prompt-ids and print ids, saying why there is no text. EOS:
// generation_config.json's eos_token_id, else config.json's, else the tokenizer's; none for presets
// (the output says which).
//
// Context: a prompt must be shorter than the model's context (config.json max_position_embeddings;
// a GPT preset's position table), and generation stops when the sequence fills it.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/bytes.h"
#include "runtime/commands/command.h"
#include "runtime/commands/commands.h"
#include "runtime/commands/flag_checks.h"
#include "runtime/commands/generator.h"
#include "runtime/commands/trainer.h"
#include "runtime/commands/training_flags.h"
#include "runtime/data/tokenizer.h"
#include "runtime/engine/engine.h"
#include "runtime/models/causal_lm.h"

namespace strata::runtime {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The token ids of a --prompt-ids file: integers separated by white space or commas, optionally
// in [ ] (a JSON array).
Result<std::vector<int64_t>> ReadPromptIds(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("--prompt-ids " + path + ": cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  for (char& c : s) {
    if (c == ',' || c == '[' || c == ']') c = ' ';
  }
  std::istringstream words(s);
  std::vector<int64_t> ids;
  for (std::string word; words >> word;) {
    size_t used = 0;
    int64_t id = -1;
    try {
      id = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size()) {
      return InvalidArgumentError("--prompt-ids " + path + ": '" + word +
                                  "' is not a token id (expected whole numbers separated by "
                                  "spaces or commas)");
    }
    ids.push_back(id);
  }
  if (ids.empty()) return InvalidArgumentError("--prompt-ids " + path + ": holds no token id");
  return ids;
}

// The text of byte-level ids (GPT presets): ASCII as it is, any other byte as U+FFFD (a JSON
// string must be UTF-8, and a lone byte of a multi-byte character is not).
std::string BytesText(const std::vector<int64_t>& ids) {
  std::string text;
  for (const int64_t id : ids) {
    if (id >= 0 && id < 0x80) {
      text.push_back(static_cast<char>(id));
    } else {
      text += "\xEF\xBF\xBD";
    }
  }
  return text;
}

// Integer ids of a config's "eos_token_id" (a number or a list of numbers); empty otherwise.
std::vector<int64_t> EosIdsOf(const json& config) {
  std::vector<int64_t> ids;
  if (!config.is_object() || !config.contains("eos_token_id")) return ids;
  const json& eos = config["eos_token_id"];
  if (eos.is_number_integer()) ids.push_back(eos.get<int64_t>());
  if (eos.is_array()) {
    for (const json& id : eos) {
      if (id.is_number_integer()) ids.push_back(id.get<int64_t>());
    }
  }
  return ids;
}

class GenerateCommand final : public Command {
 public:
  GenerateCommand()
      : Command("generate",
                "Continue a prompt with a model (greedy or nucleus sampling), its weights paged "
                "in by the engine for inference (offload_param: device, cpu or nvme)") {}

  void AddFlags(CLI::App& cmd) override {
    TrainerOptions& o = options_;
    cmd.add_option("--model", o.model, "Hugging Face model directory, or a preset")->required();
    cmd.add_option(
        "--prompt", prompt_,
        "Prompt text (tokenized with the model's tokenizer, as transformers' tokenizer(TEXT); GPT "
        "presets: bytes)");
    cmd.add_option("--prompt-ids", prompt_ids_,
                   "File of prompt token ids, separated by spaces or commas (or a JSON array)")
        ->check(flags::InputFile());
    cmd.add_option("--max-new-tokens", max_new_tokens_, "Tokens to generate at most (default 32)")
        ->check(flags::Count(1));
    cmd.add_option("--temperature", temperature_,
                   "0 (the default): greedy, as transformers' do_sample=False; > 0: sample from "
                   "softmax(logits / T)")
        ->check(flags::Real(0, 1e4));
    cmd.add_option("--top-p", top_p_,
                   "Nucleus sampling: sample from the most probable tokens whose probabilities "
                   "sum to P, in (0, 1] (default 1: all)")
        ->check(flags::Real(0, 1, /*min_open=*/true));
    cmd.add_option("--seed", seed_, "Seed of the sampling (default 0)")->check(flags::Seed());
    cmd.add_option("--config", o.config,
                   "DeepSpeed JSON config: its offload_param places the weights (default: on the "
                   "device); its optimizer is not used")
        ->check(flags::InputFile());
    AddResourceFlags(cmd, {.device = &o.device,
                           .device_memory = &o.device_memory,
                           .host_memory = &o.host_memory,
                           .threads = &o.threads,
                           .threads_help = "Compute threads"});
    AddPageExpertsFlag(cmd, &o.page_experts);
  }

  Status Run(CommandContext& /*ctx*/, json& result) override {
    // Flags first: nothing is loaded for a command line that cannot run.
    // (The flags' validators checked the ranges.) Below 1e-6, logits / T overflows float32 for
    // logits of a few units: the sampling would see inf and NaN.
    if (temperature_ > 0 && temperature_ < 1e-6) {
      return InvalidArgumentError("--temperature " + FormatNumber(temperature_) +
                                  ": a positive temperature must be at least 1e-06 (logits / T "
                                  "overflows below it); 0 is greedy");
    }
    if (!prompt_.empty() && !prompt_ids_.empty()) {
      return InvalidArgumentError("--prompt and --prompt-ids: give one of them");
    }
    if (prompt_.empty() && prompt_ids_.empty()) {
      return InvalidArgumentError("--prompt or --prompt-ids is required");
    }
    std::vector<int64_t> prompt;
    if (!prompt_ids_.empty()) {
      STRATA_ASSIGN_OR_RETURN(prompt, ReadPromptIds(prompt_ids_));
    }

    // A directory without weights would generate from nothing: refused before anything loads.
    std::error_code error;
    if (fs::is_directory(options_.model, error)) {
      bool weights = false;
      for (const fs::directory_entry& e : fs::directory_iterator(options_.model, error)) {
        weights = weights || e.path().extension() == ".safetensors";
      }
      if (!weights) {
        return NotFoundError("--model " + options_.model +
                             ": no weights (a Hugging Face model directory holds config.json and "
                             "model*.safetensors)");
      }
    }

    RestartWithPassiveOpenMpWaiting();
    options_.steps = 0;
    options_.no_offload_default = true;
    options_.inference = true;
    options_.no_data = true;
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(options_));
    CausalLm& lm = trainer->model();

    // The tokenizer, or why there is no text.
    std::unique_ptr<Tokenizer> tokenizer;
    std::string no_text;
    const bool bytes = lm.family() == "gpt";
    if (!bytes && lm.hf_dir().empty()) {
      no_text = options_.model + " is a preset without a tokenizer";
    } else if (!bytes) {
      Result<std::unique_ptr<Tokenizer>> opened = Tokenizer::Open(lm.hf_dir());
      if (opened.ok()) {
        tokenizer = std::move(*opened);
      } else {
        no_text = opened.status().message();
      }
    }
    if (!prompt_.empty()) {
      if (bytes) {
        for (unsigned char c : prompt_) prompt.push_back(c);
      } else if (tokenizer) {
        STRATA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(prompt_));
        prompt.assign(ids.begin(), ids.end());
      } else {
        return InvalidArgumentError("--prompt: " + no_text + "; give the token ids (--prompt-ids)");
      }
      if (prompt.empty()) return InvalidArgumentError("--prompt: holds no token");
    }
    const int64_t vocab = lm.vocab_size();
    for (const int64_t id : prompt) {
      if (id < 0 || id >= vocab) {
        return InvalidArgumentError(
            (prompt_.empty() ? "--prompt-ids: token id " : "--prompt: id ") + std::to_string(id) +
            " is outside the model's vocabulary (0.." + std::to_string(vocab - 1) + ")");
      }
    }

    // The context: max_position_embeddings, or the position table of a GPT preset; and the
    // longest sequence the model attends (a sliding window strata does not compute).
    const json hf = lm.HfConfig();
    int64_t context = lm.max_seq_len();
    std::string context_source = bytes ? "its position table" : "the longest it attends";
    if (!bytes && hf.is_object() && hf.contains("max_position_embeddings") &&
        hf["max_position_embeddings"].is_number_integer() &&
        hf["max_position_embeddings"].get<int64_t>() < context) {
      context = hf["max_position_embeddings"].get<int64_t>();
      context_source = "max_position_embeddings";
    }
    const int64_t prompt_tokens = static_cast<int64_t>(prompt.size());
    if (prompt_tokens >= context) {
      return InvalidArgumentError(std::string(prompt_.empty() ? "--prompt-ids" : "--prompt") +
                                  ": the prompt's " + std::to_string(prompt_tokens) +
                                  " tokens leave no room in " + options_.model + "'s context of " +
                                  std::to_string(context) + " tokens (" + context_source + ")");
    }

    // EOS: what transformers' generation_config says (generation_config.json, else config.json's
    // eos_token_id), else the tokenizer's.
    std::vector<int64_t> eos;
    std::string eos_source = "none known";
    if (!lm.hf_dir().empty()) {
      const fs::path gen_config = fs::path(lm.hf_dir()) / "generation_config.json";
      std::ifstream in(gen_config);
      if (in) eos = EosIdsOf(json::parse(in, nullptr, /*allow_exceptions=*/false));
      if (!eos.empty()) eos_source = "generation_config.json";
    }
    if (eos.empty()) {
      eos = EosIdsOf(hf);
      if (!eos.empty()) eos_source = "config.json";
    }
    if (eos.empty() && tokenizer && tokenizer->eos_id() >= 0) {
      eos.push_back(tokenizer->eos_id());
      eos_source = fs::path(tokenizer->model_path()).filename().string();  // tokenizer.json/.model
    }

    Generation g;
    g.engine = &trainer->engine();
    g.lm = &lm;
    g.device = trainer->torch_device();
    g.prompt = prompt;
    g.max_new_tokens = max_new_tokens_;
    g.temperature = temperature_;
    g.top_p = top_p_;
    g.seed = seed_;
    g.eos_ids = eos;
    g.context = context;
    g.compute_error = [&trainer](const std::string& phase, Status s) {
      return trainer->ComputeError(phase, std::move(s));
    };
    STRATA_ASSIGN_OR_RETURN(GenerationReport r, Generate(g));

    result["model"] = options_.model;
    result["prompt_ids"] = prompt;
    result["ids"] = r.ids;
    if (bytes) {
      result["text"] = BytesText(r.ids);
    } else if (tokenizer) {
      STRATA_ASSIGN_OR_RETURN(std::string text, tokenizer->Decode(r.ids));
      result["text"] = text;
    } else {
      result["text"] = nullptr;
      result["no_text_reason"] = no_text;
    }
    result["stop_reason"] = r.stop_reason;
    result["eos_ids"] = eos;
    result["eos_source"] = eos_source;
    result["mode"] = temperature_ == 0 ? "greedy" : "sample";
    result["temperature"] = temperature_;
    result["top_p"] = top_p_;
    result["seed"] = seed_;
    result["max_new_tokens"] = max_new_tokens_;
    result["context"] = context;
    result["kv_cache"] = r.kv_cache;
    const Home params = trainer->engine().options().params;
    result["params_on"] = params == Home::kDevice ? "device" : std::string(HomeName(params));
    result["device"] = trainer->device_description();
    result["pinned_arena_bytes"] = trainer->engine().pinned_arena_bytes();
    result["prompt_tokens"] = prompt_tokens;
    result["new_tokens"] = r.ids.size();
    result["prefill_seconds"] = r.prefill_seconds;
    result["decode_seconds"] = r.decode_seconds;
    result["decode_forwards"] = r.decode_forwards;
    result["cache_rebuilds"] = r.cache_rebuilds;
    result["prompt_tokens_per_second"] =
        r.prefill_seconds > 0 ? prompt_tokens / r.prefill_seconds : 0.0;
    result["generation_tokens_per_second"] =
        r.decode_seconds > 0 ? r.decode_forwards / r.decode_seconds : 0.0;
    result["page_experts"] = options_.page_experts;
    result["prefill_nvme_read_bytes"] = r.prefill_nvme_read_bytes;
    result["decode_nvme_read_bytes"] = r.decode_nvme_read_bytes;
    // Per token after the first (each a forward of its own on the KV cache).
    result["nvme_read_bytes_per_token"] =
        r.decode_forwards > 0 ? static_cast<double>(r.decode_nvme_read_bytes) / r.decode_forwards
                              : 0.0;
    result["peak_rss_bytes"] = PeakResidentBytes();
    return Status::Ok();
  }

  void PrintText(const json& r, std::FILE* out) const override {
    if (r["text"].is_string()) {
      std::fprintf(out, "%s\n", r["text"].get<std::string>().c_str());
    } else {
      std::string ids;
      for (const json& id : r["ids"]) ids += (ids.empty() ? "" : " ") + id.dump();
      std::fprintf(out, "%s\n(token ids: %s)\n", ids.c_str(),
                   r["no_text_reason"].get<std::string>().c_str());
    }
    std::fprintf(
        out,
        "prompt %lld tokens in %.3f s (%.1f tokens/s); generated %llu tokens, %.1f "
        "tokens/s after the first (%s); stopped: %s; EOS: %s; params on %s; peak RSS "
        "%.2f GB\n",
        static_cast<long long>(r["prompt_tokens"].get<int64_t>()),
        r["prefill_seconds"].get<double>(), r["prompt_tokens_per_second"].get<double>(),
        static_cast<unsigned long long>(r["new_tokens"].get<uint64_t>()),
        r["generation_tokens_per_second"].get<double>(),
        r["kv_cache"].get<bool>() ? "KV cache" : "no KV cache: sequence recomputed",
        r["stop_reason"].get<std::string>().c_str(), r["eos_source"].get<std::string>().c_str(),
        r["params_on"].get<std::string>().c_str(), r["peak_rss_bytes"].get<double>() / 1e9);
    const uint64_t decode_read = r["decode_nvme_read_bytes"].get<uint64_t>();
    if (decode_read > 0 || r["prefill_nvme_read_bytes"].get<uint64_t>() > 0) {
      std::fprintf(
          out, "NVMe read: prompt %s, %s per token after the first%s\n",
          FormatBytes(r["prefill_nvme_read_bytes"].get<uint64_t>()).c_str(),
          FormatBytes(static_cast<uint64_t>(r["nvme_read_bytes_per_token"].get<double>())).c_str(),
          r["page_experts"].get<bool>() ? " (experts paged one by one)" : "");
    }
  }

 private:
  static std::string FormatNumber(double v) {
    std::ostringstream s;
    s << v;
    return s.str();
  }

  TrainerOptions options_;
  std::string prompt_;
  std::string prompt_ids_;
  int64_t max_new_tokens_ = 32;
  double temperature_ = 0;
  double top_p_ = 1;
  uint64_t seed_ = 0;
};

}  // namespace

std::unique_ptr<Command> NewGenerateCommand() { return std::make_unique<GenerateCommand>(); }

}  // namespace strata::runtime
