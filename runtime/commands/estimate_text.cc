// Renders `strata estimate --json`'s object as the text people read (see estimate_text.h).
#include "runtime/commands/estimate_text.h"

#include <cmath>
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

// "12.3%" of `part` in `whole` (0 when whole is 0).
std::string Percent(double part, double whole) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", whole > 0 ? 100 * part / whole : 0.0);
  return buf;
}

// NVMe bytes per step (estimate's "nvme_per_step"), and for a mixture of experts whole layers
// against --page-experts.
void PrintTraffic(const json& t, std::FILE* out) {
  const std::string mode = Str(t["mode"]) == "config"
                               ? "the config's mode (offload_param " + Str(t["offload_param"]) +
                                     ", optimizer " + Str(t["optimizer_home"]) + ")"
                               : Str(t["mode"]);
  const int ranks = t["ranks"].get<int>();
  std::fprintf(out,
               "\nNVMe per step, %s, %llu tokens (micro-batch %d x seq %d x %d accumulation "
               "step%s x %d rank%s): read %s, written %s\n",
               mode.c_str(), static_cast<unsigned long long>(U64(t["tokens_per_step"])),
               t["micro_batch"].get<int>(), t["seq_len"].get<int>(), t["accumulation"].get<int>(),
               t["accumulation"].get<int>() == 1 ? "" : "s", ranks, ranks == 1 ? "" : "s",
               Bytes(t["read"]).c_str(), Bytes(t["written"]).c_str());
  if (t.contains("host_cache") && U64(t["host_cache"]["budget"]) > 0) {
    const json& h = t["host_cache"];
    std::fprintf(out,
                 "  host-RAM tier %s of a %s host budget (less the process's %s and the "
                 "emulated device's %s) keeps off NVMe: gradients %s, parameters %s (%llu "
                 "units), optimizer state %s\n",
                 Bytes(h["bytes"]).c_str(), Bytes(h["budget"]).c_str(),
                 Bytes(h["beside"]["process"]).c_str(),
                 Bytes(h["beside"]["emulated_device"]).c_str(), Bytes(h["grads"]).c_str(),
                 Bytes(h["params"]).c_str(), static_cast<unsigned long long>(U64(h["units"])),
                 Bytes(h["state"]).c_str());
  }
  std::fprintf(
      out,
      "  (the layout's bytes as a run moves them from its second step: a block is read "
      "where it is used and not still held by the device window or a pinned slot, written "
      "where it changes; the device window is --device-memory's, or without a GPU the "
      "emulated device's default (on a GPU without --device-memory it is not known here, and a "
      "run whose window holds more units reads less); with --page-experts an expert is read at "
      "every use, and "
      "more where the router's history reads ahead experts the step's tokens do not reach)\n");
  if (!t.contains("experts")) return;
  const json& e = t["experts"];
  const int n = e["per_layer"].get<int>();
  const int k = e["top_k"].get<int>();
  std::fprintf(out,
               "  experts, uniform routing: each expert gets one of the step's %llu tokens with "
               "probability 1 - (1 - %d/%d)^%llu = %s, so %.2f of %d experts per layer are read "
               "for the forward and backward (the optimizer steps every expert: one without a "
               "token on a zero gradient)\n",
               static_cast<unsigned long long>(U64(t["tokens_per_step"])), k, n,
               static_cast<unsigned long long>(U64(t["tokens_per_step"])),
               Percent(e["hit_probability_step"].get<double>(), 1).c_str(),
               e["active_per_layer"].get<double>(), n);
  std::fprintf(out, "  %-26s %6s %13s %11s %11s %11s\n", "", "units", "largest unit", "GPU",
               "NVMe read", "written");
  const bool paged = t["page_experts"].get<bool>();
  for (const char* which : {"whole_layers", "page_experts"}) {
    const json& v = e[which];
    const bool this_plan = paged == (std::string(which) == "page_experts");
    const std::string label =
        std::string(which) == "page_experts" ? "--page-experts" : "whole layers";
    std::fprintf(out, "  %-26s %6zu %13s %11s %11s %11s\n",
                 (label + (this_plan ? " (this plan)" : "")).c_str(), v["units"].get<size_t>(),
                 FormatCount(U64(v["largest_unit_params"])).c_str(),
                 Bytes(v["device_bytes"]).c_str(), Bytes(v["read"]).c_str(),
                 Bytes(v["written"]).c_str());
  }
  const json& w = e["whole_layers"];
  const json& p = e["page_experts"];
  const double read_saved = w["read"].get<double>() - p["read"].get<double>();
  const double written_saved = w["written"].get<double>() - p["written"].get<double>();
  if (!paged) {
    std::fprintf(out,
                 "  --page-experts would read %s and write %s per step (%s and %s less), with a "
                 "device window of its largest unit instead of a layer (GPU %s): add it to plan "
                 "that way\n",
                 Bytes(p["read"]).c_str(), Bytes(p["written"]).c_str(),
                 Percent(read_saved, w["read"].get<double>()).c_str(),
                 Percent(written_saved, w["written"].get<double>()).c_str(),
                 Bytes(p["device_bytes"]).c_str());
  } else {
    std::fprintf(out, "  --page-experts reads %s%s and writes %s%s than whole layers per step\n",
                 Percent(std::abs(read_saved), w["read"].get<double>()).c_str(),
                 read_saved >= 0 ? " less" : " more",
                 Percent(std::abs(written_saved), w["written"].get<double>()).c_str(),
                 written_saved >= 0 ? " less" : " more");
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
    if (m.contains("num_experts")) {
      std::fprintf(out,
                   "  mixture of experts: %d experts of intermediate %d per sparse layer, top-%d",
                   m["num_experts"].get<int>(), m["moe_intermediate_size"].get<int>(),
                   m["num_experts_per_tok"].get<int>());
      if (m["shared_expert_intermediate_size"].get<int>() > 0) {
        std::fprintf(out, ", a shared expert of %d",
                     m["shared_expert_intermediate_size"].get<int>());
      }
      std::fprintf(out, "%s\n",
                   j.value("page_experts", false)
                       ? "; --page-experts: each expert and each layer's attention is a unit"
                       : "; whole layers are units (see --page-experts)");
    }
  } else if (!m.is_null()) {
    std::fprintf(out, "strata estimate: model %s (%d layers, d %d, %d heads, seq %d, vocab %d)\n",
                 Str(m["name"]).c_str(), m["n_layers"].get<int>(), m["d_model"].get<int>(),
                 m["n_heads"].get<int>(), m["seq_len"].get<int>(), m["vocab"].get<int>());
  } else {
    std::fprintf(out, "strata estimate: %s parameters, largest layer %s\n", total.c_str(),
                 largest.c_str());
  }
  if (j.value("page_experts", false)) {  // units of several sizes
    std::fprintf(out,
                 "  %s params: %zu units, the largest %s, %s resident; largest layer (DeepSpeed's "
                 "L) %s\n",
                 total.c_str(), j["units"].get<size_t>(),
                 FormatCount(U64(j["largest_unit_params"])).c_str(),
                 FormatCount(U64(j["resident_params"])).c_str(), largest.c_str());
  } else {
    std::fprintf(
        out, "  %s params: %zu units of %s, %s resident; largest layer (DeepSpeed's L) %s\n",
        total.c_str(), j["units"].get<size_t>(), FormatCount(U64(j["unit_params"])).c_str(),
        FormatCount(U64(j["resident_params"])).c_str(), largest.c_str());
  }
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
  if (j.contains("nvme_per_step")) PrintTraffic(j["nvme_per_step"], out);
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
