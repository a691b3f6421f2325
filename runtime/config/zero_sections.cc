// zero_optimization, aio and strata's own section. zero_optimization holds the stage, the two
// offload sections (offload_param: ZeRO-Infinity, stage 3 only; offload_optimizer: ZeRO-Offload,
// nvme only with stage 3), sub_group_size and the stage3_* knobs, several of which HF writes as
// "auto" and which resolve from the model's hidden size. The checks between these keys live here
// too, next to the keys they read, and so does parsing's one side effect: an nvme_path is created
// (mkdir -p) and must be a writable directory, so a bad path fails at start-up rather than at the
// first swap.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <tuple>

#include "base/bytes.h"
#include "base/json_values.h"
#include "runtime/config/internal_parser.h"
#include "tiers/tier.h"

namespace strata::runtime::config_internal {
namespace {

constexpr std::string_view kZeroKeys[] = {"stage",
                                          "offload_param",
                                          "offload_optimizer",
                                          "sub_group_size",
                                          "stage3_prefetch_bucket_size",
                                          "prefetch_bucket_size",
                                          "stage3_param_persistence_threshold",
                                          "param_persistence_threshold",
                                          "stage3_max_live_parameters",
                                          "max_live_parameters",
                                          "stage3_max_reuse_distance",
                                          "max_reuse_distance",
                                          "contiguous_gradients",
                                          "overlap_comm",
                                          "reduce_bucket_size",
                                          "cpu_offload",
                                          "cpu_offload_param",
                                          "cpu_offload_use_pin_memory"};
constexpr std::string_view kOffloadParamKeys[] = {"device",      "nvme_path",  "buffer_count",
                                                  "buffer_size", "max_in_cpu", "pin_memory"};
constexpr std::string_view kOffloadOptimizerKeys[] = {
    "device",         "nvme_path", "buffer_count", "pin_memory", "pipeline_read",
    "pipeline_write", "pipeline",  "fast_init",    "ratio"};
constexpr std::string_view kAioKeys[] = {"block_size",   "queue_depth",   "intra_op_parallelism",
                                         "thread_count", "single_submit", "overlap_events",
                                         "use_gds"};
constexpr std::string_view kStrataKeys[] = {"swap_checksums", "comms_timeout_seconds",
                                            "offload_unit_classes", "lr_scheduler", "host_memory"};

// The keys both offload sections share: device, in DeepSpeed's spelling (absent or null: "none",
// i.e. on the device), and nvme_path.
Status ReadHomeAndPath(const json& section, const std::string& path, Home* device,
                       std::string* nvme_path) {
  if (const json* v = Find(section, "device")) {
    std::optional<Home> home;
    if (v->is_string()) home = HomeFromName(v->get_ref<const std::string&>());
    if (!home) {
      return InvalidArgumentError(path + ".device: expected \"none\", \"cpu\" or \"nvme\", got " +
                                  v->dump());
    }
    *device = *home;
  }
  if (const json* v = Find(section, "nvme_path")) {
    STRATA_ASSIGN_OR_RETURN(*nvme_path, JsonString(*v, path + ".nvme_path"));
  }
  return Status::Ok();
}

// An offload section's nvme_path when its device is nvme: given, created if missing, a writable
// directory.
Status CheckNvmePath(const std::string& section, const std::string& dir) {
  const std::string path_key = section + ".nvme_path";
  if (dir.empty()) return InvalidArgumentError(path_key + ": required when device is \"nvme\"");
  std::error_code ec;
  if (std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec)) {
    return InvalidArgumentError(path_key + ": \"" + dir + "\" is not a directory");
  }
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return InvalidArgumentError(path_key + ": cannot create directory \"" + dir + "\": " +
                                ec.message() + " (errno " + std::to_string(ec.value()) + ")");
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    return InvalidArgumentError(path_key + ": cannot stat \"" + dir + "\": " + std::strerror(err) +
                                " (errno " + std::to_string(err) + ")");
  }
  if (!S_ISDIR(st.st_mode)) {
    return InvalidArgumentError(path_key + ": \"" + dir + "\" is not a directory");
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    const int err = errno;
    return InvalidArgumentError(path_key + ": directory \"" + dir + "\" is not writable: " +
                                std::strerror(err) + " (errno " + std::to_string(err) + ")");
  }
  return Status::Ok();
}

}  // namespace

void Parser::HiddenSizeAuto(const json& zero, std::string_view key, std::string_view alias,
                            int64_t min, int64_t* out, int64_t (*from_hidden)(int64_t),
                            std::string_view rule) {
  const std::string path = JoinPath("zero_optimization", key);
  const json* v = Find(zero, key);
  const json* a = alias.empty() ? nullptr : Find(zero, alias);
  if (v != nullptr && a != nullptr) {
    Fail(path + ": given together with its alias zero_optimization." + std::string(alias) +
         "; keep one");
    return;
  }
  std::string used = path;
  if (v == nullptr && a != nullptr) {
    v = a;
    used = JoinPath("zero_optimization", alias);
  }
  if (v == nullptr) return;
  if (IsAuto(*v)) {
    const std::optional<int64_t>& h = options_.auto_values.hidden_size;
    if (from_hidden == nullptr || !h) {
      Resolved(used, std::to_string(*out),
               from_hidden == nullptr
                   ? "DeepSpeed's default"
                   : "DeepSpeed's default; the model's hidden size is unknown here");
      return;
    }
    if (*h < 1 || *h > (int64_t{1} << 31)) {  // h*h must fit in int64
      Fail(used + ": \"auto\" with hidden_size " + std::to_string(*h) +
           ": expected a hidden size 1.." + std::to_string(int64_t{1} << 31));
      return;
    }
    *out = from_hidden(*h);
    Resolved(used, std::to_string(*out), std::string(rule) + ", hidden_size " + std::to_string(*h));
    return;
  }
  Result<int64_t> value = JsonInt(*v, used, min, kIntMax);
  if (Check(value.status())) *out = *value;
}

// DeepSpeed's deprecated spellings, mapped as DeepSpeed maps them (with a warning each).
void Parser::DeprecatedOffload(const json& zero) {
  const std::string path = "zero_optimization";
  ZeroConfig& z = config_.zero;
  auto flag = [&](std::string_view key, bool* out) {
    const json* v = Find(zero, key);
    if (v == nullptr) return false;
    Result<bool> b = JsonBool(*v, JoinPath(path, key));
    if (!Check(b.status())) return false;
    *out = *b;
    return true;
  };
  bool on = false;
  if (flag("cpu_offload", &on)) {
    if (Find(zero, "offload_optimizer") != nullptr) {
      Fail(path +
           ".cpu_offload: given together with zero_optimization.offload_optimizer, which "
           "replaces it; keep offload_optimizer");
    } else {
      if (on) z.offload_optimizer.device = Home::kCpu;
      Warn(path + ".cpu_offload: deprecated; read as offload_optimizer {\"device\": \"" +
           (on ? "cpu" : "none") + "\"} (as DeepSpeed does); rename it");
    }
  }
  for (std::string_view key : {"cpu_offload_param"}) {
    if (!flag(key, &on)) continue;
    if (Find(zero, "offload_param") != nullptr) {
      Fail(JoinPath(path, key) +
           ": given together with zero_optimization.offload_param, which "
           "replaces it; keep offload_param");
    } else {
      if (on) z.offload_param.device = Home::kCpu;
      Warn(JoinPath(path, key) + ": deprecated; read as offload_param {\"device\": \"" +
           (on ? "cpu" : "none") + "\"} (as DeepSpeed does); rename it");
    }
  }
  if (flag("cpu_offload_use_pin_memory", &on)) {
    z.offload_param.pin_memory = z.offload_optimizer.pin_memory = on;
    Warn(path +
         ".cpu_offload_use_pin_memory: deprecated; read as the offload sections' "
         "pin_memory (as DeepSpeed does); rename it");
  }
}

void Parser::ParseZero(const json& root) {
  ZeroConfig& z = config_.zero;
  if (const json* legacy = Find(root, "zero_optimization"); legacy && legacy->is_boolean()) {
    // DeepSpeed's oldest form: true is stage 1, false stage 0.
    z.stage = legacy->get<bool>() ? 1 : 0;
    z.overlap_comm = false;
    Warn("zero_optimization: deprecated boolean form, read as stage " + std::to_string(z.stage) +
         " (as DeepSpeed does); write {\"stage\": " + std::to_string(z.stage) + "}");
    return;
  }
  const json* zero = Section(root, "", "zero_optimization");
  if (zero == nullptr) {
    z.overlap_comm = false;
    return;
  }
  const std::string path = "zero_optimization";
  Keys(*zero, path, kZeroKeys);
  Int(*zero, path, "stage", 0, 3, &z.stage);
  DeprecatedOffload(*zero);

  // offload_param
  if (const json* op = Section(*zero, path, "offload_param")) {
    const std::string p = path + ".offload_param";
    OffloadParamConfig& c = z.offload_param;
    Keys(*op, p, kOffloadParamKeys);
    Check(ReadHomeAndPath(*op, p, &c.device, &c.nvme_path));
    Int(*op, p, "buffer_count", 1, kIntMax, &c.buffer_count);
    // buffer_size and max_in_cpu: unset unless a number is given ("auto" too keeps strata's
    // sizing: buffers of the largest unit, no unit kept in CPU memory).
    for (auto [key, min, out] : {std::tuple{"buffer_size", int64_t{1}, &c.buffer_size},
                                 std::tuple{"max_in_cpu", int64_t{0}, &c.max_in_cpu}}) {
      const json* v = Find(*op, key);
      if (v == nullptr) continue;
      if (IsAuto(*v)) {
        Resolved(JoinPath(p, key), "unset",
                 std::string("strata's default: ") +
                     (out == &c.buffer_size ? "buffers sized to the largest offload unit"
                                            : "every offload unit on NVMe"));
        continue;
      }
      int64_t n = 0;
      if (Int(*op, p, key, min, kIntMax, &n)) *out = n;
    }
    Bool(*op, p, "pin_memory", &c.pin_memory);
  }
  if (z.offload_param.device != Home::kDevice && z.stage != 3) {
    // DeepSpeed builds a parameter swapper only at stage 3 and ignores the section below it.
    Warn(path + ".offload_param.device: \"" + std::string(HomeName(z.offload_param.device)) +
         "\" is ignored at stage " + std::to_string(z.stage) +
         " (parameter offload is ZeRO-3's, as in DeepSpeed); parameters stay on the device");
    z.offload_param.device = Home::kDevice;
  } else if (z.offload_param.device == Home::kNvme) {
    Check(CheckNvmePath(path + ".offload_param", z.offload_param.nvme_path));
  }

  // offload_optimizer
  if (const json* oo = Section(*zero, path, "offload_optimizer")) {
    const std::string p = path + ".offload_optimizer";
    OffloadOptimizerConfig& c = z.offload_optimizer;
    Keys(*oo, p, kOffloadOptimizerKeys);
    Check(ReadHomeAndPath(*oo, p, &c.device, &c.nvme_path));
    Int(*oo, p, "buffer_count", 1, kIntMax, &c.buffer_count);
    Bool(*oo, p, "pin_memory", &c.pin_memory);
    if (const json* v = Find(*oo, "pipeline")) {  // DeepSpeed's legacy switch for both
      Result<bool> both = JsonBool(*v, p + ".pipeline");
      if (Check(both.status())) c.pipeline_read = c.pipeline_write = *both;
    }
    Bool(*oo, p, "pipeline_read", &c.pipeline_read);
    Bool(*oo, p, "pipeline_write", &c.pipeline_write);
    Bool(*oo, p, "fast_init", &c.fast_init);
    Double(*oo, p, "ratio", 0.0, 1.0, &c.ratio);
    if (c.ratio < 1.0 && z.stage != 3) {
      Fail(p + ".ratio: below 1 (partial offload) needs zero_optimization.stage 3, got stage " +
           std::to_string(z.stage));
    }
  }
  {
    const std::string p = path + ".offload_optimizer";
    const OffloadOptimizerConfig c = z.offload_optimizer;
    OffloadOptimizerConfig& mc = z.offload_optimizer;
    if (c.device != Home::kDevice && z.stage == 0) {
      // Without ZeRO DeepSpeed builds no ZeRO optimizer, so the section has no effect.
      Warn(p + ".device: \"" + std::string(HomeName(c.device)) +
           "\" is ignored at stage 0 (optimizer offload needs ZeRO stage 1, 2 or 3, as in "
           "DeepSpeed); the optimizer stays on the device");
      mc.device = Home::kDevice;
    } else if (c.device == Home::kNvme && z.stage != 3) {
      // DeepSpeed's stage 1/2 optimizer treats "nvme" as CPU offload (zero_cpu_offload()).
      Warn(p + ".device: \"nvme\" at stage " + std::to_string(z.stage) +
           " offloads to CPU memory, as DeepSpeed's stage 1/2 does (NVMe needs stage 3)");
      mc.device = Home::kCpu;
    } else if (c.device == Home::kNvme) {
      Check(CheckNvmePath(p, c.nvme_path));
    }
  }

  if (const json* v = Find(*zero, "sub_group_size"); v != nullptr && !IsAuto(*v)) {
    Result<int64_t> n = JsonInt(*v, path + ".sub_group_size", 0, kIntMax);
    if (Check(n.status())) {
      if (*n == 0) {
        // DeepSpeed then makes every parameter its own sub-group; strata's finest cut is the
        // offload unit (plan/layout.h), so each unit's parameters form one sub-group.
        z.sub_group_size = kIntMax;
        Warn(path +
             ".sub_group_size: 0 (DeepSpeed: every parameter its own sub-group) is read "
             "as one sub-group per offload unit, strata's nearest layout");
      } else {
        z.sub_group_size = *n;
      }
    }
  } else {
    Int(*zero, path, "sub_group_size", 1, kIntMax, &z.sub_group_size);  // "auto": the default
  }
  HiddenSizeAuto(
      *zero, "stage3_prefetch_bucket_size", "prefetch_bucket_size", 0, &z.prefetch_bucket_size,
      [](int64_t h) { return static_cast<int64_t>(0.9 * static_cast<double>(h) * h); },
      "0.9 * hidden_size^2");
  HiddenSizeAuto(
      *zero, "stage3_param_persistence_threshold", "param_persistence_threshold", 0,
      &z.param_persistence_threshold, [](int64_t h) { return 10 * h; }, "10 * hidden_size");
  HiddenSizeAuto(*zero, "stage3_max_live_parameters", "max_live_parameters", 0,
                 &z.max_live_parameters, nullptr, "");
  HiddenSizeAuto(*zero, "stage3_max_reuse_distance", "max_reuse_distance", 0, &z.max_reuse_distance,
                 nullptr, "");
  HiddenSizeAuto(
      *zero, "reduce_bucket_size", "", 0, &z.reduce_bucket_size, [](int64_t h) { return h * h; },
      "hidden_size^2");
  Bool(*zero, path, "contiguous_gradients", &z.contiguous_gradients);
  z.overlap_comm = z.stage == 3;  // DeepSpeed: null -> true for stage 3 only
  Bool(*zero, path, "overlap_comm", &z.overlap_comm);
}

void Parser::ParseAio(const json& root) {
  const json* aio = Section(root, "", "aio");
  if (aio == nullptr) return;
  const std::string p = "aio";
  AioConfig& a = config_.aio;
  Keys(*aio, p, kAioKeys);
  if (Int(*aio, p, "block_size", 4096, int64_t{1} << 30, &a.block_size) &&
      a.block_size % 4096 != 0) {
    Fail("aio.block_size: expected a multiple of 4096 bytes (direct I/O alignment), got " +
         std::to_string(a.block_size));
  }
  Int(*aio, p, "queue_depth", 1, 4096, &a.queue_depth);
  std::optional<int> intra, threads;
  if (const json* v = Find(*aio, "intra_op_parallelism"); v != nullptr && !IsAuto(*v)) {
    int n = 0;
    if (Int(*aio, p, "intra_op_parallelism", 1, 64, &n)) intra = n;
  }
  if (const json* v = Find(*aio, "thread_count"); v != nullptr && !IsAuto(*v)) {
    int n = 0;
    if (Int(*aio, p, "thread_count", 1, 64, &n)) threads = n;
  }
  if (intra && threads && *intra != *threads) {
    Fail("aio.thread_count: " + std::to_string(*threads) +
         " contradicts aio.intra_op_parallelism " + std::to_string(*intra) +
         " (thread_count is its legacy name); keep intra_op_parallelism");
  }
  if (threads) {
    Warn("aio.thread_count: legacy name, read as aio.intra_op_parallelism = " +
         std::to_string(*threads) + " (DeepSpeed ignores it silently); rename it");
  }
  a.intra_op_parallelism = intra ? *intra : threads ? *threads : a.intra_op_parallelism;
  Bool(*aio, p, "single_submit", &a.single_submit);
  Bool(*aio, p, "overlap_events", &a.overlap_events);
  Bool(*aio, p, "use_gds", &a.use_gds);
}

void Parser::ParseStrata(const json& root) {
  const json* strata = Section(root, "", "strata");
  if (strata == nullptr) return;
  Keys(*strata, "strata", kStrataKeys);
  // Not DeepSpeed's: no "auto" (Hugging Face never writes it here), just true or false.
  if (const json* v = Find(*strata, "swap_checksums")) {
    Result<bool> on = JsonBool(*v, "strata.swap_checksums");
    if (Check(on.status())) config_.strata.swap_checksums = *on;
  }
  if (const json* v = Find(*strata, "comms_timeout_seconds")) {
    Result<int64_t> seconds = JsonInt(*v, "strata.comms_timeout_seconds", 1, 86400);
    if (Check(seconds.status())) config_.strata.comms_timeout_seconds = *seconds;
  }
  if (const json* v = Find(*strata, "host_memory")) {
    // "auto", a size ("24G") or a byte count, as --host-memory takes it.
    std::string text;
    if (v->is_string()) {
      text = v->get<std::string>();
    } else if (v->is_number_unsigned()) {
      text = std::to_string(v->get<uint64_t>());
    }
    Status ok;
    if (text.empty()) {
      ok = InvalidArgumentError(
          "strata.host_memory: expected \"auto\" or a size such as \"24G\", got " + v->dump());
    } else if (text != "auto") {
      ok = ParseBytes(text).status().WithContext("strata.host_memory");
    }
    if (Check(ok)) config_.strata.host_memory = text;
  }
  if (const json* v = Find(*strata, "offload_unit_classes")) {
    if (!v->is_array()) {
      Check(
          InvalidArgumentError("strata.offload_unit_classes: expected a list of class names, "
                               "got " +
                               v->dump()));
      return;
    }
    for (size_t i = 0; i < v->size(); ++i) {
      Result<std::string> name =
          JsonString((*v)[i], "strata.offload_unit_classes[" + std::to_string(i) + "]");
      if (Check(name.status())) config_.strata.offload_unit_classes.push_back(*name);
    }
  }
}

}  // namespace strata::runtime::config_internal
