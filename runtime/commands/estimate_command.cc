// `strata estimate`: memory per tier (GPU, pinned host, pageable host, NVMe) for each offload mode,
// from runtime/memory_plan.h (the same plan the engine sizes its buffers from), next to DeepSpeed's
// estimator for comparison; with --config, whether the configured mode fits this machine and, if
// not, which config keys to change (runtime/plan_fit.h).
//
// Algorithm: the model (a preset, or --params/--largest-layer with units of the largest layer's
// size and the remainder resident) becomes a PlanInput; the config, if any, sets precision,
// optimizer state size, micro-batch, sub_group_size, buffer_count and pipelining, and its
// nvme_path sets the extent alignment (max(logical block, 4 KiB)). Five modes are planned (no
// offload; optimizer cpu; optimizer nvme; params+optimizer cpu; params+optimizer nvme), then the
// configured mode is checked against the machine.
//
// The config is parsed and validated by runtime/config.h (unknown keys and bad values are errors
// naming the key), so estimate accepts exactly the configs `strata train` does.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "runtime/commands/commands.h"
#include "runtime/config/config.h"
#include "runtime/plan/machine_info.h"
#include "runtime/plan/memory_plan.h"
#include "runtime/plan/model_presets.h"
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
  std::optional<uint64_t> sub_group_size;
  std::optional<int> buffer_count;
  std::optional<bool> pipeline;
  std::optional<int> compute_bytes;
  std::string dtype;  // "fp32", "bf16" or "fp16", from the fp16/bf16 sections
  std::optional<int> state_bytes;
  std::optional<int> micro_batch;
  std::vector<std::string> warnings;  // from the config parser
};

// Loads and validates `path` with runtime/config.h and keeps what the plan needs. "auto" values
// Hugging Face writes are resolved with `micro_batch` (train_micro_batch_size_per_gpu) and
// gradient_accumulation_steps 1.
Result<ConfigSettings> ReadConfig(const std::string& path, int micro_batch) {
  ParseOptions options;
  options.auto_values.train_micro_batch_size_per_gpu = micro_batch > 0 ? micro_batch : 1;
  options.auto_values.gradient_accumulation_steps = 1;
  STRATA_ASSIGN_OR_RETURN(Config config, LoadConfigFile(path, options));
  ConfigSettings out;
  out.params = config.zero.offload_param.device;
  out.optimizer = config.zero.offload_optimizer.device;
  out.param_nvme_path = config.zero.offload_param.nvme_path;
  out.optimizer_nvme_path = config.zero.offload_optimizer.nvme_path;
  out.sub_group_size = static_cast<uint64_t>(config.zero.sub_group_size);
  out.buffer_count = static_cast<int>(config.zero.offload_param.buffer_count);
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
    out.state_bytes = type == cpu_optimizer::OptimizerType::kAdagrad ||
                              type == cpu_optimizer::OptimizerType::kLion
                          ? 8
                          : 12;
  }
  if (config.train_micro_batch_size_per_gpu > 0) {
    out.micro_batch = static_cast<int>(config.train_micro_batch_size_per_gpu);
  }
  out.warnings = std::move(config.warnings);
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

std::string FormatCount(uint64_t n) {
  char buf[32];
  if (n >= 1000000000) {
    std::snprintf(buf, sizeof(buf), "%.2f B", n / 1e9);
  } else if (n >= 1000000) {
    std::snprintf(buf, sizeof(buf), "%.2f M", n / 1e6);
  } else if (n >= 1000) {
    std::snprintf(buf, sizeof(buf), "%.2f k", n / 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(n));
  }
  return buf;
}

// DeepSpeed's L: the largest parameter count of one leaf module of the GPT (what _all_live
// measures): the MLP's first Linear (4d² + 4d) or an embedding / the head (vocab·d, seq·d).
uint64_t LargestLeafParams(const GptShape& s) {
  const uint64_t d = static_cast<uint64_t>(s.d_model);
  return std::max({4 * d * d + 4 * d, static_cast<uint64_t>(s.vocab) * d,
                   static_cast<uint64_t>(s.seq_len) * d});
}

json TierJson(const TierBytes& t) {
  return {{"device", t.device}, {"pinned", t.pinned}, {"host", t.host}, {"nvme", t.nvme}};
}

uint64_t Sum(const TierBytes& t) { return t.device + t.pinned + t.host + t.nvme; }

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

// ---- Output ------------------------------------------------------------------------------------

struct ModeResult {
  ModeSpec spec;
  MemoryPlan plan;
  DeepSpeedEstimate deepspeed;
};

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

void PrintItems(const MemoryPlan& plan) {
  std::printf("  %-26s %12s %12s %12s %12s\n", "item", "GPU", "pinned", "host", "NVMe");
  auto cell = [](uint64_t b) { return b == 0 ? std::string("-") : FormatBytes(b); };
  for (const auto& [name, b] : plan.items) {
    std::printf("  %-26s %12s %12s %12s %12s\n", name.c_str(), cell(b.device).c_str(),
                cell(b.pinned).c_str(), cell(b.host).c_str(), cell(b.nvme).c_str());
  }
}

void PrintFit(const Fit& fit, const MachineCapacity& m) {
  std::printf("  GPU:    ");
  if (m.has_gpu) {
    std::printf("%s needed, %s has %s\n", FormatBytes(fit.device_need).c_str(), m.gpu_name.c_str(),
                FormatBytes(fit.device_have).c_str());
  } else {
    std::printf("no GPU: device = host emulation (its %s counted as host memory)\n",
                FormatBytes(fit.device_need).c_str());
  }
  std::printf("  host:   %s needed, %s available (MemAvailable)\n",
              FormatBytes(fit.host_need).c_str(), FormatBytes(fit.host_have).c_str());
  for (const DiskCheck& d : fit.disks) {
    if (!d.error.empty()) {
      std::printf("  NVMe:   %s: %s\n", d.path.c_str(), d.error.c_str());
    } else {
      std::printf("  NVMe:   %s needed at %s, %s free\n", FormatBytes(d.need).c_str(),
                  d.path.c_str(), FormatBytes(d.free).c_str());
    }
  }
}

}  // namespace

void AddEstimateCommand(CLI::App& app, int* exit_code) {
  struct Flags {
    std::string model, params, largest_layer, config, dtype;
    int micro_batch = 0;
    bool json = false, items = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "estimate",
      "Memory per tier (GPU, pinned host, host, NVMe) for each offload mode, next to DeepSpeed's "
      "estimator; with --config, whether it fits this machine");
  std::string preset_names;
  for (const GptShape& s : GptPresets())
    preset_names += (preset_names.empty() ? "" : ", ") + s.name;
  cmd->add_option("--model", flags->model, "GPT preset: " + preset_names);
  cmd->add_option("--params", flags->params,
                  "Total parameters (e.g. 1.3e9, 6.7B), with --largest-layer instead of --model");
  cmd->add_option("--largest-layer", flags->largest_layer,
                  "Parameters of the largest layer; units are assumed of this size");
  cmd->add_option("--config", flags->config,
                  "DeepSpeed JSON config: its offload mode is checked against this machine");
  cmd->add_option("--micro-batch", flags->micro_batch,
                  "Micro-batch for activations (default: the config's "
                  "train_micro_batch_size_per_gpu, else 1)");
  cmd->add_option("--dtype", flags->dtype,
                  "Compute precision fp32|bf16|fp16 (default: the config's fp16/bf16, else bf16)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cmd->add_flag("--items", flags->items, "Itemize every mode, not only the configured one");
  cmd->add_flag("--json", flags->json, "Print one JSON object instead of text");

  cmd->callback([flags, exit_code] {
    auto bad = [&](const std::string& why) {
      std::fprintf(stderr, "strata estimate: %s\n", why.c_str());
      *exit_code = 2;
    };
    const bool by_model = !flags->model.empty();
    const bool by_count = !flags->params.empty() || !flags->largest_layer.empty();
    if (by_model == by_count) {
      return bad("give either --model PRESET or --params N --largest-layer N");
    }

    std::optional<ConfigSettings> config;
    if (!flags->config.empty()) {
      Result<ConfigSettings> c = ReadConfig(flags->config, flags->micro_batch);
      if (!c.ok()) return bad(c.status().ToString());
      config = *c;
    }
    int compute_bytes = 2;
    std::string dtype = "bf16";
    if (!flags->dtype.empty()) {
      dtype = flags->dtype;
      compute_bytes = dtype == "fp32" ? 4 : 2;
    } else if (config && config->compute_bytes) {
      compute_bytes = *config->compute_bytes;
      dtype = config->dtype;
    }
    int micro_batch = 1;
    if (flags->micro_batch < 0) return bad("--micro-batch must be >= 1");
    if (flags->micro_batch > 0) {
      micro_batch = flags->micro_batch;
    } else if (config && config->micro_batch) {
      micro_batch = *config->micro_batch;
    }

    // The model as a PlanInput.
    std::optional<GptShape> shape;
    PlanInput base;
    uint64_t total = 0, largest_layer = 0;
    if (by_model) {
      Result<GptShape> s = FindGptPreset(flags->model);
      if (!s.ok()) return bad(s.status().ToString());
      shape = *s;
      base = GptPlanInput(*shape, micro_batch, compute_bytes);
      total = TotalParams(*shape);
      largest_layer = LargestLeafParams(*shape);
    } else {
      if (flags->params.empty() || flags->largest_layer.empty()) {
        return bad("--params and --largest-layer go together");
      }
      Result<uint64_t> p = ParseCount(flags->params);
      if (!p.ok()) return bad("--params: " + p.status().ToString());
      Result<uint64_t> l = ParseCount(flags->largest_layer);
      if (!l.ok()) return bad("--largest-layer: " + l.status().ToString());
      if (*l > *p) return bad("--largest-layer is larger than --params");
      total = *p;
      largest_layer = *l;
      base.unit_numel.assign(total / largest_layer, largest_layer);
      base.resident_numel = total - (total / largest_layer) * largest_layer;
      base.compute_bytes = compute_bytes;
    }
    NvmePaths paths{"/tmp", "/tmp"};
    bool nvme_path_assumed = true;
    if (config) {
      if (config->sub_group_size) base.sub_group_size = *config->sub_group_size;
      if (config->buffer_count) base.param_buffer_count = *config->buffer_count;
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

    std::vector<ModeResult> modes;
    for (const ModeSpec& spec : kModes) {
      PlanInput in = base;
      in.params = spec.params;
      in.optimizer = spec.optimizer;
      modes.push_back({spec, PlanMemory(in),
                       DeepSpeedZero3Estimate(total, largest_layer, spec.optimizer != Home::kDevice,
                                              spec.params != Home::kDevice)});
    }

    // The configured mode against this machine.
    std::optional<MemoryPlan> config_plan;
    std::optional<Fit> fit;
    std::optional<MachineCapacity> machine;
    std::optional<FitSuggestion> suggestion;
    if (config) {
      PlanInput in = base;
      in.params = config->params;
      in.optimizer = config->optimizer;
      config_plan = PlanMemory(in);
      machine = ProbeMachineCapacity();
      fit = CheckFit(*config_plan, *machine, paths);
      if (!fit->fits) {
        suggestion = SuggestChanges(in, shape, micro_batch, *machine, paths);
      }
    }

    const char* padding_note = "padding = io_align rounding of pinned buffers and NVMe extents";
    if (flags->json) {
      json j;
      if (shape) {
        j["model"] = {{"name", shape->name},       {"n_layers", shape->n_layers},
                      {"d_model", shape->d_model}, {"n_heads", shape->n_heads},
                      {"seq_len", shape->seq_len}, {"vocab", shape->vocab}};
      } else {
        j["model"] = nullptr;
      }
      j["params"] = total;
      j["largest_layer"] = largest_layer;
      j["units"] = base.unit_numel.size();
      j["unit_params"] = base.unit_numel.empty() ? 0 : base.unit_numel.front();
      j["resident_params"] = base.resident_numel;
      j["settings"] = {{"dtype", dtype},
                       {"compute_bytes", base.compute_bytes},
                       {"state_bytes", base.state_bytes},
                       {"micro_batch", micro_batch},
                       {"sub_group_size", base.sub_group_size},
                       {"param_buffer_count", base.param_buffer_count},
                       {"pipeline", base.pipeline},
                       {"io_align", base.io_align}};
      j["activations"] = {{"checkpoint", base.activation_checkpoint_bytes},
                          {"working", base.activation_working_bytes}};
      j["modes"] = json::array();
      for (const ModeResult& m : modes) {
        json mode = PlanJson(m.plan);
        mode["name"] = m.spec.name;
        mode["offload_param"] = HomeName(m.spec.params);
        mode["offload_optimizer"] = HomeName(m.spec.optimizer);
        mode["deepspeed"] = {{"gpu", m.deepspeed.gpu}, {"cpu", m.deepspeed.cpu}};
        j["modes"].push_back(mode);
      }
      if (config) {
        json c = {{"path", flags->config},
                  {"offload_param", HomeName(config->params)},
                  {"offload_optimizer", HomeName(config->optimizer)},
                  {"nvme_path_params", paths.params},
                  {"nvme_path_optimizer", paths.optimizer},
                  {"nvme_path_assumed", nvme_path_assumed},
                  {"warnings", config->warnings},
                  {"plan", PlanJson(*config_plan)},
                  {"fit", FitJson(*fit, *machine)}};
        if (!fit->fits) {
          c["suggestion"] = suggestion ? json(suggestion->changes) : json(nullptr);
          if (suggestion) c["suggestion_fit"] = FitJson(suggestion->fit, *machine);
        }
        j["config"] = c;
      }
      std::cout << j.dump(2) << std::endl;
      *exit_code = 0;
      return;
    }

    if (shape) {
      std::printf("strata estimate: model %s (%d layers, d %d, %d heads, seq %d, vocab %d)\n",
                  shape->name.c_str(), shape->n_layers, shape->d_model, shape->n_heads,
                  shape->seq_len, shape->vocab);
    } else {
      std::printf("strata estimate: %s parameters, largest layer %s\n", FormatCount(total).c_str(),
                  FormatCount(largest_layer).c_str());
    }
    std::printf("  %s params: %zu units of %s, %s resident; largest layer (DeepSpeed's L) %s\n",
                FormatCount(total).c_str(), base.unit_numel.size(),
                FormatCount(base.unit_numel.empty() ? 0 : base.unit_numel.front()).c_str(),
                FormatCount(base.resident_numel).c_str(), FormatCount(largest_layer).c_str());
    std::printf(
        "  %s (%d B/param on the device), optimizer state %d B/param + 4 B fp32 gradient, "
        "micro-batch %d\n",
        dtype.c_str(), base.compute_bytes, base.state_bytes, micro_batch);
    std::printf(
        "  sub_group_size %llu, offload_param.buffer_count %d, pipeline %s, io_align %llu\n",
        static_cast<unsigned long long>(base.sub_group_size), base.param_buffer_count,
        base.pipeline ? "on" : "off", static_cast<unsigned long long>(base.io_align));
    if (shape) {
      std::printf("  activations per micro-batch: checkpoints %s, working %s\n",
                  FormatBytes(base.activation_checkpoint_bytes).c_str(),
                  FormatBytes(base.activation_working_bytes).c_str());
    } else {
      std::printf("  activations: not modelled without --model\n");
    }
    std::printf("\n%-22s %11s %11s %11s %11s %11s | %13s %13s\n", "mode", "GPU", "pinned", "host",
                "NVMe", "padding", "DeepSpeed GPU", "DeepSpeed CPU");
    for (const ModeResult& m : modes) {
      std::printf("%-22s %11s %11s %11s %11s %11s | %13s %13s\n", m.spec.name,
                  FormatBytes(m.plan.total.device).c_str(),
                  FormatBytes(m.plan.total.pinned).c_str(), FormatBytes(m.plan.total.host).c_str(),
                  FormatBytes(m.plan.total.nvme).c_str(), FormatBytes(Sum(m.plan.padding)).c_str(),
                  FormatBytes(m.deepspeed.gpu).c_str(), FormatBytes(m.deepspeed.cpu).c_str());
    }
    std::printf(
        "(%s; DeepSpeed: estimate_zero3_model_states_mem_needs, 1 GPU, zero_init, CPU x1.5; "
        "it models NVMe modes as CPU and leaves out activations, pinned buffers and "
        "padding)\n",
        padding_note);
    if (flags->items) {
      for (const ModeResult& m : modes) {
        std::printf("\n%s:\n", m.spec.name);
        PrintItems(m.plan);
      }
    }
    if (config) {
      std::printf("\n%s: offload_param.device %s, offload_optimizer.device %s%s\n",
                  flags->config.c_str(), std::string(HomeName(config->params)).c_str(),
                  std::string(HomeName(config->optimizer)).c_str(),
                  config_plan->total.nvme > 0 && nvme_path_assumed
                      ? " (no nvme_path set: /tmp assumed)"
                      : "");
      for (const std::string& w : config->warnings) std::printf("  warning: %s\n", w.c_str());
      PrintItems(*config_plan);
      std::printf("  pinned arena %s, device at least %s\n",
                  FormatBytes(config_plan->pinned_arena_bytes).c_str(),
                  FormatBytes(config_plan->device_min_bytes).c_str());
      std::printf("\nThis machine:\n");
      PrintFit(*fit, *machine);
      if (fit->fits) {
        std::printf("Fits.\n");
      } else {
        std::printf("Does not fit:\n");
        for (const std::string& p : fit->problems) std::printf("  - %s\n", p.c_str());
        if (suggestion) {
          std::printf("To fit, change:\n");
          for (const std::string& change : suggestion->changes) {
            std::printf("  %s\n", change.c_str());
          }
          std::printf("and then:\n");
          PrintFit(suggestion->fit, *machine);
          if (nvme_path_assumed && !suggestion->fit.disks.empty()) {
            std::printf("  (the config has no nvme_path: set it too; /tmp was assumed here)\n");
          }
        } else {
          std::printf(
              "No change of offload devices, sub_group_size, buffer_count, pipelining or "
              "micro-batch makes it fit this machine.\n");
        }
      }
    }
    *exit_code = 0;
  });
}

}  // namespace strata::runtime
