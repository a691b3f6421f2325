// Renders `strata estimate --json`'s object as the text people read (see estimate_text.h).
#include "runtime/commands/estimate_text.h"

#include <cstdint>
#include <cstdio>
#include <string>

#include "base/bytes.h"

namespace strata::runtime {
namespace {

using nlohmann::json;

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

}  // namespace

void PrintEstimate(const json& j, bool items, std::FILE* out) {
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
  if (j.value("optimizer_state", true)) {
    std::fprintf(out,
                 "  %s (%d B/param on the device), optimizer state %d B/param + 4 B fp32 "
                 "gradient, micro-batch %d\n",
                 Str(s["dtype"]).c_str(), s["compute_bytes"].get<int>(),
                 s["state_bytes"].get<int>(), s["micro_batch"].get<int>());
  } else {
    std::fprintf(out,
                 "  %s (%d B/param), --mode %s: an inference engine, the weights only (no "
                 "gradients, no optimizer state), micro-batch %d\n",
                 Str(s["dtype"]).c_str(), s["compute_bytes"].get<int>(), Str(j["mode"]).c_str(),
                 s["micro_batch"].get<int>());
  }
  std::fprintf(out,
               "  sub_group_size %llu, offload_param.buffer_count %d, pipeline %s, io_align %llu\n",
               static_cast<unsigned long long>(U64(s["sub_group_size"])),
               s["param_buffer_count"].get<int>(), s["pipeline"].get<bool>() ? "on" : "off",
               static_cast<unsigned long long>(U64(s["io_align"])));
  if (!m.is_null() && !j.value("optimizer_state", true)) {  // a forward keeps no checkpoints
    std::fprintf(out, "  activations per micro-batch: working %s\n",
                 Bytes(j["activations"]["working"]).c_str());
  } else if (!m.is_null()) {
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
               "modes as CPU and leaves out activations, pinned buffers and padding%s)\n",
               j.value("optimizer_state", true) ? "" : "; it has no inference estimate: 0");
  for (const json& mode : j["modes"]) {
    if (mode["optimizer_home"] != mode["offload_optimizer"]) {
      std::fprintf(out,
                   "(%s in %s: strata runs the optimizer on the CPU with its state in pinned host "
                   "memory, as with offload_optimizer cpu; DeepSpeed keeps it on the GPU)\n",
                   Str(mode["name"]).c_str(), Str(s["dtype"]).c_str());
    }
  }
  if (items) {
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
  if (c.contains("lr_schedule")) {
    std::fprintf(out, "  lr schedule: %s\n", Str(c["lr_schedule"]).c_str());
  }
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

}  // namespace strata::runtime
