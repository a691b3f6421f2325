// `strata estimate`: memory per tier (GPU, pinned host, pageable host, NVMe) for each offload mode,
// from runtime/plan/memory_plan.h (the same plan the engine sizes its buffers from), next to
// DeepSpeed's estimator for comparison; with --config, whether the configured mode fits this
// machine and, if not, which config keys to change (runtime/plan/plan_fit.h).
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
// NVMe bytes per training step (runtime/plan/step_traffic.h: the layout's bytes, each block read
// where it is used and written where it changes) for each mode. Mixtures of experts are planned
// as `strata train` runs them: whole layers as units, or with --page-experts each layer's
// attention and each expert as units of their own (the device window then holds two of the
// largest such unit, not two layers); their traffic counts a routed expert by the expected share
// of steps whose tokens reach it under uniform routing (llama_shape.h's ExpertHitProbability,
// 1 - (1 - k/E)^tokens), for micro-batch × seq-len tokens per micro-batch, × accumulation × ranks
// per step. Whole layers and --page-experts are both reported for the configured mode (else
// params+optimizer nvme), the figure a user weighs the flag by.
//
// --mode eval|generate plans an inference engine instead (memory_plan.h: the weights at
// offload_param, no gradients, no optimizer state; generate adds the KV cache), for the three
// homes of the parameters.
//
// The config is parsed and validated by runtime/config/config.h (unknown keys and bad values are
// errors naming the key), so estimate accepts exactly the configs `strata train` does.
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
#include "runtime/commands/commands.h"
#include "runtime/commands/estimate_text.h"
#include "runtime/commands/flag_checks.h"
#include "runtime/commands/training_flags.h"
#include "runtime/config/config.h"
#include "runtime/plan/llama_shape.h"
#include "runtime/plan/machine_info.h"
#include "runtime/plan/memory_plan.h"
#include "runtime/plan/model_presets.h"
#include "runtime/plan/model_spec.h"
#include "runtime/plan/placement.h"
#include "runtime/plan/plan_fit.h"
#include "runtime/plan/step_traffic.h"
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
// --mode eval|generate: an inference engine has no optimizer (memory_plan.h); only the
// parameters' home varies.
constexpr ModeSpec kInferenceModes[] = {
    {"no offload", Home::kDevice, Home::kDevice},
    {"params cpu", Home::kCpu, Home::kDevice},
    {"params nvme", Home::kNvme, Home::kDevice},
};

// The part of a DeepSpeed config estimate reads; `plan` is what train's engine reads of it too
// (runtime/plan/model_spec.h).
struct ConfigSettings {
  Home params = Home::kDevice;
  Home optimizer = Home::kDevice;
  std::string param_nvme_path, optimizer_nvme_path;
  PlanSettings plan;
  std::vector<std::string> warnings;  // from the config parser
  std::vector<std::string> auto_resolved;
  std::string lr_schedule;  // DescribeLrSchedule's line
  int accumulation = 1;     // gradient_accumulation_steps (resolved)
};

// Loads and validates `path` with runtime/config/config.h and keeps what the plan needs. "auto"
// values are resolved from `options` (the flags, training_flags.h), as `strata train` resolves
// them.
Result<ConfigSettings> ReadConfig(const std::string& path, const ParseOptions& options) {
  STRATA_ASSIGN_OR_RETURN(Config config, LoadConfigFile(path, options));
  ConfigSettings out;
  out.params = config.zero.offload_param.device;
  out.optimizer = config.zero.offload_optimizer.device;
  out.param_nvme_path = config.zero.offload_param.nvme_path;
  out.optimizer_nvme_path = config.zero.offload_optimizer.nvme_path;
  out.plan = PlanSettingsFor(config);
  out.warnings = std::move(config.warnings);
  out.auto_resolved = std::move(config.auto_resolved);
  out.lr_schedule = DescribeLrSchedule(
      config.scheduler, config.optimizer.value_or(cpu_optimizer::OptimizerOptions{}).lr);
  if (config.gradient_accumulation_steps > 0) {
    out.accumulation = static_cast<int>(config.gradient_accumulation_steps);
  }
  return out;
}

// "1.3e9", "125M", "6.7B", "350k": decimal multipliers (k, M, B or G, T).
Result<uint64_t> ParseCount(const std::string& text) {
  size_t end = 0;
  double v = 0;
  try {
    v = std::stod(text, &end);
  } catch (const std::exception&) {
    return InvalidArgumentError("not a count: '" + text + "'");
  }
  std::string suffix = text.substr(end);
  double scale = 1;
  if (suffix == "k" || suffix == "K") {
    scale = 1e3;
  } else if (suffix == "M" || suffix == "m") {
    scale = 1e6;
  } else if (suffix == "B" || suffix == "b" || suffix == "G" || suffix == "g") {
    scale = 1e9;
  } else if (suffix == "T" || suffix == "t") {
    scale = 1e12;
  } else if (!suffix.empty()) {
    return InvalidArgumentError("bad suffix in count '" + text + "' (k, M, B, T)");
  }
  v *= scale;
  if (!(v >= 1) || v > 1e15) return InvalidArgumentError("count out of range: '" + text + "'");
  return static_cast<uint64_t>(std::llround(v));
}

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

class EstimateCommand final : public Command {
 public:
  EstimateCommand()
      : Command("estimate",
                "Memory per tier (GPU, pinned host, host, NVMe) for each offload mode, next to "
                "DeepSpeed's estimator; with --config, whether it fits this machine") {}

  void AddFlags(CLI::App& cmd) override {
    cmd.add_option("--model", model_,
                   "A Hugging Face model directory (its config.json is read; the weights are not "
                   "needed) or a preset (" +
                       ModelSpec::PresetNames() + "), resolved as train does");
    cmd.add_option("--seq-len", seq_len_,
                   "Sequence length the activations are sized for (default: a GPT preset's own; " +
                       std::to_string(kDefaultLlamaSeqLen) +
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
    cmd.add_option("--mode", mode_,
                   "What the plan is for: train (default), eval or generate (an inference engine: "
                   "the weights only, no gradients or optimizer state; generate adds the KV cache "
                   "of --micro-batch sequences of --seq-len tokens)")
        ->check(CLI::IsMember({"train", "eval", "generate"}));
    cmd.add_flag("--items", items_, "Itemize every mode, not only the configured one");
    cmd.add_option("--host-memory", host_memory_,
                   "Host budget, as `strata train --host-memory` (auto (default), a size, or 0: "
                   "no tier): what the process, the host-emulated device and the arena leave of "
                   "it keeps blocks in RAM instead of on NVMe (the split and the NVMe bytes per "
                   "step show it); modes are marked by whether they fit a size, and a config "
                   "that does not is refused")
        ->check(flags::ByteSizeOrAuto(0, flags::kMaxBytes));
    cmd.add_option("--device-memory", device_memory_,
                   "As `strata train --device-memory`: on a machine without a GPU the device is "
                   "emulated in host memory, which the host budget holds (default: every "
                   "parameter fits, as train's)")
        ->check(flags::ByteSize(0, flags::kMaxBytes));
    // Planned as `strata train --page-experts` runs it: units per expert, NVMe traffic by the
    // experts the step's tokens reach.
    AddPageExpertsFlag(cmd, &page_experts_);
    cmd.add_option(
           "--nproc", nproc_,
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
  std::string mode_ = "train";
  std::string host_memory_;  // empty: DefaultHostMemorySpec()
  std::string device_memory_ = "0";
  int seq_len_ = 0;  // 0: the model's default (see --seq-len)
  TrainingFlags flags_;
  bool items_ = false;
  bool page_experts_ = false;
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

  // --host-memory, as `strata train` resolves it for one of --nproc ranks: a size caps the run
  // and sizes the host-RAM tier; auto sizes the tier only (DefaultHostBudget of this machine's
  // usable memory). Both hold the process and, without a GPU, the emulated device's memory.
  STRATA_ASSIGN_OR_RETURN(
      const HostBudget budget,
      ParseHostBudget(host_memory_.empty() ? DefaultHostMemorySpec() : host_memory_,
                      ReadHostMemory()));
  const uint64_t cache_budget = budget.budget / static_cast<uint64_t>(nproc_);
  const uint64_t host_budget = budget.automatic ? 0 : cache_budget;
  STRATA_ASSIGN_OR_RETURN(const uint64_t device_memory, ParseBytes(device_memory_));
  const MachineCapacity machine = ProbeMachineCapacity();
  // The device's bytes as train opens them: --device-memory, or without a GPU the emulated
  // device's default; 0 (not known here) on a GPU without --device-memory.
  auto device_budget_of = [&](const PlanInput& in) -> uint64_t {
    if (device_memory != 0) return device_memory;
    return machine.has_gpu ? 0 : EmulatedDeviceDefaultBudget(in);
  };
  auto beside_of = [&](const PlanInput& in) {
    HostBeside beside;  // reported with any budget, so a user sees what a size must hold
    beside.process = kHostProcessReserve;
    if (!machine.has_gpu) beside.emulated_device = device_budget_of(in);  // host RAM there
    return beside;
  };
  // `in` with the host-RAM tier the budget leaves beyond the process, the device and the arena.
  auto with_cache = [&](PlanInput in) {
    in.host_cache_bytes = 0;
    if (cache_budget != 0) in.host_cache_bytes = HostCacheBytesFor(in, cache_budget, beside_of(in));
    return in;
  };
  std::optional<ModelSpec> model;
  if (by_model) {
    STRATA_ASSIGN_OR_RETURN(model, ResolveModel(model_, seq_len_, Weights::kOptional));
  }
  const bool moe = model && model->llama && model->llama->num_experts > 0;
  if (page_experts_ && !model) {
    return InvalidArgumentError(
        "--page-experts needs a mixture of experts (Mixtral, Qwen2-MoE) given by --model");
  }
  if (model) STRATA_RETURN_IF_ERROR(ApplyPageExperts(page_experts_, model_, *model));
  if (page_experts_ && nproc_ > 1) return PageExpertsRanksError();
  const std::optional<GptShape>& shape = model ? model->gpt : std::nullopt;
  const std::optional<LlamaShape>& llama = model ? model->llama : std::nullopt;
  std::optional<int64_t> hidden_size;
  if (shape) hidden_size = shape->d_model;
  if (llama) hidden_size = llama->hidden_size;
  const ParseOptions parse_options = flags_.MakeParseOptions(hidden_size, std::nullopt);
  std::optional<ConfigSettings> config;
  if (!config_.empty()) {
    STRATA_ASSIGN_OR_RETURN(config, ReadConfig(config_, parse_options));
  }
  // Without a config: DeepSpeed's defaults (a default Config), in bf16 unless --dtype says.
  const PlanSettings settings = config ? config->plan : PlanSettingsFor(Config{});
  int compute_bytes = 2;
  std::string dtype = "bf16";
  if (!dtype_.empty()) {
    dtype = dtype_;
    compute_bytes = dtype == "fp32" ? 4 : 2;
  } else if (config) {
    compute_bytes = settings.compute_bytes;
    dtype = settings.dtype;
  }
  int micro_batch = 1;
  if (parse_options.given.train_micro_batch_size_per_gpu) {
    micro_batch = static_cast<int>(*parse_options.given.train_micro_batch_size_per_gpu);
  } else if (settings.micro_batch) {
    micro_batch = *settings.micro_batch;
  }
  int accumulation = config ? config->accumulation : 1;
  if (parse_options.given.gradient_accumulation_steps) {
    accumulation = static_cast<int>(*parse_options.given.gradient_accumulation_steps);
  }
  // Tokens per micro-batch on a rank, for the routed experts' share of the traffic.
  const int seq_len = shape ? static_cast<int>(shape->seq_len) : model ? model->seq_len : 0;
  const uint64_t micro_batch_tokens =
      static_cast<uint64_t>(micro_batch) * static_cast<uint64_t>(seq_len);

  // The model as a PlanInput, cut into sub-groups as the config says, rank 0's share of it (the
  // largest: slices are equal and the last ones may be shorter).
  const uint64_t sub_group_size = settings.sub_group_size;
  PlanInput base;
  uint64_t total = 0, largest_layer = 0;
  if (model) {
    base = PlanInputFor(*model, settings, micro_batch, compute_bytes, nproc_, 0);
    total = TotalParams(*model);
    largest_layer = LargestLeafParams(*model);
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
    base.layout = RankLayout(base.layout, sub_group_size, nproc_, 0);
    base.compute_bytes = compute_bytes;
    if (config) ApplyPlanSettings(settings, &base);  // as PlanInputFor does for a model
  }
  const bool inference = mode_ != "train";
  base.inference = inference;
  if (mode_ == "generate") {  // keys and values of every layer, for the whole sequence
    const uint64_t b = static_cast<uint64_t>(micro_batch) * static_cast<uint64_t>(compute_bytes);
    if (shape) {
      base.kv_cache_bytes = 2 * b * static_cast<uint64_t>(shape->n_layers) *
                            static_cast<uint64_t>(shape->seq_len) *
                            static_cast<uint64_t>(shape->d_model);
    } else if (llama) {
      base.kv_cache_bytes = 2 * b * static_cast<uint64_t>(llama->num_hidden_layers) *
                            static_cast<uint64_t>(model->seq_len) *
                            static_cast<uint64_t>(llama->num_key_value_heads) *
                            static_cast<uint64_t>(llama->head_dim);
    }
  }
  NvmePaths paths{"/tmp", "/tmp"};
  bool nvme_path_assumed = true;
  if (config) {
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

  // NVMe traffic per step (step_traffic.h). A mixture of experts is also planned the other way
  // (whole layers vs --page-experts), to report what the flag changes.
  auto plan_input = [&](bool paged) -> PlanInput {
    if (!moe || paged == page_experts_) return base;
    ModelSpec other;
    other.name = model->name;
    other.llama = *model->llama;
    other.llama->page_experts = paged;
    other.seq_len = model->seq_len;
    PlanInput in = PlanInputFor(other, settings, micro_batch, compute_bytes, nproc_, 0);
    in.io_align = base.io_align;
    return in;
  };
  // The host-RAM tier of `in` (placements set) as JSON: the bytes it keeps off NVMe by class.
  auto cache_json = [&](const PlanInput& in) {
    const HostCacheSplit split = SplitHostCache(in);
    const HostBeside beside = beside_of(in);
    return json{
        {"budget", cache_budget},
        {"beside", {{"process", beside.process}, {"emulated_device", beside.emulated_device}}},
        {"bytes", split.bytes()},
        {"grads", split.grad_bytes},
        {"state", split.state_bytes},
        {"params", split.unit_bytes},
        {"units", split.units}};
  };
  auto traffic = [&](const PlanInput& in, bool paged) {
    // A mixture of experts counts every use (whole layers and --page-experts alike, so the two
    // compare); a dense model what stays in memory between uses (step_traffic.h).
    std::vector<UnitUse> use;
    if (llama && moe) {
      LlamaShape s = *llama;
      s.page_experts = paged;
      use = LlamaUnitUse(s, accumulation, micro_batch_tokens, nproc_);
    }
    return NvmeTrafficPerStep(in, accumulation, use);
  };
  const uint64_t step_tokens =
      micro_batch_tokens * static_cast<uint64_t>(accumulation) * static_cast<uint64_t>(nproc_);
  // Mode `label` (parameters at `params`, the optimizer at `optimizer`, placed): the planned
  // layout's traffic and, for a mixture of experts, whole layers against --page-experts.
  auto traffic_summary = [&](const std::string& label, Home params, Home optimizer) {
    json t = {{"mode", label},
              {"offload_param", HomeName(params)},
              {"optimizer_home", HomeName(optimizer)},
              {"micro_batch", micro_batch},
              {"seq_len", seq_len},
              {"accumulation", accumulation},
              {"ranks", nproc_},
              {"tokens_per_micro_batch", micro_batch_tokens},
              {"tokens_per_step", step_tokens},
              {"page_experts", page_experts_},
              {"model",
               "the layout's bytes: parameters on NVMe read for forward and for backward but "
               "the units the device window (--device-memory, or without a GPU the emulated "
               "device's default; on a GPU without --device-memory not known here: a run reads "
               "fewer) or the parameter pool still holds, gradients written per hand-off "
               "and read back where the gradient pool no longer holds them, optimizer state "
               "read and written per step; with page_experts a block is read at every use and "
               "experts the step's tokens do not reach may be read ahead"}};
    PlanInput planned = base;
    planned.params = params;
    planned.optimizer = optimizer;
    planned = with_cache(planned);
    planned.device_unit_slots = DeviceUnitSlots(planned, device_budget_of(planned));
    t.update(StepTrafficJson(traffic(planned, page_experts_)));
    t["host_cache"] = cache_json(planned);
    if (!moe) return t;
    const LlamaShape& s = *llama;
    const double p_step = ExpertHitProbability(s, static_cast<double>(step_tokens));
    json experts = {
        {"per_layer", s.num_experts},
        {"top_k", s.num_experts_per_tok},
        {"sparse_layers", SparseLayerCount(s)},
        {"routing",
         "uniform: each token's top-k a random k of the E experts, so an expert gets at least one "
         "of T tokens with probability 1 - (1 - k/E)^T"},
        {"hit_probability_micro_batch",
         ExpertHitProbability(s, static_cast<double>(micro_batch_tokens))},
        {"hit_probability_step", p_step},
        {"active_per_layer", p_step * static_cast<double>(s.num_experts)}};
    for (const bool paged : {false, true}) {
      PlanInput in = plan_input(paged);
      in.params = params;
      in.optimizer = optimizer;
      in = with_cache(in);
      json v = StepTrafficJson(traffic(in, paged));
      v["units"] = in.layout.unit_numel.size();
      v["largest_unit_params"] = in.layout.largest_unit();
      v["device_bytes"] = PlanMemory(in).total.device;
      experts[paged ? "page_experts" : "whole_layers"] = v;
    }
    t["experts"] = experts;
    return t;
  };

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
                  {"seq_len", model->seq_len}};
    if (moe) {
      j["model"]["num_experts"] = llama->num_experts;
      j["model"]["num_experts_per_tok"] = llama->num_experts_per_tok;
      j["model"]["moe_intermediate_size"] = llama->moe_intermediate_size;
      j["model"]["shared_expert_intermediate_size"] = llama->shared_expert_intermediate_size;
    }
  } else {
    j["model"] = nullptr;
  }
  j["params"] = total;
  j["largest_layer"] = largest_layer;
  j["units"] = base.layout.unit_numel.size();
  j["unit_params"] = base.layout.unit_numel.empty() ? 0 : base.layout.unit_numel.front();
  j["largest_unit_params"] = base.layout.largest_unit();  // the device window's grain
  j["page_experts"] = page_experts_;
  j["resident_params"] = base.layout.resident_numel;
  j["mode"] = mode_;
  j["optimizer_state"] = !inference;  // an inference plan has none
  j["settings"] = {{"dtype", dtype},
                   {"compute_bytes", base.compute_bytes},
                   {"state_bytes", base.state_bytes},
                   {"micro_batch", micro_batch},
                   {"accumulation", accumulation},
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
  const std::vector<ModeSpec> modes =
      inference ? std::vector<ModeSpec>(std::begin(kInferenceModes), std::end(kInferenceModes))
                : std::vector<ModeSpec>(std::begin(kModes), std::end(kModes));
  for (const ModeSpec& spec : modes) {
    PlanInput in = base;
    in.params = spec.params;
    // Planned where the engine would run it (16-bit without offload: the optimizer on the CPU).
    in.optimizer =
        inference ? Home::kDevice : PlaceOptimizer(spec.params, spec.optimizer, dtype).home;
    const DeepSpeedEstimate deepspeed =
        DeepSpeedZero3Estimate(total, largest_layer, spec.optimizer != Home::kDevice,
                               spec.params != Home::kDevice, nproc_);
    // --host-memory: would `strata train` accept this arena (without the tier, which only takes
    // what the budget leaves)?
    const uint64_t host_need = PlanMemory(in).pinned_arena_bytes + beside_of(in).total();
    in = with_cache(in);
    const MemoryPlan mode_plan = PlanMemory(in);
    json mode = PlanJson(mode_plan);
    mode["name"] = spec.name;
    if (host_budget != 0) mode["within_host_memory"] = host_need <= host_budget;
    mode["host_cache"] = cache_json(in);
    mode["offload_param"] = HomeName(spec.params);
    // Where strata keeps the optimizer state; "none" in inference.
    mode["offload_optimizer"] = inference ? "none" : std::string(HomeName(spec.optimizer));
    mode["optimizer_home"] = inference ? "none" : std::string(HomeName(in.optimizer));
    // DeepSpeed's estimator plans training only.
    mode["deepspeed"] = {{"gpu", inference ? 0 : deepspeed.gpu},
                         {"cpu", inference ? 0 : deepspeed.cpu}};
    if (!inference) mode["nvme_per_step"] = StepTrafficJson(traffic(in, page_experts_));
    j["modes"].push_back(mode);
  }
  if (!config) {
    if (!inference) {
      j["nvme_per_step"] = traffic_summary("params+optimizer nvme", Home::kNvme, Home::kNvme);
    }
    return Status::Ok();
  }

  // The configured mode against this machine.
  PlanInput in = base;
  in.params = config->params;
  // Where `strata train --device auto` would run it on this machine (bf16 without offload keeps
  // its optimizer on a GPU).
  OptimizerPlacement placed;
  if (inference) {
    placed.home = Home::kDevice;  // none
  } else {
    placed = PlaceOptimizer(config->params, config->optimizer, dtype, machine.has_gpu);
  }
  in.optimizer = placed.home;
  if (!placed.warning.empty()) config->warnings.push_back(placed.warning);
  // What `strata train` refuses for this config, estimate refuses too.
  STRATA_RETURN_IF_ERROR(CheckOffloadBuffers(in));
  {
    const MemoryPlan arena_only = PlanMemory(in);
    const HostBeside beside = beside_of(in);
    if (host_budget != 0 && arena_only.pinned_arena_bytes + beside.total() > host_budget) {
      return HostBudgetError(arena_only, arena_only.pinned_arena_bytes, beside, host_budget,
                             "--host-memory");
    }
  }
  in = with_cache(in);
  const MemoryPlan plan = PlanMemory(in);
  const Fit fit = CheckFit(plan, machine, paths);
  json c = {{"path", config_},
            {"offload_param", HomeName(config->params)},
            {"offload_optimizer", inference ? "none (" + mode_ + ": no optimizer state)"
                                            : std::string(HomeName(config->optimizer))},
            {"optimizer_home", inference ? "none" : std::string(HomeName(placed.home))},
            {"nvme_path_params", paths.params},
            {"nvme_path_optimizer", paths.optimizer},
            {"nvme_path_assumed", nvme_path_assumed},
            {"warnings", config->warnings},
            {"auto_resolved", config->auto_resolved},
            {"lr_schedule", config->lr_schedule},
            {"plan", PlanJson(plan)},
            {"host_cache", cache_json(in)},
            {"fit", FitJson(fit, machine)}};
  if (!fit.fits) {
    // Smaller micro-batches are tried with the model's activations at each.
    ActivationModel activations;
    if (shape) {
      activations = [&](int mb, int cb) { return GptActivationBytes(*shape, mb, cb); };
    } else if (llama) {
      activations = [&](int mb, int cb) {
        return LlamaActivationBytes(*llama, mb, model->seq_len, cb);
      };
    }
    const std::optional<FitSuggestion> suggestion =
        SuggestChanges(in, sub_group_size, activations, micro_batch, machine, paths);
    c["suggestion"] = suggestion ? json(suggestion->changes) : json(nullptr);
    if (suggestion) c["suggestion_fit"] = FitJson(suggestion->fit, machine);
  }
  j["config"] = c;
  if (!inference) {
    // The configured mode's traffic, unless it has none (then the mode that has the most).
    const bool nvme = in.params == Home::kNvme || in.optimizer == Home::kNvme;
    j["nvme_per_step"] = nvme ? traffic_summary("config", in.params, in.optimizer)
                              : traffic_summary("params+optimizer nvme", Home::kNvme, Home::kNvme);
  }
  return Status::Ok();
}

void EstimateCommand::PrintText(const json& j, std::FILE* out) const {
  PrintEstimate(j, items_, out);
}

}  // namespace

std::unique_ptr<Command> NewEstimateCommand() { return std::make_unique<EstimateCommand>(); }

}  // namespace strata::runtime
