// DeepSpeed's learning-rate schedules as pure functions of the applied-step count.
//
// Algorithm: each DeepSpeed scheduler is a state machine whose only state is
// last_batch_iteration: -1 after construction (which sets the optimizer's lr without stepping),
// then incremented by each engine step. The lr the optimizer sees for its step after k applied
// steps is therefore the constructor's initial value for k == 0 and get_lr() evaluated at
// last_batch_iteration = k - 1 otherwise (lr_schedule.h). Each class below evaluates that closed
// form directly, with DeepSpeed's arithmetic in the same order (double precision, as Python
// floats) so the values match bit for bit.
#include "runtime/numerics/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <numbers>
#include <sstream>
#include <string>

#include "base/json_values.h"

namespace strata::runtime {
namespace {

using nlohmann::json;

constexpr int64_t kIntMax = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

enum class WarmupType { kLog, kLinear };

// Typed access to scheduler.params with the key path in every message.
class Params {
 public:
  explicit Params(const json& params) : params_(params) {}

  Result<double> Double(std::string_view key, std::optional<double> fallback, double min = -kInf,
                        double max = kInf) const {
    const json* v = Find(key);
    if (v == nullptr) {
      if (!fallback) return Missing(key);
      return *fallback;
    }
    return JsonDouble(*v, Path(key), min, max);
  }
  Result<int64_t> Int(std::string_view key, std::optional<int64_t> fallback, int64_t min,
                      int64_t max = kIntMax) const {
    const json* v = Find(key);
    if (v == nullptr) {
      if (!fallback) return Missing(key);
      return *fallback;
    }
    return JsonInt(*v, Path(key), min, max);
  }
  Result<bool> Bool(std::string_view key, bool fallback) const {
    const json* v = Find(key);
    if (v == nullptr) return fallback;
    return JsonBool(*v, Path(key));
  }
  Result<WarmupType> Warmup(std::string_view key) const {
    const json* v = Find(key);
    if (v == nullptr) return WarmupType::kLog;
    if (v->is_string() && v->get_ref<const std::string&>() == "log") return WarmupType::kLog;
    if (v->is_string() && v->get_ref<const std::string&>() == "linear") {
      return WarmupType::kLinear;
    }
    return InvalidArgumentError(Path(key) + ": expected \"log\" or \"linear\", got " + v->dump());
  }
  bool Has(std::string_view key) const { return Find(key) != nullptr; }
  static std::string Path(std::string_view key) { return JoinPath("scheduler.params", key); }

 private:
  const json* Find(std::string_view key) const {
    auto it = params_.find(key);
    if (it == params_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  static Status Missing(std::string_view key) {
    return InvalidArgumentError(Path(key) + ": required for this scheduler");
  }
  const json& params_;
};

// warmup gamma in [0, 1] at last_batch_iteration i (DeepSpeed's _get_gamma first branch).
double WarmupGamma(WarmupType type, double inverse_log_warm_up, int64_t warmup_num_steps,
                   int64_t i) {
  if (type == WarmupType::kLog) {
    return inverse_log_warm_up * std::log(static_cast<double>(i + 1));
  }
  return static_cast<double>(i) / static_cast<double>(warmup_num_steps);
}

class WarmupLR : public LrSchedule {
 public:
  WarmupLR(double min_lr, double max_lr, int64_t warmup_num_steps, WarmupType type)
      : min_lr_(min_lr),
        delta_lr_(max_lr - min_lr),
        warmup_num_steps_(std::max<int64_t>(2, warmup_num_steps)),
        type_(type),
        inverse_log_warm_up_(1.0 / std::log(static_cast<double>(warmup_num_steps_))) {}

  double LearningRate(int64_t steps_taken) const override {
    if (steps_taken <= 0) return min_lr_;  // constructor: last_batch_iteration -1 -> min_lrs
    return min_lr_ + delta_lr_ * Gamma(steps_taken - 1);
  }
  std::string_view name() const override { return "WarmupLR"; }

 protected:
  virtual double Gamma(int64_t i) const {
    if (i < warmup_num_steps_)
      return WarmupGamma(type_, inverse_log_warm_up_, warmup_num_steps_, i);
    return 1.0;
  }

  double min_lr_, delta_lr_;
  int64_t warmup_num_steps_;
  WarmupType type_;
  double inverse_log_warm_up_;
};

class WarmupDecayLR final : public WarmupLR {
 public:
  WarmupDecayLR(double min_lr, double max_lr, int64_t warmup_num_steps, WarmupType type,
                int64_t total_num_steps)
      : WarmupLR(min_lr, max_lr, warmup_num_steps, type), total_num_steps_(total_num_steps) {}
  std::string_view name() const override { return "WarmupDecayLR"; }

 private:
  double Gamma(int64_t i) const override {
    if (i < warmup_num_steps_)
      return WarmupGamma(type_, inverse_log_warm_up_, warmup_num_steps_, i);
    return std::max(0.0,
                    static_cast<double>(total_num_steps_ - i) /
                        std::max(1.0, static_cast<double>(total_num_steps_ - warmup_num_steps_)));
  }
  int64_t total_num_steps_;
};

class WarmupCosineLR final : public LrSchedule {
 public:
  WarmupCosineLR(double org_lr, int64_t total_num_steps, double warmup_min_ratio,
                 int64_t warmup_num_steps, double cos_min_ratio, WarmupType type)
      : org_lr_(org_lr),
        total_num_steps_(total_num_steps),
        warmup_min_ratio_(warmup_min_ratio),
        warmup_num_steps_(std::max<int64_t>(2, warmup_num_steps)),
        cos_min_ratio_(cos_min_ratio),
        type_(type),
        inverse_log_warm_up_(1.0 / std::log(static_cast<double>(warmup_num_steps_))) {}

  double LearningRate(int64_t steps_taken) const override {
    if (steps_taken <= 0) return 0.0;  // DeepSpeed's constructor writes lr 0 (get_lr at -1)
    return org_lr_ * Ratio(steps_taken - 1);
  }
  std::string_view name() const override { return "WarmupCosineLR"; }

 private:
  double Ratio(int64_t i) const {
    if (i < warmup_num_steps_) {
      const double r = WarmupGamma(type_, inverse_log_warm_up_, warmup_num_steps_, i);
      return warmup_min_ratio_ + r * (1.0 - warmup_min_ratio_);
    }
    const double real_last_step = static_cast<double>(i - warmup_num_steps_ + 1);
    const double real_total_steps =
        static_cast<double>(std::max<int64_t>(1, total_num_steps_ - warmup_num_steps_));
    const double progress = std::min(1.0, real_last_step / real_total_steps);
    const double ratio = (1 + std::cos(std::numbers::pi * progress)) / 2;
    return std::max(0.0, cos_min_ratio_ + (1.0 - cos_min_ratio_) * ratio);
  }

  double org_lr_;
  int64_t total_num_steps_;
  double warmup_min_ratio_;
  int64_t warmup_num_steps_;
  double cos_min_ratio_;
  WarmupType type_;
  double inverse_log_warm_up_;
};

struct OneCycleParams {
  double min_lr, max_lr, decay_lr_rate;
  double first_step_size, second_step_size;
  int64_t first_stair_count, second_stair_count;
  double decay_step_size;
  bool cycle_momentum;
  double min_mom, max_mom, decay_mom_rate;
};

class OneCycle final : public LrSchedule {
 public:
  explicit OneCycle(const OneCycleParams& p)
      : p_(p),
        total_size_(p.first_step_size + p.second_step_size),
        step_ratio_(p.first_step_size / total_size_),
        skip_lr_decay_(IsZero(p.decay_step_size) || IsZero(p.decay_lr_rate)),
        skip_mom_decay_(IsZero(p.decay_step_size) || IsZero(p.decay_mom_rate)) {}

  double LearningRate(int64_t k) const override {
    if (k <= 0) return p_.min_lr;  // constructor: group lr = cycle_min_lr
    const int64_t last = k - 1;
    if (static_cast<double>(last) < total_size_) {
      return p_.min_lr + (p_.max_lr - p_.min_lr) * ScaleFactor(k);
    }
    if (skip_lr_decay_) return p_.min_lr;
    const double interval = static_cast<double>(k) - total_size_;  // last - total + 1
    return p_.min_lr / (1 + p_.decay_lr_rate * (interval / p_.decay_step_size));
  }

  std::optional<std::pair<double, double>> Betas(int64_t k) const override {
    if (!p_.cycle_momentum) return std::nullopt;
    if (k <= 0) return std::make_pair(p_.min_mom, 0.99);  // constructor: betas = (min_mom, 0.99)
    const int64_t last = k - 1;
    if (static_cast<double>(last) < total_size_) {
      return std::make_pair(p_.max_mom - (p_.max_mom - p_.min_mom) * ScaleFactor(k), 0.99);
    }
    if (skip_mom_decay_) return std::make_pair(p_.max_mom, 0.99);
    const double interval = static_cast<double>(k) - total_size_;
    return std::make_pair(p_.max_mom * (1 + p_.decay_mom_rate * (interval / p_.decay_step_size)),
                          0.99);
  }
  std::string_view name() const override { return "OneCycle"; }

 private:
  // math.isclose(v, 0) with its default tolerances is true only for exactly 0.
  static bool IsZero(double v) { return v == 0.0; }

  // DeepSpeed's _get_scale_factor with batch_iteration = last_batch_iteration + 1 = k.
  double ScaleFactor(int64_t k) const {
    const double b = static_cast<double>(k);
    const double cycle = std::floor(1 + b / total_size_);
    const double x = 1. + b / total_size_ - cycle;
    double scale;
    int64_t stair_count;
    if (x <= step_ratio_) {
      scale = x / step_ratio_;
      stair_count = p_.first_stair_count;
    } else {
      scale = (x - 1) / (step_ratio_ - 1);
      stair_count = p_.second_stair_count;
    }
    if (stair_count > 0) {
      const double ci = std::fmod(b, total_size_);
      const double stairs = static_cast<double>(stair_count);
      const double position = ci <= p_.first_step_size
                                  ? ci * stairs / p_.first_step_size
                                  : (total_size_ - ci) * stairs / p_.second_step_size;
      scale = std::floor(position) / stairs;
    }
    return scale;
  }

  OneCycleParams p_;
  double total_size_, step_ratio_;
  bool skip_lr_decay_, skip_mom_decay_;
};

class LRRangeTest final : public LrSchedule {
 public:
  LRRangeTest(double min_lr, int64_t step_size, double step_rate, bool staircase)
      : min_lr_(min_lr), step_size_(step_size), step_rate_(step_rate), staircase_(staircase) {}

  double LearningRate(int64_t k) const override {
    if (k <= 0) return min_lr_;  // constructor: group lr = lr_range_test_min_lr
    // get_lr at last_batch_iteration = k - 1: interval uses (last + 1) / step_size.
    const double ratio = static_cast<double>(k) / static_cast<double>(step_size_);
    const double interval = staircase_ ? std::floor(ratio) : ratio;
    return min_lr_ * (1 + step_rate_ * interval);
  }
  std::string_view name() const override { return "LRRangeTest"; }

 private:
  double min_lr_;
  int64_t step_size_;
  double step_rate_;
  bool staircase_;
};

// Hugging Face's LambdaLR schedules: lr = optimizer_lr × Lambda(k) after k applied steps, with
// the lambdas of transformers/optimization.py in its order of operations (Python floats are
// doubles, so the values match bit for bit).
enum class HfKind { kLinear, kCosine, kConstant, kConstantWithWarmup, kCosineWithMinLr };

constexpr std::string_view kHfTypes[] = {"linear", "cosine", "constant", "constant_with_warmup",
                                         "cosine_with_min_lr"};

class HfSchedule final : public LrSchedule {
 public:
  HfSchedule(HfKind kind, double optimizer_lr, int64_t warmup, int64_t total, double num_cycles,
             double min_lr_rate)
      : kind_(kind),
        optimizer_lr_(optimizer_lr),
        warmup_(warmup),
        total_(total),
        num_cycles_(num_cycles),
        min_lr_rate_(min_lr_rate) {}

  double LearningRate(int64_t steps_taken) const override {
    return optimizer_lr_ * Lambda(std::max<int64_t>(0, steps_taken));
  }
  std::string_view name() const override { return kHfTypes[static_cast<int>(kind_)]; }

 private:
  double Lambda(int64_t step) const {
    if (kind_ == HfKind::kConstant) return 1.0;
    if (step < warmup_) {
      // _get_constant_schedule_with_warmup_lr_lambda divides by max(1.0, n), the others by
      // max(1, n): the same double either way.
      return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup_));
    }
    if (kind_ == HfKind::kConstantWithWarmup) return 1.0;
    const double decay_steps = static_cast<double>(std::max<int64_t>(1, total_ - warmup_));
    if (kind_ == HfKind::kLinear) {
      return std::max(0.0, static_cast<double>(total_ - step) / decay_steps);
    }
    const double progress = static_cast<double>(step - warmup_) / decay_steps;
    double factor = 0.5 * (1.0 + std::cos(std::numbers::pi * num_cycles_ * 2.0 * progress));
    factor = factor * (1 - min_lr_rate_) + min_lr_rate_;  // cosine: min_lr_rate 0
    return std::max(0.0, factor);
  }

  HfKind kind_;
  double optimizer_lr_;
  int64_t warmup_, total_;
  double num_cycles_, min_lr_rate_;
};

constexpr std::string_view kTypes[] = {"WarmupLR",
                                       "WarmupDecayLR",
                                       "WarmupCosineLR",
                                       "OneCycle",
                                       "LRRangeTest",
                                       "linear",
                                       "cosine",
                                       "constant",
                                       "constant_with_warmup",
                                       "cosine_with_min_lr"};
constexpr std::string_view kWarmupLRKeys[] = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                              "warmup_type"};
constexpr std::string_view kWarmupDecayLRKeys[] = {
    "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps"};
constexpr std::string_view kWarmupCosineLRKeys[] = {
    "total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type"};
constexpr std::string_view kOneCycleKeys[] = {"cycle_min_lr",
                                              "cycle_max_lr",
                                              "decay_lr_rate",
                                              "cycle_first_step_size",
                                              "cycle_second_step_size",
                                              "cycle_first_stair_count",
                                              "cycle_second_stair_count",
                                              "decay_step_size",
                                              "cycle_momentum",
                                              "cycle_min_mom",
                                              "cycle_max_mom",
                                              "decay_mom_rate"};
constexpr std::string_view kHfLinearKeys[] = {"num_warmup_steps", "num_training_steps"};
constexpr std::string_view kHfCosineKeys[] = {"num_warmup_steps", "num_training_steps",
                                              "num_cycles"};
constexpr std::string_view kHfConstantWithWarmupKeys[] = {"num_warmup_steps"};
constexpr std::string_view kHfCosineWithMinLrKeys[] = {"num_warmup_steps", "num_training_steps",
                                                       "num_cycles", "min_lr", "min_lr_rate"};
constexpr std::string_view kLRRangeTestKeys[] = {"lr_range_test_min_lr", "lr_range_test_step_size",
                                                 "lr_range_test_step_rate",
                                                 "lr_range_test_staircase"};

Result<std::unique_ptr<LrSchedule>> MakeHfSchedule(HfKind kind, const Params& p, const json& params,
                                                   double optimizer_lr) {
  auto check = [&](std::span<const std::string_view> keys) {
    return CheckKeys(params, "scheduler.params", keys);
  };
  int64_t warmup = 0, total = 0;
  double num_cycles = 0.5, min_lr_rate = 0.0;
  switch (kind) {
    case HfKind::kConstant:
      STRATA_RETURN_IF_ERROR(check({}));
      break;
    case HfKind::kConstantWithWarmup:
      STRATA_RETURN_IF_ERROR(check(kHfConstantWithWarmupKeys));
      break;
    case HfKind::kLinear:
      STRATA_RETURN_IF_ERROR(check(kHfLinearKeys));
      break;
    case HfKind::kCosine:
      STRATA_RETURN_IF_ERROR(check(kHfCosineKeys));
      break;
    case HfKind::kCosineWithMinLr:
      STRATA_RETURN_IF_ERROR(check(kHfCosineWithMinLrKeys));
      break;
  }
  if (kind != HfKind::kConstant) {
    // get_scheduler: every schedule but constant requires num_warmup_steps.
    STRATA_ASSIGN_OR_RETURN(warmup, p.Int("num_warmup_steps", std::nullopt, 0));
  }
  if (kind == HfKind::kLinear || kind == HfKind::kCosine || kind == HfKind::kCosineWithMinLr) {
    // More warmup steps than training steps is allowed, as get_scheduler allows it (the run then
    // ends inside its warmup).
    STRATA_ASSIGN_OR_RETURN(total, p.Int("num_training_steps", std::nullopt, 1));
  }
  if (kind == HfKind::kCosine || kind == HfKind::kCosineWithMinLr) {
    STRATA_ASSIGN_OR_RETURN(num_cycles, p.Double("num_cycles", 0.5, 0));
  }
  if (kind == HfKind::kCosineWithMinLr) {
    // get_cosine_with_min_lr_schedule_with_warmup: exactly one of them.
    if (p.Has("min_lr") == p.Has("min_lr_rate")) {
      return InvalidArgumentError(Params::Path("min_lr") +
                                  ": cosine_with_min_lr needs exactly one of min_lr and "
                                  "min_lr_rate");
    }
    if (p.Has("min_lr")) {
      STRATA_ASSIGN_OR_RETURN(double min_lr, p.Double("min_lr", std::nullopt, 0));
      if (!(optimizer_lr > 0)) {
        return InvalidArgumentError(Params::Path("min_lr") +
                                    ": needs a positive optimizer lr to be a rate of");
      }
      min_lr_rate = min_lr / optimizer_lr;
    } else {
      STRATA_ASSIGN_OR_RETURN(min_lr_rate, p.Double("min_lr_rate", std::nullopt, 0));
    }
  }
  return std::unique_ptr<LrSchedule>(
      new HfSchedule(kind, optimizer_lr, warmup, total, num_cycles, min_lr_rate));
}

}  // namespace

std::span<const std::string_view> HfSchedulerTypes() { return kHfTypes; }

bool IsHfSchedulerType(std::string_view type) {
  return std::find(std::begin(kHfTypes), std::end(kHfTypes), type) != std::end(kHfTypes);
}

std::string DescribeLrSchedule(const std::optional<SchedulerConfig>& config, double optimizer_lr) {
  std::ostringstream out;
  if (!config) {
    out << "constant " << optimizer_lr << " (no scheduler)";
    return out.str();
  }
  const json& p = config->params;
  out << config->type;
  if (!config->origin.empty()) out << " (" << config->origin << ")";
  if (IsHfSchedulerType(config->type)) {
    if (config->type != "constant") {
      out << ", " << p.value("num_warmup_steps", int64_t{0}) << " warmup steps";
      if (p.contains("num_training_steps")) out << " of " << p["num_training_steps"].dump();
    }
    out << ", peak " << optimizer_lr;
    if (p.contains("min_lr")) out << ", min lr " << p["min_lr"].get<double>();
    if (p.contains("min_lr_rate")) out << ", min lr rate " << p["min_lr_rate"].get<double>();
    return out.str();
  }
  out << " " << p.dump() << ", optimizer lr " << optimizer_lr;
  return out.str();
}

Result<std::unique_ptr<LrSchedule>> MakeLrSchedule(const SchedulerConfig& config,
                                                   double optimizer_lr, bool optimizer_has_betas) {
  if (!config.params.is_object()) {
    return InvalidArgumentError("scheduler.params: expected an object, got " +
                                config.params.dump());
  }
  const Params p(config.params);
  const std::string& type = config.type;
  auto check = [&](std::span<const std::string_view> keys) {
    return CheckKeys(config.params, "scheduler.params", keys);
  };

  if (type == "WarmupLR" || type == "WarmupDecayLR") {
    const bool decay = type == "WarmupDecayLR";
    STRATA_RETURN_IF_ERROR(decay ? check(kWarmupDecayLRKeys) : check(kWarmupLRKeys));
    STRATA_ASSIGN_OR_RETURN(double min_lr, p.Double("warmup_min_lr", 0.0, 0));
    // WarmupLR: warmup_max_lr defaults to the optimizer's lr; WarmupDecayLR's signature has 0.001.
    STRATA_ASSIGN_OR_RETURN(double max_lr,
                            p.Double("warmup_max_lr", decay ? 0.001 : optimizer_lr, 0));
    STRATA_ASSIGN_OR_RETURN(int64_t warmup, p.Int("warmup_num_steps", 1000, 0));
    STRATA_ASSIGN_OR_RETURN(WarmupType wtype, p.Warmup("warmup_type"));
    if (!decay) return std::unique_ptr<LrSchedule>(new WarmupLR(min_lr, max_lr, warmup, wtype));
    STRATA_ASSIGN_OR_RETURN(int64_t total, p.Int("total_num_steps", std::nullopt, 1));
    return std::unique_ptr<LrSchedule>(new WarmupDecayLR(min_lr, max_lr, warmup, wtype, total));
  }
  if (type == "WarmupCosineLR") {
    STRATA_RETURN_IF_ERROR(check(kWarmupCosineLRKeys));
    STRATA_ASSIGN_OR_RETURN(int64_t total, p.Int("total_num_steps", std::nullopt, 1));
    STRATA_ASSIGN_OR_RETURN(double warmup_min_ratio, p.Double("warmup_min_ratio", 0.0, 0, 1));
    STRATA_ASSIGN_OR_RETURN(int64_t warmup, p.Int("warmup_num_steps", 1000, 0));
    STRATA_ASSIGN_OR_RETURN(double cos_min_ratio, p.Double("cos_min_ratio", 0.0001, 0, 1));
    STRATA_ASSIGN_OR_RETURN(WarmupType wtype, p.Warmup("warmup_type"));
    return std::unique_ptr<LrSchedule>(
        new WarmupCosineLR(optimizer_lr, total, warmup_min_ratio, warmup, cos_min_ratio, wtype));
  }
  if (type == "OneCycle") {
    STRATA_RETURN_IF_ERROR(check(kOneCycleKeys));
    OneCycleParams o{};
    STRATA_ASSIGN_OR_RETURN(o.min_lr, p.Double("cycle_min_lr", std::nullopt, 0));
    STRATA_ASSIGN_OR_RETURN(o.max_lr, p.Double("cycle_max_lr", std::nullopt, 0));
    STRATA_ASSIGN_OR_RETURN(o.decay_lr_rate, p.Double("decay_lr_rate", 0.0, 0));
    STRATA_ASSIGN_OR_RETURN(int64_t first, p.Int("cycle_first_step_size", 2000, 1));
    o.first_step_size = static_cast<double>(first);
    o.second_step_size = o.first_step_size;
    if (p.Has("cycle_second_step_size")) {
      STRATA_ASSIGN_OR_RETURN(int64_t second, p.Int("cycle_second_step_size", std::nullopt, 1));
      o.second_step_size = static_cast<double>(second);
    }
    STRATA_ASSIGN_OR_RETURN(o.first_stair_count, p.Int("cycle_first_stair_count", 0, 0));
    STRATA_ASSIGN_OR_RETURN(o.second_stair_count,
                            p.Int("cycle_second_stair_count", o.first_stair_count, 0));
    STRATA_ASSIGN_OR_RETURN(int64_t decay_step, p.Int("decay_step_size", 0, 0));
    o.decay_step_size = static_cast<double>(decay_step);
    STRATA_ASSIGN_OR_RETURN(bool momentum, p.Bool("cycle_momentum", true));
    o.cycle_momentum = momentum && optimizer_has_betas;  // DeepSpeed: off without 'betas'
    STRATA_ASSIGN_OR_RETURN(o.min_mom, p.Double("cycle_min_mom", 0.8, 0, 1));
    STRATA_ASSIGN_OR_RETURN(o.max_mom, p.Double("cycle_max_mom", 0.9, 0, 1));
    STRATA_ASSIGN_OR_RETURN(o.decay_mom_rate, p.Double("decay_mom_rate", 0.0));
    return std::unique_ptr<LrSchedule>(new OneCycle(o));
  }
  if (type == "LRRangeTest") {
    STRATA_RETURN_IF_ERROR(check(kLRRangeTestKeys));
    STRATA_ASSIGN_OR_RETURN(double min_lr, p.Double("lr_range_test_min_lr", 1e-3, 0));
    STRATA_ASSIGN_OR_RETURN(int64_t step_size, p.Int("lr_range_test_step_size", 2000, 1));
    STRATA_ASSIGN_OR_RETURN(double step_rate, p.Double("lr_range_test_step_rate", 1.0));
    STRATA_ASSIGN_OR_RETURN(bool staircase, p.Bool("lr_range_test_staircase", false));
    return std::unique_ptr<LrSchedule>(new LRRangeTest(min_lr, step_size, step_rate, staircase));
  }
  for (size_t i = 0; i < std::size(kHfTypes); ++i) {
    if (type == kHfTypes[i]) {
      return MakeHfSchedule(static_cast<HfKind>(i), p, config.params, optimizer_lr);
    }
  }
  std::string hint = DidYouMean(type, kTypes);
  return InvalidArgumentError("scheduler.type: unknown scheduler \"" + type + "\"" + hint +
                              "; supported: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, "
                              "LRRangeTest (DeepSpeed's), linear, cosine, constant, "
                              "constant_with_warmup, cosine_with_min_lr (Hugging Face's)");
}

}  // namespace strata::runtime
