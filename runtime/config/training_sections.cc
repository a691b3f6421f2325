// The sections that decide how a step is computed: fp16/bf16 (one of them at most; "enabled" may
// be "auto", answered by the caller), optimizer (DeepSpeed's CPU optimizer types with their
// defaults; hyper-parameters may be "auto") and scheduler (its "auto" params filled in as Hugging
// Face does, then validated by building the schedule once with MakeLrSchedule, so the config and
// the engine can never disagree on what a valid schedule is).
#include <algorithm>
#include <cctype>
#include <iterator>
#include <span>
#include <string>
#include <utility>

#include "base/json_values.h"
#include "runtime/config/internal_parser.h"
#include "runtime/engine/numerics/lr_schedule.h"

namespace strata::runtime::config_internal {
namespace {

constexpr std::string_view kFp16Keys[] = {"enabled",
                                          "auto_cast",
                                          "loss_scale",
                                          "initial_scale_power",
                                          "loss_scale_window",
                                          "hysteresis",
                                          "consecutive_hysteresis",
                                          "min_loss_scale",
                                          "fp16_master_weights_and_grads"};
constexpr std::string_view kBf16Keys[] = {"enabled", "immediate_grad_update"};
constexpr std::string_view kOptimizerKeys[] = {"type", "params"};
constexpr std::string_view kSchedulerKeys[] = {"type", "params"};
constexpr std::string_view kAdamParams[] = {
    "lr", "betas", "eps", "weight_decay", "bias_correction", "amsgrad", "adam_w_mode"};
constexpr std::string_view kAdagradParams[] = {"lr", "eps", "weight_decay", "lr_decay",
                                               "initial_accumulator_value"};
constexpr std::string_view kLionParams[] = {"lr", "betas", "weight_decay"};
// DeepSpeed optimizer types strata does not implement (for a clearer message than "unknown").
constexpr std::string_view kUnsupportedOptimizers[] = {
    "lamb",  "onebitadam", "zerooneadam", "onebitlamb", "muadam", "muadamw",
    "musgd", "sgd",        "fusedadam",   "cpuadam",    "muon"};

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

Result<bool> Parser::Enabled(const json& section, const std::string& path,
                             const std::optional<bool>& auto_value) {
  const json* v = Find(section, "enabled");
  if (v == nullptr) return false;
  if (IsAuto(*v)) return Auto(auto_value, path + ".enabled", "whether training runs in " + path);
  return JsonBool(*v, path + ".enabled");
}

Status Parser::ParsePrecision(const json& root) {
  STRATA_ASSIGN_OR_RETURN(const json* fp16, Section(root, "", "fp16"));
  if (fp16 != nullptr) {
    const std::string p = "fp16";
    Fp16Config& f = config_.fp16;
    STRATA_RETURN_IF_ERROR(Keys(*fp16, p, kFp16Keys));
    STRATA_ASSIGN_OR_RETURN(f.enabled, Enabled(*fp16, p, options_.auto_values.fp16));
    STRATA_RETURN_IF_ERROR(Bool(*fp16, p, "auto_cast", &f.auto_cast));
    STRATA_RETURN_IF_ERROR(Double(*fp16, p, "loss_scale", 0, kInf, &f.loss_scale));
    STRATA_RETURN_IF_ERROR(Int(*fp16, p, "initial_scale_power", 0, 127, &f.initial_scale_power));
    STRATA_RETURN_IF_ERROR(Int(*fp16, p, "loss_scale_window", 1, std::numeric_limits<int>::max(),
                               &f.loss_scale_window));
    STRATA_RETURN_IF_ERROR(
        Int(*fp16, p, "hysteresis", 1, std::numeric_limits<int>::max(), &f.hysteresis));
    STRATA_RETURN_IF_ERROR(Bool(*fp16, p, "consecutive_hysteresis", &f.consecutive_hysteresis));
    STRATA_RETURN_IF_ERROR(Double(*fp16, p, "min_loss_scale", 0, kInf, &f.min_loss_scale));
    if (f.min_loss_scale <= 0) {
      return InvalidArgumentError("fp16.min_loss_scale: expected a number > 0, got 0");
    }
  }
  const bool has_bf16 = Find(root, "bf16") != nullptr;
  const bool has_alias = Find(root, "bfloat16") != nullptr;
  if (has_bf16 && has_alias) {
    return InvalidArgumentError("bfloat16: given together with its alias bf16; keep one");
  }
  const std::string key = has_alias ? "bfloat16" : "bf16";
  STRATA_ASSIGN_OR_RETURN(const json* bf16, Section(root, "", key));
  if (bf16 != nullptr) {
    STRATA_RETURN_IF_ERROR(CheckKeys(*bf16, key, kBf16Keys));
    if (bf16->contains("immediate_grad_update")) {
      Warn(key + ".immediate_grad_update: accepted but ignored by strata");
    }
    STRATA_ASSIGN_OR_RETURN(config_.bf16.enabled, Enabled(*bf16, key, options_.auto_values.bf16));
  }
  if (config_.fp16.enabled && config_.bf16.enabled) {
    return InvalidArgumentError(key + ".enabled: fp16 and bf16 are both enabled; enable one");
  }
  return Status::Ok();
}

Status Parser::OptDouble(const json& params, std::string_view key,
                         const std::optional<double>& auto_value, std::string_view what, double min,
                         double* out) {
  const json* v = Find(params, key);
  if (v == nullptr) return Status::Ok();
  const std::string path = JoinPath("optimizer.params", key);
  if (IsAuto(*v)) {
    STRATA_ASSIGN_OR_RETURN(*out, Auto(auto_value, path, what));
    return Status::Ok();
  }
  STRATA_ASSIGN_OR_RETURN(*out, JsonDouble(*v, path, min, kInf));
  return Status::Ok();
}

Status Parser::ParseOptimizer(const json& root) {
  STRATA_ASSIGN_OR_RETURN(const json* opt, Section(root, "", "optimizer"));
  if (opt == nullptr) return Status::Ok();
  STRATA_RETURN_IF_ERROR(Keys(*opt, "optimizer", kOptimizerKeys));
  const json* type_json = Find(*opt, "type");
  if (type_json == nullptr) {
    return InvalidArgumentError("optimizer.type: required (one of Adam, AdamW, Adagrad, Lion)");
  }
  STRATA_ASSIGN_OR_RETURN(std::string type_name, JsonString(*type_json, "optimizer.type"));
  const std::string type = Lower(type_name);
  using cpu_optimizer::OptimizerType;
  cpu_optimizer::OptimizerOptions o;
  std::span<const std::string_view> known;
  if (type == "adam" || type == "adamw") {
    o.type = OptimizerType::kAdamW;
    known = kAdamParams;
  } else if (type == "adagrad") {
    o.type = OptimizerType::kAdagrad;
    o.lr = 1e-2;  // DeepSpeedCPUAdagrad's defaults
    o.eps = 1e-10;
    known = kAdagradParams;
  } else if (type == "lion") {
    o.type = OptimizerType::kLion;  // DeepSpeedCPULion: lr 1e-3, betas (0.9, 0.999)
    known = kLionParams;
  } else {
    const bool deepspeed_type =
        std::find(std::begin(kUnsupportedOptimizers), std::end(kUnsupportedOptimizers), type) !=
        std::end(kUnsupportedOptimizers);
    return InvalidArgumentError("optimizer.type: " + type_json->dump() +
                                (deepspeed_type
                                     ? " is a DeepSpeed optimizer strata does not support"
                                     : " is not a known optimizer") +
                                "; supported: Adam, AdamW, Adagrad, Lion (case-insensitive)");
  }
  // DeepSpeed's CPU optimizers default weight_decay to 0 (unlike torch.optim.AdamW).
  o.weight_decay = 0.0;

  STRATA_ASSIGN_OR_RETURN(const json* params, Section(*opt, "optimizer", "params"));
  static const json kEmpty = json::object();
  const json& p = params != nullptr ? *params : kEmpty;
  const std::string pp = "optimizer.params";
  if (p.contains("max_grad_norm")) {
    return InvalidArgumentError(pp +
                                ".max_grad_norm: not accepted in optimizer params (as in "
                                "DeepSpeed); use the top-level \"gradient_clipping\"");
  }
  STRATA_RETURN_IF_ERROR(Keys(p, pp, known));
  const AutoValues& av = options_.auto_values;
  STRATA_RETURN_IF_ERROR(OptDouble(p, "lr", av.lr, "the learning rate", 0, &o.lr));
  STRATA_RETURN_IF_ERROR(OptDouble(p, "eps", av.eps, "the epsilon (adam_epsilon)", 0, &o.eps));
  STRATA_RETURN_IF_ERROR(
      OptDouble(p, "weight_decay", av.weight_decay, "the weight decay", 0, &o.weight_decay));
  if (const json* b = Find(p, "betas")) {
    const std::string path = pp + ".betas";
    if (IsAuto(*b)) {
      STRATA_ASSIGN_OR_RETURN(auto betas,
                              Auto(av.betas, path, "the betas (adam_beta1, adam_beta2)"));
      o.beta1 = betas.first;
      o.beta2 = betas.second;
    } else {
      if (!b->is_array() || b->size() != 2) {
        return InvalidArgumentError(path + ": expected [beta1, beta2], got " + b->dump());
      }
      STRATA_ASSIGN_OR_RETURN(o.beta1, JsonDouble((*b)[0], path + "[0]", 0, 1));
      STRATA_ASSIGN_OR_RETURN(o.beta2, JsonDouble((*b)[1], path + "[1]", 0, 1));
    }
  }
  STRATA_RETURN_IF_ERROR(Bool(p, pp, "bias_correction", &o.bias_correction));
  if (type == "adam") {
    bool adam_w_mode = true;  // DeepSpeed's default: "Adam" means decoupled weight decay
    STRATA_RETURN_IF_ERROR(Bool(p, pp, "adam_w_mode", &adam_w_mode));
    o.type = adam_w_mode ? OptimizerType::kAdamW : OptimizerType::kAdam;
  } else if (type == "adamw" && p.contains("adam_w_mode")) {
    bool adam_w_mode = true;
    STRATA_RETURN_IF_ERROR(Bool(p, pp, "adam_w_mode", &adam_w_mode));
    if (!adam_w_mode) {
      Warn(pp + ".adam_w_mode: false is overridden by type AdamW (as in DeepSpeed)");
    }
  }
  bool amsgrad = false;
  STRATA_RETURN_IF_ERROR(Bool(p, pp, "amsgrad", &amsgrad));
  if (amsgrad) {
    return InvalidArgumentError(pp +
                                ".amsgrad: true is not supported (neither does "
                                "DeepSpeed's CPU Adam); remove it or set false");
  }
  STRATA_RETURN_IF_ERROR(Double(p, pp, "lr_decay", 0, kInf, &o.lr_decay));
  STRATA_RETURN_IF_ERROR(
      Double(p, pp, "initial_accumulator_value", 0, kInf, &o.initial_accumulator_value));
  if (Status s = o.Validate(); !s.ok()) return s.WithContext(pp);
  config_.optimizer = o;
  return Status::Ok();
}

Status Parser::ParseScheduler(const json& root) {
  STRATA_ASSIGN_OR_RETURN(const json* sched, Section(root, "", "scheduler"));
  if (sched == nullptr) return Status::Ok();
  STRATA_RETURN_IF_ERROR(Keys(*sched, "scheduler", kSchedulerKeys));
  const json* type_json = Find(*sched, "type");
  if (type_json == nullptr) {
    return InvalidArgumentError(
        "scheduler.type: required (WarmupLR, WarmupDecayLR, "
        "WarmupCosineLR, OneCycle or LRRangeTest)");
  }
  SchedulerConfig sc;
  STRATA_ASSIGN_OR_RETURN(sc.type, JsonString(*type_json, "scheduler.type"));
  STRATA_ASSIGN_OR_RETURN(const json* params, Section(*sched, "scheduler", "params"));
  if (params != nullptr) sc.params = *params;
  const AutoValues& av = options_.auto_values;
  for (auto it = sc.params.begin(); it != sc.params.end(); ++it) {
    if (!IsAuto(*it)) continue;
    const std::string path = "scheduler.params." + it.key();
    if (it.key() == "warmup_min_lr") {
      *it = 0.0;  // Hugging Face fills 0
    } else if (it.key() == "warmup_max_lr") {
      STRATA_ASSIGN_OR_RETURN(double lr, Auto(av.lr, path, "the learning rate"));
      *it = lr;
    } else if (it.key() == "warmup_num_steps") {
      STRATA_ASSIGN_OR_RETURN(int64_t n,
                              Auto(av.warmup_num_steps, path, "the number of warmup steps"));
      *it = n;
    } else if (it.key() == "total_num_steps") {
      STRATA_ASSIGN_OR_RETURN(int64_t n,
                              Auto(av.total_num_steps, path, "the total number of steps"));
      *it = n;
    } else {
      return InvalidArgumentError(path + ": \"auto\" is not accepted for this key");
    }
  }
  const double lr = config_.optimizer ? config_.optimizer->lr : 1e-3;
  const bool has_betas =
      !config_.optimizer || config_.optimizer->type != cpu_optimizer::OptimizerType::kAdagrad;
  STRATA_ASSIGN_OR_RETURN(auto schedule, MakeLrSchedule(sc, lr, has_betas));
  (void)schedule;
  config_.scheduler = std::move(sc);
  return Status::Ok();
}

}  // namespace strata::runtime::config_internal
