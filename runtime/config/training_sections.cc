// The sections that decide how a step is computed: fp16/bf16 (one of them at most; "enabled" may
// be "auto", answered by the caller), optimizer (DeepSpeed's CPU optimizer types with their
// defaults; hyper-parameters may be "auto") and scheduler (its "auto" params filled in as Hugging
// Face does, then validated by building the schedule once with MakeLrSchedule, so the config and
// the engine can never disagree on what a valid schedule is).
#include <algorithm>
#include <cctype>
#include <cmath>
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
constexpr std::string_view kHfSchedulerKeys[] = {"type", "warmup_steps", "warmup_ratio", "min_lr",
                                                 "min_lr_rate"};
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

std::optional<int64_t> Parser::WarmupSteps(const std::optional<int64_t>& steps,
                                           const std::optional<double>& ratio,
                                           const std::string& who) {
  if (steps && *steps > 0) return steps;
  if (!ratio) return steps.value_or(0);
  const std::optional<int64_t>& total = options_.auto_values.total_num_steps;
  if (!total) {
    Fail(who + ": a warmup ratio needs the run's total number of steps, which this command " +
         "does not know; give the warmup in steps");
    return std::nullopt;
  }
  return static_cast<int64_t>(std::ceil(static_cast<double>(*total) * *ratio));
}

void Parser::ParseScheduler(const json& root) {
  const json* hf_section = nullptr;
  if (const json* strata = Find(root, "strata"); strata != nullptr && strata->is_object()) {
    hf_section = Section(*strata, "strata", "lr_scheduler");
  }
  const json* sched = Section(root, "", "scheduler");
  if (sched == nullptr) {
    if (Find(root, "scheduler") == nullptr) ParseHfScheduler(hf_section);
    return;  // (a scheduler that is not an object: reported)
  }
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
  sc.origin = "the config's scheduler section";
  if (IsHfSchedulerType(sc.type)) {
    Fail("scheduler.type: \"" + sc.type +
         "\" is a Hugging Face lr_scheduler_type, not a DeepSpeed scheduler; give --lr-scheduler " +
         sc.type + " with no scheduler section, or a DeepSpeed type (WarmupLR, WarmupDecayLR, " +
         "WarmupCosineLR, OneCycle, LRRangeTest)");
    return;
  }
  // Hugging Face's Trainer runs the config's scheduler when there is one; a flag asking for its
  // own schedule would be silently ignored there, so it is refused here.
  const AutoValues& av = options_.auto_values;
  const AutoValues& given = options_.given;
  const std::string conflict =
      "scheduler: the config's " + sc.type + " section decides the schedule, and ";
  if (given.lr_scheduler_type) {
    Fail(conflict + "--lr-scheduler " + *given.lr_scheduler_type +
         " asks for Hugging Face's; remove the flag or the section");
  }
  if (given.min_lr || given.min_lr_rate) {
    Fail(conflict + (given.min_lr ? "--min-lr" : "--min-lr-rate") +
         " is for --lr-scheduler cosine_with_min_lr; remove the flag or the section");
  }
  if (hf_section != nullptr) {
    Fail("strata.lr_scheduler: given together with a scheduler section (" + sc.type +
         "); keep one");
  }
  // --warmup-steps / --warmup-ratio answer warmup_num_steps as HF's Trainer does
  // (TrainingArguments.get_warmup_steps).
  std::optional<int64_t> flag_warmup;
  std::string warmup_flag = "--warmup-steps";
  if (given.warmup_num_steps || given.warmup_ratio) {
    if (given.warmup_ratio && given.warmup_num_steps.value_or(0) == 0) {
      warmup_flag = "--warmup-ratio " + Number(*given.warmup_ratio);
    }
    flag_warmup = WarmupSteps(given.warmup_num_steps, given.warmup_ratio, "--warmup-ratio");
  }
  if (const json* params = Section(*sched, "scheduler", "params")) sc.params = *params;
  const double lr = config_.optimizer ? config_.optimizer->lr : av.lr.value_or(1e-3);
  std::vector<std::string> to_default;
  for (auto it = sc.params.begin(); it != sc.params.end(); ++it) {
    const std::string path = "scheduler.params." + it.key();
    if (!IsAuto(*it)) {
      if (it.key() == "warmup_num_steps" && flag_warmup && it->is_number() &&
          it->get<double>() != static_cast<double>(*flag_warmup)) {
        Fail(path + ": the config says " + it->dump() + ", " + warmup_flag + " says " +
             std::to_string(*flag_warmup) + "; make them agree or write \"auto\" in the config");
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
      const std::optional<int64_t> n = flag_warmup ? flag_warmup : av.warmup_num_steps;
      if (Auto(n, path, "the number of warmup steps", "--warmup-steps")) {
        *it = *n;
        Resolved(path, std::to_string(*n), From(flag_warmup.has_value(), warmup_flag));
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

// Hugging Face's schedule: the settings of strata.lr_scheduler (a checkpoint's config, or the
// user's), with the flags over them where they agree (a disagreement is refused, naming both).
// With neither, no schedule: constant lr (HF's Trainer would default to linear decay, but strata
// has always trained at the optimizer's lr without a scheduler section, and keeps doing so).
void Parser::ParseHfScheduler(const json* section) {
  const AutoValues& given = options_.given;
  const bool flags = given.lr_scheduler_type || given.warmup_num_steps || given.warmup_ratio ||
                     given.min_lr || given.min_lr_rate;
  if (section == nullptr && !flags) return;
  const std::string p = "strata.lr_scheduler";
  std::optional<std::string> type;
  std::optional<int64_t> steps;
  std::optional<double> ratio, min_lr, min_rate;
  if (section != nullptr) {
    Keys(*section, p, kHfSchedulerKeys);
    auto read_double = [&](std::string_view key, double max, std::optional<double>* out) {
      if (const json* v = Find(*section, key)) {
        Result<double> d = JsonDouble(*v, JoinPath(p, key), 0, max);
        if (Check(d.status())) *out = *d;
      }
    };
    if (const json* v = Find(*section, "type")) {
      Result<std::string> t = JsonString(*v, p + ".type");
      if (Check(t.status())) type = *t;
    }
    if (const json* v = Find(*section, "warmup_steps")) {
      Result<int64_t> n = JsonInt(*v, p + ".warmup_steps", 0, kIntMax);
      if (Check(n.status())) steps = *n;
    }
    read_double("warmup_ratio", 1, &ratio);
    read_double("min_lr", kInf, &min_lr);
    read_double("min_lr_rate", kInf, &min_rate);
  }
  const std::string in_config = p + " (" + options_.source + ")";
  std::string origin = type ? in_config : "";
  if (given.lr_scheduler_type) {
    if (type && *type != *given.lr_scheduler_type) {
      Fail(p + ".type: the config says \"" + *type + "\", --lr-scheduler says \"" +
           *given.lr_scheduler_type + "\"; make them agree or remove one");
    }
    type = given.lr_scheduler_type;
    origin = "--lr-scheduler";
  }
  if (given.warmup_num_steps || given.warmup_ratio) {
    if (steps || ratio) {
      const std::optional<int64_t> config_n = WarmupSteps(steps, ratio, p + ".warmup_ratio");
      const std::optional<int64_t> flag_n =
          WarmupSteps(given.warmup_num_steps, given.warmup_ratio, "--warmup-ratio");
      if (config_n && flag_n && *config_n != *flag_n) {
        Fail(p + ": the config warms up for " + std::to_string(*config_n) +
             " steps, --warmup-steps/--warmup-ratio for " + std::to_string(*flag_n) +
             "; make them agree or remove one");
      }
    }
    steps = given.warmup_num_steps;
    ratio = given.warmup_ratio;
  }
  const double lr =
      config_.optimizer ? config_.optimizer->lr : cpu_optimizer::OptimizerOptions{}.lr;
  if (given.min_lr || given.min_lr_rate) {
    if (min_lr || min_rate) {
      const double config_rate = min_lr ? *min_lr / lr : *min_rate;
      const double flag_rate = given.min_lr ? *given.min_lr / lr : *given.min_lr_rate;
      if (std::abs(config_rate - flag_rate) > 1e-12 * std::max(1.0, std::abs(config_rate))) {
        Fail(p + ": the config's minimum lr is " + Number(config_rate * lr) + ", the flags' " +
             Number(flag_rate * lr) + "; make them agree or remove one");
      }
    }
    min_lr = given.min_lr;
    min_rate = given.min_lr_rate;
  }
  if (!type) {
    type = "linear";
    origin = "Hugging Face's default lr_scheduler_type, as --lr-scheduler was not given";
  }
  if (!IsHfSchedulerType(*type)) {
    Fail(p + ".type: unknown lr_scheduler_type \"" + *type + "\"" +
         DidYouMean(*type, HfSchedulerTypes()) +
         "; supported: linear, cosine, constant, constant_with_warmup, cosine_with_min_lr");
    return;
  }
  // get_cosine_with_min_lr_schedule_with_warmup takes exactly one of min_lr and min_lr_rate; the
  // other schedules take neither (get_scheduler would raise a TypeError).
  if (*type == "cosine_with_min_lr") {
    if (!min_lr && !min_rate) {
      Fail(
          "--lr-scheduler cosine_with_min_lr needs --min-lr or --min-lr-rate (Hugging Face's "
          "lr_scheduler_kwargs min_lr / min_lr_rate)");
      return;
    }
    if (min_lr && min_rate) {
      Fail("--min-lr and --min-lr-rate: give one of them (as Hugging Face's lr_scheduler_kwargs)");
      return;
    }
  } else if (min_lr || min_rate) {
    Fail(std::string(min_lr ? "--min-lr" : "--min-lr-rate") +
         ": for --lr-scheduler cosine_with_min_lr only; the schedule is " + *type);
    return;
  }
  if (steps.value_or(0) > 0 && ratio.value_or(0) > 0) {
    Warn("--warmup-steps " + std::to_string(*steps) + " overrides --warmup-ratio " +
         Number(*ratio) + " (as Hugging Face's TrainingArguments)");
  }
  const bool decays = *type == "linear" || *type == "cosine" || *type == "cosine_with_min_lr";
  const std::optional<int64_t>& total = options_.auto_values.total_num_steps;
  if (!total && (decays || (ratio && !(steps && *steps > 0)))) {
    // A command that runs no steps (`strata estimate`, the launcher reading the comms timeout, a
    // checkpoint's config read back) cannot size a schedule over the run's steps: the run that
    // trains builds it. Nothing here depends on it.
    return;
  }
  const std::optional<int64_t> warmup = WarmupSteps(steps, ratio, "--warmup-ratio");
  if (!warmup) return;
  if (*type == "constant" && *warmup > 0) {
    Warn("--lr-scheduler constant ignores the " + std::to_string(*warmup) +
         " warmup steps (as Hugging Face's get_scheduler); constant_with_warmup warms up");
  }
  SchedulerConfig sc;
  sc.type = *type;
  sc.origin = origin;
  if (*type != "constant") sc.params["num_warmup_steps"] = *warmup;
  if (decays) sc.params["num_training_steps"] = *total;
  if (*type == "cosine" || *type == "cosine_with_min_lr") sc.params["num_cycles"] = 0.5;
  if (min_lr) sc.params["min_lr"] = *min_lr;
  if (min_rate) sc.params["min_lr_rate"] = *min_rate;
  Result<std::unique_ptr<LrSchedule>> schedule = MakeLrSchedule(sc, lr);
  if (!Check(schedule.status())) return;
  config_.scheduler = std::move(sc);
  json saved = {{"type", *type}};
  if (steps) saved["warmup_steps"] = *steps;
  if (ratio) saved["warmup_ratio"] = *ratio;
  if (min_lr) saved["min_lr"] = *min_lr;
  if (min_rate) saved["min_lr_rate"] = *min_rate;
  config_.strata.lr_scheduler = std::move(saved);
}

}  // namespace strata::runtime::config_internal
