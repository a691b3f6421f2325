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
#include <tuple>
#include <utility>
#include <vector>

#include "base/json_values.h"
#include "runtime/config/internal_parser.h"
#include "runtime/numerics/lr_schedule.h"

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
constexpr std::string_view kBf16Keys[] = {"enabled", "bf16_optimizer_states"};
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

bool Parser::Enabled(const json& section, const std::string& path,
                     const std::optional<bool>& auto_value, const std::optional<bool>& given,
                     std::string_view flag) {
  const json* v = Find(section, "enabled");
  const std::string key = path + ".enabled";
  if (v == nullptr) return given.value_or(false);  // absent: the flag, if given, fills it
  if (IsAuto(*v)) {
    std::optional<bool> on = Auto(auto_value, key, "whether training runs in " + path, flag);
    if (on)
      Resolved(key, *on ? "true" : "false", std::string(flag) + (*on ? " given" : " not given"));
    return on.value_or(false);
  }
  Result<bool> on = JsonBool(*v, key);
  if (!Check(on.status())) return false;
  Match(key, *on, given, flag, *on ? "true" : "false", given.value_or(false) ? "true" : "false");
  return *on;
}

void Parser::ParsePrecision(const json& root) {
  const AutoValues& av = options_.auto_values;
  const AutoValues& given = options_.given;
  if (const json* fp16 = Section(root, "", "fp16")) {
    const std::string p = "fp16";
    Fp16Config& f = config_.fp16;
    Keys(*fp16, p, kFp16Keys);
    f.enabled = Enabled(*fp16, p, av.fp16, given.fp16, "--fp16");
    Bool(*fp16, p, "auto_cast", &f.auto_cast);
    Double(*fp16, p, "loss_scale", 0, kInf, &f.loss_scale);
    Int(*fp16, p, "initial_scale_power", 0, 127, &f.initial_scale_power);
    Int(*fp16, p, "loss_scale_window", 1, std::numeric_limits<int>::max(), &f.loss_scale_window);
    Int(*fp16, p, "hysteresis", 1, std::numeric_limits<int>::max(), &f.hysteresis);
    Bool(*fp16, p, "consecutive_hysteresis", &f.consecutive_hysteresis);
    // An integer in DeepSpeed's DeepSpeedFP16Config (1e-10 is refused there, so here too).
    int64_t min_scale = static_cast<int64_t>(f.min_loss_scale);
    if (Int(*fp16, p, "min_loss_scale", 1, kIntMax, &min_scale)) {
      f.min_loss_scale = static_cast<double>(min_scale);
    }
  } else if (given.fp16.value_or(false)) {
    config_.fp16.enabled = true;  // --fp16 with no fp16 section: DeepSpeed's defaults
  }
  const bool has_bf16 = Find(root, "bf16") != nullptr;
  const bool has_alias = Find(root, "bfloat16") != nullptr;
  if (has_bf16 && has_alias) Fail("bfloat16: given together with its alias bf16; keep one");
  const std::string key = has_alias ? "bfloat16" : "bf16";
  if (const json* bf16 = Section(root, "", key)) {
    Keys(*bf16, key, kBf16Keys);
    config_.bf16.enabled = Enabled(*bf16, key, av.bf16, given.bf16, "--bf16");
    Bool(*bf16, key, "bf16_optimizer_states", &config_.bf16.optimizer_states);
    if (config_.bf16.optimizer_states && !config_.bf16.enabled) {
      Warn(key + ".bf16_optimizer_states: ignored, " + key + " is not enabled");
      config_.bf16.optimizer_states = false;
    }
  } else if (given.bf16.value_or(false)) {
    config_.bf16.enabled = true;
  }
  if (config_.fp16.enabled && config_.bf16.enabled) {
    Fail(key + ".enabled: fp16 and bf16 are both enabled; enable one");
  }
}

void Parser::OptDouble(const json& params, std::string_view key,
                       const std::optional<double>& auto_value, const std::optional<double>& given,
                       std::string_view what, std::string_view flag, double min, double* out) {
  const json* v = Find(params, key);
  const std::string path = JoinPath("optimizer.params", key);
  if (v == nullptr) {
    if (given) *out = *given;
    return;
  }
  if (IsAuto(*v)) {
    if (auto value = Auto(auto_value, path, what, flag)) {
      *out = *value;
      Resolved(path, Number(*value),
               flag.empty() ? std::string(what) + ", Hugging Face's default"
                            : From(given.has_value(), flag));
    }
    return;
  }
  Result<double> value = JsonDouble(*v, path, min, kInf);
  if (!Check(value.status())) return;
  *out = *value;
  if (!flag.empty()) Match(path, *value, given, flag, Number(*value), Number(given.value_or(0)));
}

void Parser::ParseOptimizer(const json& root) {
  const AutoValues& av = options_.auto_values;
  const AutoValues& given = options_.given;
  using cpu_optimizer::OptimizerType;
  const json* opt = Section(root, "", "optimizer");
  if (opt == nullptr) {
    if (Find(root, "optimizer") != nullptr) return;  // not an object: reported
    // No optimizer section: Hugging Face's Trainer builds its own AdamW from its arguments.
    if (!av.lr) return;
    cpu_optimizer::OptimizerOptions o;
    o.type = OptimizerType::kAdamW;
    o.lr = *av.lr;
    o.weight_decay = av.weight_decay.value_or(0.0);
    if (av.betas) std::tie(o.beta1, o.beta2) = *av.betas;
    if (av.eps) o.eps = *av.eps;
    config_.optimizer = o;
    Warn("no optimizer section: AdamW with lr " + Number(o.lr) + ", betas (" + Number(o.beta1) +
         ", " + Number(o.beta2) + "), eps " + Number(o.eps) + ", weight_decay " +
         Number(o.weight_decay) + " (as Hugging Face's Trainer; --lr sets lr)");
    return;
  }
  Keys(*opt, "optimizer", kOptimizerKeys);
  const json* type_json = Find(*opt, "type");
  if (type_json == nullptr) {
    Fail("optimizer.type: required (one of Adam, AdamW, Adagrad, Lion)");
    return;
  }
  Result<std::string> type_name = JsonString(*type_json, "optimizer.type");
  if (!Check(type_name.status())) return;
  const std::string type = Lower(*type_name);
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
    Fail("optimizer.type: " + type_json->dump() +
         (deepspeed_type ? " is a DeepSpeed optimizer strata does not support"
                         : " is not a known optimizer") +
         "; supported: Adam, AdamW, Adagrad, Lion (case-insensitive)");
    return;
  }
  // DeepSpeed's CPU optimizers default weight_decay to 0 (unlike torch.optim.AdamW).
  o.weight_decay = 0.0;

  const json* params = Section(*opt, "optimizer", "params");
  static const json kEmpty = json::object();
  const json& p = params != nullptr ? *params : kEmpty;
  const std::string pp = "optimizer.params";
  if (p.contains("max_grad_norm")) {
    Fail(pp +
         ".max_grad_norm: not accepted in optimizer params (as in DeepSpeed); use the "
         "top-level \"gradient_clipping\"");
  }
  Keys(p, pp, known);
  OptDouble(p, "lr", av.lr, given.lr, "the learning rate", "--lr", 0, &o.lr);
  OptDouble(p, "eps", av.eps, std::nullopt, "adam_epsilon", "", 0, &o.eps);
  OptDouble(p, "weight_decay", av.weight_decay, std::nullopt, "weight_decay", "", 0,
            &o.weight_decay);
  if (const json* b = Find(p, "betas")) {
    const std::string path = pp + ".betas";
    if (IsAuto(*b)) {
      if (auto betas = Auto(av.betas, path, "the betas (adam_beta1, adam_beta2)", "")) {
        std::tie(o.beta1, o.beta2) = *betas;
        Resolved(path, "[" + Number(o.beta1) + ", " + Number(o.beta2) + "]",
                 "adam_beta1, adam_beta2, Hugging Face's defaults");
      }
    } else if (!b->is_array() || b->size() != 2) {
      Fail(path + ": expected [beta1, beta2], got " + b->dump());
    } else {
      Result<double> b1 = JsonDouble((*b)[0], path + "[0]", 0, 1);
      Result<double> b2 = JsonDouble((*b)[1], path + "[1]", 0, 1);
      if (Check(b1.status())) o.beta1 = *b1;
      if (Check(b2.status())) o.beta2 = *b2;
    }
  }
  Bool(p, pp, "bias_correction", &o.bias_correction);
  if (type == "adam") {
    bool adam_w_mode = true;  // DeepSpeed's default: "Adam" means decoupled weight decay
    Bool(p, pp, "adam_w_mode", &adam_w_mode);
    o.type = adam_w_mode ? OptimizerType::kAdamW : OptimizerType::kAdam;
  } else if (type == "adamw" && p.contains("adam_w_mode")) {
    bool adam_w_mode = true;
    Bool(p, pp, "adam_w_mode", &adam_w_mode);
    if (!adam_w_mode)
      Warn(pp + ".adam_w_mode: false is overridden by type AdamW (as in DeepSpeed)");
  }
  bool amsgrad = false;
  Bool(p, pp, "amsgrad", &amsgrad);
  if (amsgrad) {
    Fail(pp +
         ".amsgrad: true is not supported (neither does DeepSpeed's CPU Adam); remove it or "
         "set false");
  }
  Double(p, pp, "lr_decay", 0, kInf, &o.lr_decay);
  Double(p, pp, "initial_accumulator_value", 0, kInf, &o.initial_accumulator_value);
  if (Status s = o.Validate(); !s.ok()) {
    Fail(s.WithContext(pp));
    return;
  }
  config_.optimizer = o;
}

void Parser::ParseScheduler(const json& root) {
  const json* sched = Section(root, "", "scheduler");
  if (sched == nullptr) return;
  Keys(*sched, "scheduler", kSchedulerKeys);
  const json* type_json = Find(*sched, "type");
  if (type_json == nullptr) {
    Fail(
        "scheduler.type: required (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle or "
        "LRRangeTest)");
    return;
  }
  SchedulerConfig sc;
  Result<std::string> type = JsonString(*type_json, "scheduler.type");
  if (!Check(type.status())) return;
  sc.type = *type;
  if (const json* params = Section(*sched, "scheduler", "params")) sc.params = *params;
  const AutoValues& av = options_.auto_values;
  const AutoValues& given = options_.given;
  const double lr = config_.optimizer ? config_.optimizer->lr : av.lr.value_or(1e-3);
  std::vector<std::string> to_default;
  for (auto it = sc.params.begin(); it != sc.params.end(); ++it) {
    const std::string path = "scheduler.params." + it.key();
    if (!IsAuto(*it)) {
      if (it.key() == "warmup_num_steps" && given.warmup_num_steps && it->is_number() &&
          it->get<double>() != static_cast<double>(*given.warmup_num_steps)) {
        Fail(path + ": the config says " + it->dump() + ", --warmup-steps says " +
             std::to_string(*given.warmup_num_steps) +
             "; make them agree or write \"auto\" in the config");
      }
      continue;
    }
    if (it.key() == "warmup_min_lr") {
      *it = 0.0;  // Hugging Face fills 0
      Resolved(path, "0", "Hugging Face's rule");
    } else if (it.key() == "warmup_max_lr") {
      *it = lr;
      Resolved(path, Number(lr), "the optimizer's learning rate");
    } else if (it.key() == "warmup_num_steps") {
      if (auto n =
              Auto(av.warmup_num_steps, path, "the number of warmup steps", "--warmup-steps")) {
        *it = *n;
        Resolved(path, std::to_string(*n),
                 From(given.warmup_num_steps.has_value(), "--warmup-steps"));
      }
    } else if (it.key() == "total_num_steps") {
      if (auto n = Auto(av.total_num_steps, path, "the total number of steps", "--steps")) {
        *it = *n;
        Resolved(path, std::to_string(*n), "the run's steps, --steps");
      }
    } else {
      to_default.push_back(it.key());  // HF never fills it: the scheduler's own default
    }
  }
  for (const std::string& key : to_default) {
    sc.params.erase(key);
    Resolved("scheduler.params." + key, "its default", "DeepSpeed's default");
  }
  const bool has_betas =
      !config_.optimizer || config_.optimizer->type != cpu_optimizer::OptimizerType::kAdagrad;
  Result<std::unique_ptr<LrSchedule>> schedule = MakeLrSchedule(sc, lr, has_betas);
  if (!Check(schedule.status())) return;
  config_.scheduler = std::move(sc);
}

}  // namespace strata::runtime::config_internal
