// `strata estimate`: memory per tier (GPU, pinned host, pageable host, NVMe) for each offload mode,
// from runtime/memory_plan.h (the same plan the engine sizes its buffers from), next to DeepSpeed's
// estimator for comparison; with --config, whether the configured mode fits this machine and, if
// not, which config keys to change (runtime/plan_fit.h).
//
// Algorithm: the model (a GPT preset, a Llama-family preset or a Hugging Face model directory's
// config.json, runtime/plan/llama_shape.h; or --params/--largest-layer with units of the largest
// layer's size and the remainder resident) becomes a PlanInput, its activations at --micro-batch
// and --seq-len; the config, if any, sets precision, optimizer state size, micro-batch,
// sub_group_size, buffer_count and pipelining, and its nvme_path sets the extent alignment
// (max(logical block, 4 KiB)). Five modes are planned (no offload; optimizer cpu; optimizer nvme;
// params+optimizer cpu; params+optimizer nvme), then the configured mode is checked against the
// machine. Each is planned where the engine puts the optimizer (runtime/plan/placement.h): with
// bf16/fp16 or offloaded parameters and offload_optimizer none, on the CPU with its state in
// pinned memory.
//
// The config is parsed and validated by runtime/config.h (unknown keys and bad values are errors
// naming the key), so estimate accepts exactly the configs `strata train` does.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/json_text.h"
#include "runtime/commands/command.h"
#include "runtime/commands/flag_checks.h"
#include "runtime/commands/commands.h"
#include "runtime/commands/estimate_model.h"
#include "runtime/commands/training_flags.h"
#include "runtime/config/config.h"
#include "runtime/persist/hf_checkpoint.h"
#include "runtime/plan/llama_shape.h"
#include "runtime/plan/machine_info.h"
#include "runtime/plan/memory_plan.h"
#include "runtime/plan/model_presets.h"
#include "runtime/plan/placement.h"
#include "runtime/plan/plan_fit.h"
#include "swap/direct_io.h"
#include "tiers/tier.h"

namespace strata::runtime {
namespace {

using nlohmann::json;

struct ModeSpec {
  const char* name;
  Home params;
  Home optimizer;
};
constexpr ModeSpec kModes[] = {
    {"no offload", Home::kDevice, Home::kDevice},
    {"optimizer cpu", Home::kDevice, Home::kCpu},
    {"optimizer nvme", Home::kDevice, Home::kNvme},
    {"params+optimizer cpu", Home::kCpu, Home::kCpu},
    {"params+optimizer nvme", Home::kNvme, Home::kNvme},
};

// The part of a DeepSpeed config estimate reads. Unset fields keep strata's defaults.
struct ConfigSettings {
  Home params = Home::kDevice;
  Home optimizer = Home::kDevice;
  std::string param_nvme_path, optimizer_nvme_path;
  Config config;  // the parsed file (sub_group_size is read from it, not copied)
  std::optional<int> buffer_count;
  uint64_t param_buffer_size = 0;  // offload_param.buffer_size; 0: not given
  uint64_t max_in_cpu = 0;         // offload_param.max_in_cpu; 0: not given
  int optimizer_buffer_count = 4;  // offload_optimizer.buffer_count
  std::optional<bool> pipeline;
  std::optional<int> compute_bytes;
  std::string dtype;  // "fp32", "bf16" or "fp16", from the fp16/bf16 sections
  std::optional<int> state_bytes;
  std::optional<int> micro_batch;
  std::vector<std::string> warnings;  // from the config parser
  std::vector<std::string> auto_resolved;
};

// Loads and validates `path` with runtime/config.h and keeps what the plan needs. "auto" values
// are resolved from `options` (the flags, training_flags.h), as `strata train` resolves them.
Result<ConfigSettings> ReadConfig(const std::string& path, const ParseOptions& options) {
  STRATA_ASSIGN_OR_RETURN(Config config, LoadConfigFile(path, options));
  ConfigSettings out;
  out.params = config.zero.offload_param.device;
  out.optimizer = config.zero.offload_optimizer.device;
  out.param_nvme_path = config.zero.offload_param.nvme_path;
  out.optimizer_nvme_path = config.zero.offload_optimizer.nvme_path;
  out.config = config;
  constexpr int64_t kIntLimit = std::numeric_limits<int>::max();
  out.buffer_count = static_cast<int>(std::min(config.zero.offload_param.buffer_count, kIntLimit));
  out.param_buffer_size = static_cast<uint64_t>(config.zero.offload_param.buffer_size.value_or(0));
  out.max_in_cpu = static_cast<uint64_t>(config.zero.offload_param.max_in_cpu.value_or(0));
  out.optimizer_buffer_count =
      static_cast<int>(std::min(config.zero.offload_optimizer.buffer_count, kIntLimit));
  out.pipeline =
      config.zero.offload_optimizer.pipeline_read || config.zero.offload_optimizer.pipeline_write;
  if (config.fp16.enabled) {
    out.compute_bytes = 2;
    out.dtype = "fp16";
  } else if (config.bf16.enabled) {
    out.compute_bytes = 2;
    out.dtype = "bf16";
  } else {
    out.compute_bytes = 4;
    out.dtype = "fp32";
  }
  if (config.optimizer) {
    const cpu_optimizer::OptimizerType type = config.optimizer->type;
    const int moments = type == cpu_optimizer::OptimizerType::kAdagrad ||
                                type == cpu_optimizer::OptimizerType::kLion
                            ? 1
                            : 2;
    // The fp32 master, then the moments (bf16 with bf16.bf16_optimizer_states).
    out.state_bytes = 4 + moments * (config.bf16.enabled && config.bf16.optimizer_states ? 2 : 4);
  }
  if (config.train_micro_batch_size_per_gpu > 0) {
    out.micro_batch = static_cast<int>(config.train_micro_batch_size_per_gpu);
  }
  out.warnings = std::move(config.warnings);
  out.auto_resolved = std::move(config.auto_resolved);
  return out;
}

// Llama-family models are estimated at this sequence length unless --seq-len says otherwise.
constexpr int kLlamaDefaultSeqLen = 2048;

json TierJson(const TierBytes& t) {
  return {{"device", t.device}, {"pinned", t.pinned}, {"host", t.host}, {"nvme", t.nvme}};
}

json FitJson(const Fit& fit, const MachineCapacity& m) {
  json disks = json::array();
  for (const DiskCheck& d : fit.disks) {
    json j = {{"path", d.path}, {"need", d.need}, {"free", d.free}};
    if (!d.error.empty()) j["error"] = d.error;
    disks.push_back(j);
  }
  json j = {{"fits", fit.fits},
            {"device_need", fit.device_need},
            {"host_need", fit.host_need},
            {"host_available", fit.host_have},
            {"gpu", m.has_gpu ? json(m.gpu_name) : json(nullptr)},
            {"disks", disks},
            {"problems", fit.problems}};
  if (m.has_gpu) {
    j["device_available"] = fit.device_have;
  } else {
    j["device_note"] = "no GPU: device = host emulation (" + m.gpu_reason + ")";
  }
  return j;
}

// ---- The plan as JSON, and the text read from it ------------------------------------------------

json PlanJson(const MemoryPlan& plan) {
  json items = json::array();
  for (const auto& [name, bytes] : plan.items) {
    json item = TierJson(bytes);
    item["name"] = name;
    items.push_back(item);
  }
  return {{"total", TierJson(plan.total)},
          {"padding", TierJson(plan.padding)},
          {"pinned_arena_bytes", plan.pinned_arena_bytes},
          {"device_min_bytes", plan.device_min_bytes},
          {"largest_unit", plan.largest_unit},
          {"largest_sub_group", plan.largest_sub_group},
          {"sub_groups", plan.sub_groups},
          {"items", items}};
}

uint64_t U64(const json& j) { return j.get<uint64_t>(); }
std::string Bytes(const json& j) { return FormatBytes(U64(j)); }
std::string Str(const json& j) { return j.get<std::string>(); }
uint64_t SumTiers(const json& t) {
  return U64(t["device"]) + U64(t["pinned"]) + U64(t["host"]) + U64(t["nvme"]);
}

void PrintItems(const json& plan, std::FILE* out) {
  std::fprintf(out, "  %-26s %12s %12s %12s %12s\n", "item", "GPU", "pinned", "host", "NVMe");
  auto cell = [](const json& b) { return U64(b) == 0 ? std::string("-") : Bytes(b); };
  for (const json& item : plan["items"]) {
    std::fprintf(out, "  %-26s %12s %12s %12s %12s\n", Str(item["name"]).c_str(),
                 cell(item["device"]).c_str(), cell(item["pinned"]).c_str(),
                 cell(item["host"]).c_str(), cell(item["nvme"]).c_str());
  }
}

void PrintFit(const json& fit, std::FILE* out) {
  std::fprintf(out, "  GPU:    ");
  if (!fit["gpu"].is_null()) {
    std::fprintf(out, "%s needed, %s has %s\n", Bytes(fit["device_need"]).c_str(),
                 Str(fit["gpu"]).c_str(), Bytes(fit["device_available"]).c_str());
  } else {
    std::fprintf(out, "no GPU: device = host emulation (its %s counted as host memory)\n",
                 Bytes(fit["device_need"]).c_str());
  }
  std::fprintf(out, "  host:   %s needed, %s available (MemAvailable)\n",
               Bytes(fit["host_need"]).c_str(), Bytes(fit["host_available"]).c_str());
  for (const json& d : fit["disks"]) {
    if (d.contains("error")) {
      std::fprintf(out, "  NVMe:   %s: %s\n", Str(d["path"]).c_str(), Str(d["error"]).c_str());
    } else {
      std::fprintf(out, "  NVMe:   %s needed at %s, %s free\n", Bytes(d["need"]).c_str(),
                   Str(d["path"]).c_str(), Bytes(d["free"]).c_str());
    }
  }
}

class EstimateCommand final : public Command {
 public:
  EstimateCommand()
      : Command("estimate",
                "Memory per tier (GPU, pinned host, host, NVMe) for each offload mode, next to "
                "DeepSpeed's estimator; with --config, whether it fits this machine") {}

  void AddFlags(CLI::App& cmd) override {
    cmd.add_option("--model", model_,
                   "A preset (" + PresetNames() +
                       ") or a Hugging Face model directory (its config.json is read; the weights "
                       "are not needed)");
    cmd.add_option("--seq-len", seq_len_,
                   "Sequence length the activations are sized for (default: a GPT preset's own; " +
                       std::to_string(kLlamaDefaultSeqLen) +
                       " for Llama-family models). For a GPT it also sizes the position embedding, "
                       "as `strata train --seq-len` does")
        ->check(flags::SeqLen());
    cmd.add_option("--params", params_,
                   "Total parameters (e.g. 1.3e9, 6.7B), with --largest-layer instead of --model");
    cmd.add_option("--largest-layer", largest_layer_,
                   "Parameters of the largest layer; units are assumed of this size");
    cmd.add_option("--config", config_,
                   "DeepSpeed JSON config: its offload mode is checked against this machine")
        ->check(flags::InputFile());
    cmd.add_option("--dtype", dtype_,
                   "Compute precision fp32|bf16|fp16 (default: the config's fp16/bf16, else bf16)")
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
    cmd.add_flag("--items", items_, "Itemize every mode, not only the configured one");
    cmd.add_option("--host-memory", host_memory_,
                   "Cap on the pinned host arena, as `strata train --host-memory` (default 0: no "
                   "limit): modes are marked by whether they fit it, and a config that does not "
                   "fit is refused")
        ->check(flags::ByteSize(0, flags::kMaxBytes));
    cmd.add_option("--nproc", nproc_,
                   "Data-parallel ranks (`strata train --nproc`): the plan of one rank, which keeps "
                   "1/N of the partitioned state (default 1)")
        ->check(CLI::Range(1, 1024));
    // --micro-batch also sizes the activations (default: the config's
    // train_micro_batch_size_per_gpu, else 1).
    flags_.Add(cmd);
  }

  Status Run(CommandContext& ctx, json& j) override;
  void PrintText(const json& j, std::FILE* out) const override;

 private:
  std::string model_, params_, largest_layer_, config_, dtype_;
  std::string host_memory_ = "0";
  int seq_len_ = 0;  // 0: the model's default (see --seq-len)
  TrainingFlags flags_;
  bool items_ = false;
  int nproc_ = 1;
};

Status EstimateCommand::Run(CommandContext& /*ctx*/, json& j) {
  const bool by_model = !model_.empty();
  const bool by_count = !params_.empty() || !largest_layer_.empty();
  if (by_model == by_count) {
    return InvalidArgumentError("give either --model PRESET|DIR or --params N --largest-layer N");
  }
  if (!by_model && seq_len_ > 0) {
    return InvalidArgumentError("--seq-len sizes a model's activations: it needs --model");
  }

  STRATA_ASSIGN_OR_RETURN(const uint64_t host_budget, ParseBytes(host_memory_));
  ModelChoice model;
  if (by_model) {
    STRATA_ASSIGN_OR_RETURN(model, ResolveModel(model_));
    // As `strata train --seq-len` builds it: the position embedding follows the length.
    if (model.gpt && seq_len_ > 0) model.gpt->seq_len = seq_len_;
  }
  const std::optional<GptShape>& shape = model.gpt;
  const std::optional<LlamaShape>& llama = model.llama;
  const int llama_seq_len = seq_len_ > 0 ? seq_len_ : kLlamaDefaultSeqLen;
  std::optional<int64_t> hidden_size;
  if (shape) hidden_size = shape->d_model;
  if (llama) hidden_size = llama->hidden_size;
  const ParseOptions parse_options = flags_.MakeParseOptions(hidden_size, std::nullopt);
  std::optional<ConfigSettings> config;
  if (!config_.empty()) {
    STRATA_ASSIGN_OR_RETURN(config, ReadConfig(config_, parse_options));
  }
  int compute_bytes = 2;
  std::string dtype = "bf16";
  if (!dtype_.empty()) {
    dtype = dtype_;
    compute_bytes = dtype == "fp32" ? 4 : 2;
  } else if (config && config->compute_bytes) {
    compute_bytes = *config->compute_bytes;
    dtype = config->dtype;
  }
  int micro_batch = 1;
  if (parse_options.given.train_micro_batch_size_per_gpu) {
    micro_batch = static_cast<int>(*parse_options.given.train_micro_batch_size_per_gpu);
  } else if (config && config->micro_batch) {
    micro_batch = *config->micro_batch;
  }

  // The model as a PlanInput, cut into sub-groups as the config says (DeepSpeed's default
  // without one).
  const uint64_t sub_group_size = static_cast<uint64_t>(
      config ? config->config.zero.sub_group_size : ZeroConfig{}.sub_group_size);
  // Tensors of a layer at most stage3_param_persistence_threshold elements stay resident, as the
  // engine keeps them.
  const uint64_t persistence = static_cast<uint64_t>(
      config ? config->config.zero.param_persistence_threshold
             : ZeroConfig{}.param_persistence_threshold);
  PlanInput base;
  uint64_t total = 0, largest_layer = 0;
  if (shape) {
    base = GptPlanInput(*shape, micro_batch, compute_bytes, sub_group_size, persistence);
    total = TotalParams(*shape);
    largest_layer = LargestLeafParams(*shape);
  } else if (llama) {
    base = LlamaPlanInput(*llama, micro_batch, llama_seq_len, compute_bytes, sub_group_size,
                          persistence);
    total = LlamaTotalParams(*llama);
    largest_layer = LargestLeafParams(*llama);
  } else {
    if (params_.empty() || largest_layer_.empty()) {
      return InvalidArgumentError("--params and --largest-layer go together");
    }
    Result<uint64_t> p = ParseCount(params_);
    if (!p.ok()) return p.status().WithContext("--params");
    Result<uint64_t> l = ParseCount(largest_layer_);
    if (!l.ok()) return l.status().WithContext("--largest-layer");
    if (*l > *p) return InvalidArgumentError("--largest-layer is larger than --params");
    total = *p;
    largest_layer = *l;
    base.layout = MakeModelLayout(std::vector<uint64_t>(total / largest_layer, largest_layer),
                                  total - (total / largest_layer) * largest_layer, sub_group_size);
    base.compute_bytes = compute_bytes;
  }
  // Ranks: rank 0's share (the largest: slices are equal and the last ones may be shorter).
  base.layout = RankLayout(base.layout, sub_group_size, nproc_, 0);
  NvmePaths paths{"/tmp", "/tmp"};
  bool nvme_path_assumed = true;
  if (config) {
    if (config->buffer_count) base.param_buffer_count = *config->buffer_count;
    base.param_buffer_size = config->param_buffer_size;
    base.max_in_cpu = config->max_in_cpu;
    base.optimizer_buffer_count = config->optimizer_buffer_count;
    if (config->pipeline) base.pipeline = *config->pipeline;
    if (config->state_bytes) base.state_bytes = *config->state_bytes;
    const std::string& pp = config->param_nvme_path;
    const std::string& op = config->optimizer_nvme_path;
    if (!pp.empty() || !op.empty()) {
      nvme_path_assumed = false;
      paths.params = pp.empty() ? op : pp;
      paths.optimizer = op.empty() ? pp : op;
      // Extents are padded to max(logical block, 4 KiB) of the swap device.
      base.io_align = std::max<uint64_t>(
          {4096, LogicalBlockSize(paths.params), LogicalBlockSize(paths.optimizer)});
    }
  }

  if (shape) {
    j["model"] = {{"name", shape->name},         {"family", "gpt"},
                  {"n_layers", shape->n_layers}, {"d_model", shape->d_model},
                  {"n_heads", shape->n_heads},   {"seq_len", shape->seq_len},
                  {"vocab", shape->vocab}};
  } else if (llama) {
    j["model"] = {{"name", llama->name},
                  {"family", "llama"},
                  {"architecture", llama->architecture},
                  {"num_hidden_layers", llama->num_hidden_layers},
                  {"hidden_size", llama->hidden_size},
                  {"intermediate_size", llama->intermediate_size},
                  {"num_attention_heads", llama->num_attention_heads},
                  {"num_key_value_heads", llama->num_key_value_heads},
                  {"head_dim", llama->head_dim},
                  {"vocab_size", llama->vocab_size},
                  {"tie_word_embeddings", llama->tie_word_embeddings},
                  {"seq_len", llama_seq_len}};
  } else {
    j["model"] = nullptr;
  }
  j["params"] = total;
  j["largest_layer"] = largest_layer;
  j["units"] = base.layout.unit_numel.size();
  j["unit_params"] = base.layout.unit_numel.empty() ? 0 : base.layout.unit_numel.front();
  j["resident_params"] = base.layout.resident_numel;
  j["settings"] = {{"dtype", dtype},
                   {"compute_bytes", base.compute_bytes},
                   {"state_bytes", base.state_bytes},
                   {"micro_batch", micro_batch},
                   {"ranks", nproc_},
                   {"sub_group_size", sub_group_size},
                   {"param_buffer_count", base.param_buffer_count},
                   {"max_in_cpu", base.max_in_cpu},
                   {"optimizer_buffer_count", base.optimizer_buffer_count},
                   {"host_memory", host_budget},
                   {"pipeline", base.pipeline},
                   {"io_align", base.io_align}};
  j["activations"] = {{"checkpoint", base.activation_checkpoint_bytes},
                      {"working", base.activation_working_bytes}};
  j["modes"] = json::array();
  for (const ModeSpec& spec : kModes) {
    PlanInput in = base;
    in.params = spec.params;
    // Planned where the engine would run it (16-bit without offload: the optimizer on the CPU).
    in.optimizer = PlaceOptimizer(spec.params, spec.optimizer, dtype).home;
    const DeepSpeedEstimate deepspeed = DeepSpeedZero3Estimate(
        total, largest_layer, spec.optimizer != Home::kDevice, spec.params != Home::kDevice,
        nproc_);
    const MemoryPlan mode_plan = PlanMemory(in);
    json mode = PlanJson(mode_plan);
    mode["name"] = spec.name;
    if (host_budget != 0) {  // --host-memory: would `strata train` accept this arena?
      mode["within_host_memory"] = mode_plan.pinned_arena_bytes <= host_budget;
    }
    mode["offload_param"] = HomeName(spec.params);
    mode["offload_optimizer"] = HomeName(spec.optimizer);
    mode["optimizer_home"] = HomeName(in.optimizer);  // where strata keeps the optimizer state
    mode["deepspeed"] = {{"gpu", deepspeed.gpu}, {"cpu", deepspeed.cpu}};
    j["modes"].push_back(mode);
  }
  if (!config) return Status::Ok();

  // The configured mode against this machine.
  PlanInput in = base;
  in.params = config->params;
  // Where `strata train --device auto` would run it on this machine (bf16 without offload keeps
  // its optimizer on a GPU).
  const MachineCapacity machine = ProbeMachineCapacity();
  const OptimizerPlacement placed =
      PlaceOptimizer(config->params, config->optimizer, dtype, machine.has_gpu);
  in.optimizer = placed.home;
  if (!placed.warning.empty()) config->warnings.push_back(placed.warning);
  // What `strata train` refuses for this config, estimate refuses too.
  STRATA_RETURN_IF_ERROR(CheckOffloadBuffers(in));
  const MemoryPlan plan = PlanMemory(in);
  if (host_budget != 0 && plan.pinned_arena_bytes > host_budget) {
    return HostBudgetError(plan, plan.pinned_arena_bytes, host_budget, "--host-memory");
  }
  const Fit fit = CheckFit(plan, machine, paths);
  json c = {{"path", config_},
            {"offload_param", HomeName(config->params)},
            {"offload_optimizer", HomeName(config->optimizer)},
            {"optimizer_home", HomeName(placed.home)},
            {"nvme_path_params", paths.params},
            {"nvme_path_optimizer", paths.optimizer},
            {"nvme_path_assumed", nvme_path_assumed},
            {"warnings", config->warnings},
            {"auto_resolved", config->auto_resolved},
            {"plan", PlanJson(plan)},
            {"fit", FitJson(fit, machine)}};
  if (!fit.fits) {
    // Smaller micro-batches are tried with the model's activations at each.
    ActivationModel activations;
    if (shape) {
      activations = [&](int mb, int cb) { return GptActivationBytes(*shape, mb, cb); };
    } else if (llama) {
      activations = [&](int mb, int cb) {
        return LlamaActivationBytes(*llama, mb, llama_seq_len, cb);
      };
    }
    const std::optional<FitSuggestion> suggestion =
        SuggestChanges(in, sub_group_size, activations, micro_batch, machine, paths);
    c["suggestion"] = suggestion ? json(suggestion->changes) : json(nullptr);
    if (suggestion) c["suggestion_fit"] = FitJson(suggestion->fit, machine);
  }
  j["config"] = c;
  return Status::Ok();
}

void EstimateCommand::PrintText(const json& j, std::FILE* out) const {
  const json& m = j["model"];
  const std::string total = FormatCount(U64(j["params"]));
  const std::string largest = FormatCount(U64(j["largest_layer"]));
  if (!m.is_null() && Str(m["family"]) == "llama") {
    std::fprintf(
        out,
        "strata estimate: model %s (%s: %d layers, hidden %d, intermediate %d, %d heads, "
        "%d kv heads, head_dim %d, vocab %d%s; seq %d)\n",
        Str(m["name"]).c_str(), Str(m["architecture"]).c_str(), m["num_hidden_layers"].get<int>(),
        m["hidden_size"].get<int>(), m["intermediate_size"].get<int>(),
        m["num_attention_heads"].get<int>(), m["num_key_value_heads"].get<int>(),
        m["head_dim"].get<int>(), m["vocab_size"].get<int>(),
        m["tie_word_embeddings"].get<bool>() ? ", tied embeddings" : "", m["seq_len"].get<int>());
  } else if (!m.is_null()) {
    std::fprintf(out, "strata estimate: model %s (%d layers, d %d, %d heads, seq %d, vocab %d)\n",
                 Str(m["name"]).c_str(), m["n_layers"].get<int>(), m["d_model"].get<int>(),
                 m["n_heads"].get<int>(), m["seq_len"].get<int>(), m["vocab"].get<int>());
  } else {
    std::fprintf(out, "strata estimate: %s parameters, largest layer %s\n", total.c_str(),
                 largest.c_str());
  }
  std::fprintf(out, "  %s params: %zu units of %s, %s resident; largest layer (DeepSpeed's L) %s\n",
               total.c_str(), j["units"].get<size_t>(), FormatCount(U64(j["unit_params"])).c_str(),
               FormatCount(U64(j["resident_params"])).c_str(), largest.c_str());
  const json& s = j["settings"];
  std::fprintf(out,
               "  %s (%d B/param on the device), optimizer state %d B/param + 4 B fp32 gradient, "
               "micro-batch %d\n",
               Str(s["dtype"]).c_str(), s["compute_bytes"].get<int>(), s["state_bytes"].get<int>(),
               s["micro_batch"].get<int>());
  std::fprintf(out,
               "  sub_group_size %llu, offload_param.buffer_count %d, pipeline %s, io_align %llu\n",
               static_cast<unsigned long long>(U64(s["sub_group_size"])),
               s["param_buffer_count"].get<int>(), s["pipeline"].get<bool>() ? "on" : "off",
               static_cast<unsigned long long>(U64(s["io_align"])));
  if (!m.is_null()) {
    std::fprintf(out, "  activations per micro-batch: checkpoints %s, working %s\n",
                 Bytes(j["activations"]["checkpoint"]).c_str(),
                 Bytes(j["activations"]["working"]).c_str());
  } else {
    std::fprintf(out, "  activations: not modelled without --model\n");
  }
  std::fprintf(out, "\n%-22s %11s %11s %11s %11s %11s | %13s %13s\n", "mode", "GPU", "pinned",
               "host", "NVMe", "padding", "DeepSpeed GPU", "DeepSpeed CPU");
  for (const json& mode : j["modes"]) {
    const json& t = mode["total"];
    std::fprintf(out, "%-22s %11s %11s %11s %11s %11s | %13s %13s\n", Str(mode["name"]).c_str(),
                 Bytes(t["device"]).c_str(), Bytes(t["pinned"]).c_str(), Bytes(t["host"]).c_str(),
                 Bytes(t["nvme"]).c_str(), FormatBytes(SumTiers(mode["padding"])).c_str(),
                 Bytes(mode["deepspeed"]["gpu"]).c_str(), Bytes(mode["deepspeed"]["cpu"]).c_str());
  }
  std::fprintf(out,
               "(padding = io_align rounding of pinned buffers and NVMe extents; DeepSpeed: "
               "estimate_zero3_model_states_mem_needs, 1 GPU, zero_init, CPU x1.5; it models NVMe "
               "modes as CPU and leaves out activations, pinned buffers and padding)\n");
  for (const json& mode : j["modes"]) {
    if (mode["optimizer_home"] != mode["offload_optimizer"]) {
      std::fprintf(out,
                   "(%s in %s: strata runs the optimizer on the CPU with its state in pinned host "
                   "memory, as with offload_optimizer cpu; DeepSpeed keeps it on the GPU)\n",
                   Str(mode["name"]).c_str(), Str(s["dtype"]).c_str());
    }
  }
  if (items_) {
    for (const json& mode : j["modes"]) {
      std::fprintf(out, "\n%s:\n", Str(mode["name"]).c_str());
      PrintItems(mode, out);
    }
  }
  if (!j.contains("config")) return;
  const json& c = j["config"];
  const json& plan = c["plan"];
  std::fprintf(out, "\n%s: offload_param.device %s, offload_optimizer.device %s%s\n",
               Str(c["path"]).c_str(), Str(c["offload_param"]).c_str(),
               Str(c["offload_optimizer"]).c_str(),
               U64(plan["total"]["nvme"]) > 0 && c["nvme_path_assumed"].get<bool>()
                   ? " (no nvme_path set: /tmp assumed)"
                   : "");
  for (const json& w : c["warnings"]) std::fprintf(out, "  warning: %s\n", Str(w).c_str());
  for (const json& r : c["auto_resolved"]) std::fprintf(out, "  %s\n", Str(r).c_str());
  PrintItems(plan, out);
  std::fprintf(out, "  pinned arena %s, device at least %s\n",
               Bytes(plan["pinned_arena_bytes"]).c_str(), Bytes(plan["device_min_bytes"]).c_str());
  std::fprintf(out, "\nThis machine:\n");
  PrintFit(c["fit"], out);
  if (c["fit"]["fits"].get<bool>()) {
    std::fprintf(out, "Fits.\n");
    return;
  }
  std::fprintf(out, "Does not fit:\n");
  for (const json& p : c["fit"]["problems"]) std::fprintf(out, "  - %s\n", Str(p).c_str());
  if (c["suggestion"].is_null()) {
    std::fprintf(out,
                 "No change of offload devices, sub_group_size, buffer_count, pipelining or "
                 "micro-batch makes it fit this machine.\n");
    return;
  }
  std::fprintf(out, "To fit, change:\n");
  for (const json& change : c["suggestion"]) std::fprintf(out, "  %s\n", Str(change).c_str());
  std::fprintf(out, "and then:\n");
  PrintFit(c["suggestion_fit"], out);
  if (c["nvme_path_assumed"].get<bool>() && !c["suggestion_fit"]["disks"].empty()) {
    std::fprintf(out, "  (the config has no nvme_path: set it too; /tmp was assumed here)\n");
  }
}

}  // namespace

std::unique_ptr<Command> NewEstimateCommand() { return std::make_unique<EstimateCommand>(); }

}  // namespace strata::runtime
