#include "runtime/config/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "base/json_values.h"
#include "runtime/numerics/lr_schedule.h"

namespace strata::runtime {
namespace {

namespace fs = std::filesystem;
using cpu_optimizer::OptimizerType;

Config Parse(const std::string& text, const ParseOptions& options = {}) {
  auto c = ParseConfig(text, options);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : Config{};
}

std::string Error(const std::string& text, const ParseOptions& options = {}) {
  auto c = ParseConfig(text, options);
  EXPECT_FALSE(c.ok()) << "accepted: " << text;
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  return std::string(c.status().message());
}

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "in: " << (haystack)

class ScratchDir {
 public:
  ScratchDir() {
    path_ = fs::temp_directory_path() /
            ("strata-config-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    fs::remove_all(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

TEST(ConfigTest, DefaultsAreDeepSpeeds) {
  Config c = Parse(R"({"train_batch_size": 8})");
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_EQ(c.zero.offload_param.device, Home::kDevice);
  EXPECT_EQ(c.zero.offload_param.buffer_count, 5);
  // Unset: strata sizes its buffers to the largest unit and keeps no unit in CPU memory
  // (DeepSpeed's defaults are 1e8 and 1e9; README's deviations).
  EXPECT_FALSE(c.zero.offload_param.buffer_size.has_value());
  EXPECT_FALSE(c.zero.offload_param.max_in_cpu.has_value());
  EXPECT_FALSE(c.zero.offload_param.pin_memory);
  EXPECT_EQ(c.zero.offload_optimizer.buffer_count, 4);
  EXPECT_TRUE(c.zero.offload_optimizer.pipeline_read);  // strata's deviation
  EXPECT_TRUE(c.zero.offload_optimizer.pipeline_write);
  EXPECT_EQ(c.zero.offload_optimizer.ratio, 1.0);
  EXPECT_EQ(c.zero.sub_group_size, 1'000'000'000);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(c.zero.param_persistence_threshold, 100'000);
  EXPECT_EQ(c.zero.max_live_parameters, 1'000'000'000);
  EXPECT_EQ(c.zero.max_reuse_distance, 1'000'000'000);
  EXPECT_TRUE(c.zero.contiguous_gradients);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(c.aio.block_size, 1048576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  EXPECT_FALSE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 0);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_EQ(c.fp16.min_loss_scale, 1);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_EQ(c.gradient_clipping, 0);
  EXPECT_FALSE(c.optimizer.has_value());
  EXPECT_FALSE(c.scheduler.has_value());
  EXPECT_FALSE(c.wall_clock_breakdown);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_TRUE(c.warnings.empty());
  // overlap_comm: null -> true for stage 3.
  EXPECT_TRUE(
      Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3}})").zero.overlap_comm);
  EXPECT_TRUE(Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                        "overlap_comm": null}})")
                  .zero.overlap_comm);
}

TEST(ConfigTest, FullZeroInfinityConfig) {
  ScratchDir dir;
  const std::string text = R"({
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0, "steps_per_print": 5, "wall_clock_breakdown": true,
    "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                              "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 1000,
                                                       "warmup_num_steps": 100}},
    "zero_optimization": {
      "stage": 3,
      "offload_param": {"device": "nvme", "nvme_path": ")" +
                           dir.str() + R"(",
                        "buffer_count": 6, "buffer_size": 2e8, "max_in_cpu": "1e9",
                        "pin_memory": true},
      "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                           dir.str() + R"(",
                            "buffer_count": 5, "pin_memory": true, "pipeline_read": false,
                            "fast_init": true},
      "sub_group_size": 1e8, "stage3_prefetch_bucket_size": 5e7,
      "stage3_param_persistence_threshold": 1e4, "stage3_max_live_parameters": 3e8,
      "stage3_max_reuse_distance": 3e8, "contiguous_gradients": true, "overlap_comm": false,
      "reduce_bucket_size": "5e8", "stage3_gather_16bit_weights_on_model_save": true
    },
    "aio": {"block_size": 262144, "queue_depth": 32, "intra_op_parallelism": 2,
            "single_submit": true, "overlap_events": false}
  })";
  Config c = Parse(text, {.source = "zi.json"});
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offload_param.device, Home::kNvme);
  EXPECT_EQ(c.zero.offload_param.nvme_path, dir.str());
  EXPECT_TRUE(fs::is_directory(dir.str()));  // created
  EXPECT_EQ(c.zero.offload_param.buffer_count, 6);
  EXPECT_EQ(c.zero.offload_param.buffer_size, 200'000'000);
  EXPECT_EQ(c.zero.offload_param.max_in_cpu, 1'000'000'000);
  EXPECT_TRUE(c.zero.offload_param.pin_memory);
  EXPECT_EQ(c.zero.offload_optimizer.device, Home::kNvme);
  EXPECT_EQ(c.zero.offload_optimizer.buffer_count, 5);
  EXPECT_FALSE(c.zero.offload_optimizer.pipeline_read);
  EXPECT_TRUE(c.zero.offload_optimizer.pipeline_write);
  EXPECT_TRUE(c.zero.offload_optimizer.fast_init);
  EXPECT_EQ(c.zero.sub_group_size, 100'000'000);
  EXPECT_EQ(c.zero.param_persistence_threshold, 10'000);
  EXPECT_EQ(c.zero.max_live_parameters, 300'000'000);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(c.aio.block_size, 262144);
  EXPECT_EQ(c.aio.queue_depth, 32);
  EXPECT_EQ(c.aio.intra_op_parallelism, 2);
  EXPECT_TRUE(c.aio.single_submit);
  EXPECT_FALSE(c.aio.overlap_events);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.steps_per_print, 5);
  EXPECT_TRUE(c.wall_clock_breakdown);
  ASSERT_TRUE(c.optimizer.has_value());
  EXPECT_EQ(c.optimizer->type, OptimizerType::kAdamW);
  EXPECT_DOUBLE_EQ(c.optimizer->lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optimizer->beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.optimizer->weight_decay, 0.1);
  ASSERT_TRUE(c.scheduler.has_value());
  EXPECT_EQ(c.scheduler->type, "WarmupCosineLR");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_HAS(c.warnings[0],
             "zi.json: accepted but ignored by strata: "
             "zero_optimization.stage3_gather_16bit_weights_on_model_save");
  EXPECT_HAS(c.warnings[0], "ignored");
}

TEST(ConfigTest, OptimizerMapping) {
  auto opt = [](const std::string& section) {
    return Parse(R"({"train_batch_size": 1, "optimizer": )" + section + "}").optimizer;
  };
  auto o = opt(R"({"type": "Adam"})");
  ASSERT_TRUE(o);
  EXPECT_EQ(o->type, OptimizerType::kAdamW);  // adam_w_mode defaults to true
  EXPECT_DOUBLE_EQ(o->lr, 1e-3);
  EXPECT_DOUBLE_EQ(o->weight_decay, 0.0);  // DeepSpeedCPUAdam's default
  o = opt(R"({"type": "adam", "params": {"adam_w_mode": false, "weight_decay": 0.01,
                                          "bias_correction": false}})");
  EXPECT_EQ(o->type, OptimizerType::kAdam);
  EXPECT_FALSE(o->bias_correction);
  o = opt(R"({"type": "ADAGRAD", "params": {"lr_decay": 0.1, "initial_accumulator_value": 0.5}})");
  EXPECT_EQ(o->type, OptimizerType::kAdagrad);
  EXPECT_DOUBLE_EQ(o->lr, 1e-2);
  EXPECT_DOUBLE_EQ(o->eps, 1e-10);
  EXPECT_DOUBLE_EQ(o->lr_decay, 0.1);
  EXPECT_DOUBLE_EQ(o->initial_accumulator_value, 0.5);
  o = opt(R"({"type": "Lion", "params": {"lr": 1e-4, "betas": [0.9, 0.99]}})");
  EXPECT_EQ(o->type, OptimizerType::kLion);
  EXPECT_DOUBLE_EQ(o->beta2, 0.99);

  std::string e = Error(R"({"train_batch_size": 1, "optimizer": {"type": "Lamb"}})");
  EXPECT_HAS(e, "optimizer.type");
  EXPECT_HAS(e, "supported: Adam, AdamW, Adagrad, Lion");
  e = Error(R"({"train_batch_size": 1, "optimizer": {"type": "AdamW",
                "params": {"max_grad_norm": 1.0}}})");
  EXPECT_HAS(e, "optimizer.params.max_grad_norm");
  EXPECT_HAS(e, "gradient_clipping");
  e = Error(R"({"train_batch_size": 1, "optimizer": {"type": "AdamW",
                "params": {"amsgrad": true}}})");
  EXPECT_HAS(e, "optimizer.params.amsgrad");
  e = Error(R"({"train_batch_size": 1, "optimizer": {"type": "AdamW",
                "params": {"betas": [0.9]}}})");
  EXPECT_HAS(e, "optimizer.params.betas: expected [beta1, beta2]");
  e = Error(R"({"train_batch_size": 1, "optimizer": {"type": "AdamW",
                "params": {"lr_decay": 0.1}}})");
  EXPECT_HAS(e, "optimizer.params.lr_decay: unknown key");
  e = Error(R"({"train_batch_size": 1, "optimizer": {"type": "AdamW",
                "params": {"weight_decya": 0.1}}})");
  EXPECT_HAS(e, "did you mean \"weight_decay\"");
}

TEST(ConfigTest, HuggingFaceAutoResolved) {
  const std::string text = R"({
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                              "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto",
        "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}
  })";
  ParseOptions options;
  options.world_size = 2;
  AutoValues& av = options.auto_values;
  av.train_micro_batch_size_per_gpu = 4;
  av.gradient_accumulation_steps = 3;
  av.gradient_clipping = 0.5;
  av.fp16 = false;
  av.bf16 = true;
  av.lr = 2e-5;
  av.betas = std::make_pair(0.9, 0.98);
  av.eps = 1e-6;
  av.weight_decay = 0.01;
  av.warmup_num_steps = 10;
  av.total_num_steps = 100;
  av.hidden_size = 1000;
  Config c = Parse(text, options);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 3);
  EXPECT_EQ(c.train_batch_size, 24);  // derived: 4 * 3 * 2
  EXPECT_EQ(c.gradient_clipping, 0.5);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_DOUBLE_EQ(c.optimizer->lr, 2e-5);
  EXPECT_DOUBLE_EQ(c.optimizer->beta2, 0.98);
  EXPECT_DOUBLE_EQ(c.optimizer->eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.optimizer->weight_decay, 0.01);
  EXPECT_EQ(c.zero.reduce_bucket_size, 1'000'000);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 900'000);
  EXPECT_EQ(c.zero.param_persistence_threshold, 10'000);
  ASSERT_TRUE(c.scheduler);
  EXPECT_EQ(c.scheduler->params["warmup_min_lr"], 0.0);
  EXPECT_EQ(c.scheduler->params["warmup_max_lr"], 2e-5);
  EXPECT_EQ(c.scheduler->params["total_num_steps"], 100);
  auto schedule = MakeLrSchedule(*c.scheduler, c.optimizer->lr);
  ASSERT_TRUE(schedule.ok());
  EXPECT_NEAR((*schedule)->LearningRate(11), 2e-5, 1e-18);
}

TEST(ConfigTest, HuggingFaceAutoWithoutValuesNamesTheFlag) {
  std::string e = Error(R"({"train_micro_batch_size_per_gpu": "auto"})");
  EXPECT_HAS(e,
             "config: train_micro_batch_size_per_gpu: \"auto\" needs the per-device batch size "
             "(give --micro-batch)");
  e = Error(R"({"train_batch_size": "auto"})");
  EXPECT_HAS(e, "train_batch_size: \"auto\" needs");
  e = Error(R"({"train_batch_size": 8, "optimizer": {"type": "adamw", "params": {"lr": "auto"}}})");
  EXPECT_HAS(e, "optimizer.params.lr: \"auto\" needs the learning rate (give --lr)");
  e = Error(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
                "params": {"warmup_num_steps": "auto"}}})");
  EXPECT_HAS(e, "scheduler.params.warmup_num_steps: \"auto\" needs");
  EXPECT_HAS(e, "--warmup-steps");
  e = Error(R"({"train_batch_size": 8, "fp16": {"enabled": "auto"}})");
  EXPECT_HAS(e, "fp16.enabled: \"auto\" needs");
  e = Error(R"({"train_batch_size": 8, "gradient_clipping": "auto"})");
  EXPECT_HAS(e, "gradient_clipping: \"auto\" needs");
  ParseOptions bad_h;
  bad_h.auto_values.hidden_size = 0;
  e = Error(R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": "auto"}})",
            bad_h);
  EXPECT_HAS(e, "zero_optimization.reduce_bucket_size: \"auto\" with hidden_size 0");
  // The hidden size unknown, or "auto" where HF never writes it: DeepSpeed's default, noted.
  Config c = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": "auto",
      "reduce_bucket_size": "auto", "sub_group_size": "auto", "overlap_comm": "auto"},
      "aio": {"queue_depth": "auto"}})");
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(c.zero.sub_group_size, 1'000'000'000);
  EXPECT_EQ(c.aio.queue_depth, 8);
  std::string all;
  for (const auto& line : c.auto_resolved) all += line + "\n";
  EXPECT_EQ(c.auto_resolved.size(), 5u) << all;
  EXPECT_HAS(all, "zero_optimization.stage: \"auto\" -> 0 (DeepSpeed's default)");
  EXPECT_HAS(all, "zero_optimization.sub_group_size: \"auto\" -> 1000000000 (DeepSpeed's default)");
  EXPECT_HAS(all, "aio.queue_depth: \"auto\" -> 8");
}

TEST(ConfigTest, CommandDefaultsResolveEveryHuggingFaceAuto) {
  ParseOptions o;
  o.auto_values = DefaultAutoValues();
  o.auto_values.hidden_size = 768;
  o.auto_values.total_num_steps = 50;
  Config c = Parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
      "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
      "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
      "bf16": {"enabled": "auto"},
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                "weight_decay": "auto", "torch_adam": "auto"}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto",
          "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto",
          "warmup_type": "auto"}},
      "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
          "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
          "sub_group_size": 1e9, "stage3_max_live_parameters": "auto"}})",
                   o);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_FALSE(c.bf16.enabled);
  ASSERT_TRUE(c.optimizer.has_value());
  EXPECT_DOUBLE_EQ(c.optimizer->lr, 5e-5);
  EXPECT_DOUBLE_EQ(c.optimizer->beta2, 0.999);
  EXPECT_DOUBLE_EQ(c.optimizer->eps, 1e-8);
  EXPECT_EQ(c.zero.reduce_bucket_size, 768 * 768);
  EXPECT_EQ(c.zero.prefetch_bucket_size, static_cast<int64_t>(0.9 * 768 * 768));
  EXPECT_EQ(c.zero.param_persistence_threshold, 7680);
  ASSERT_TRUE(c.scheduler.has_value());
  EXPECT_EQ(c.scheduler->params["warmup_num_steps"], 0);
  EXPECT_EQ(c.scheduler->params["total_num_steps"], 50);
  EXPECT_FALSE(c.scheduler->params.contains("warmup_type"));  // its default
  std::string all;
  for (const auto& line : c.auto_resolved) all += line + "\n";
  EXPECT_HAS(all, "train_batch_size: \"auto\" -> 8");
  EXPECT_HAS(all, "optimizer.params.lr: \"auto\" -> 5e-05");
  EXPECT_HAS(all, "zero_optimization.reduce_bucket_size: \"auto\" -> 589824 (hidden_size^2");
  EXPECT_HAS(all, "scheduler.params.warmup_max_lr: \"auto\" -> 5e-05");
  EXPECT_HAS(all, "fp16.enabled: \"auto\" -> false");
}

TEST(ConfigTest, GivenValuesFillAbsentKeysAndMustMatchExplicitOnes) {
  ParseOptions o;
  o.auto_values = DefaultAutoValues();
  o.given.lr = 1e-4;
  o.given.train_micro_batch_size_per_gpu = 4;
  o.given.bf16 = true;
  Config c = Parse(R"({"optimizer": {"type": "AdamW", "params": {"weight_decay": 0.1}}})", o);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_DOUBLE_EQ(c.optimizer->lr, 1e-4);
  EXPECT_TRUE(c.bf16.enabled);
  // A section without "enabled": the flag fills it too.
  c = Parse(R"({"bf16": {"immediate_grad_update": false}})", o);
  EXPECT_TRUE(c.bf16.enabled);
  std::string e = Error(R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": false},
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}})",
                        o);
  EXPECT_HAS(e, "3 problems");
  EXPECT_HAS(e, "train_micro_batch_size_per_gpu: the config says 2, --micro-batch says 4");
  EXPECT_HAS(e, "optimizer.params.lr: the config says 0.0003, --lr says 0.0001");
  EXPECT_HAS(e, "bf16.enabled: the config says false, --bf16 says true");
}

TEST(ConfigTest, NoOptimizerSectionIsHuggingFacesAdamW) {
  ParseOptions o;
  o.auto_values = DefaultAutoValues();
  Config c = Parse(R"({"train_micro_batch_size_per_gpu": 2})", o);
  ASSERT_TRUE(c.optimizer.has_value());
  EXPECT_EQ(c.optimizer->type, cpu_optimizer::OptimizerType::kAdamW);
  EXPECT_DOUBLE_EQ(c.optimizer->lr, 5e-5);
  EXPECT_DOUBLE_EQ(c.optimizer->weight_decay, 0.0);
  // Without caller values (the library): no optimizer, the engine's default.
  EXPECT_FALSE(Parse(R"({"train_micro_batch_size_per_gpu": 2})").optimizer.has_value());
  // No batch key at all: the caller's micro-batch, with a warning.
  c = Parse(R"({"zero_optimization": {"stage": 2}})", o);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
}

TEST(ConfigTest, OnePassReportsEveryProblem) {
  std::string e = Error(R"({"train_batch_size": 8, "zero_optimisation": {},
      "aio": {"queue_dept": 8, "block_size": 1000},
      "fp16": {"loss_scale_windows": 10, "hysteresis": 0},
      "optimizer": {"type": "AdamW", "params": {"lr": -1, "betas": [0.9]}},
      "steps_per_print": "often"})",
                        {.source = "x.json"});
  EXPECT_HAS(e, "x.json: 8 problems:");
  EXPECT_HAS(e, "\n  x.json: zero_optimisation: unknown key (did you mean \"zero_optimization\"?)");
  EXPECT_HAS(e, "\n  x.json: aio.queue_dept: unknown key");
  EXPECT_HAS(e, "\n  x.json: aio.block_size: expected an integer 4096..");
  EXPECT_HAS(e, "\n  x.json: fp16.loss_scale_windows: unknown key");
  EXPECT_HAS(e, "\n  x.json: fp16.hysteresis: expected an integer 1..");
  EXPECT_HAS(e, "\n  x.json: optimizer.params.lr");
  EXPECT_HAS(e, "\n  x.json: optimizer.params.betas: expected [beta1, beta2]");
  EXPECT_HAS(e, "\n  x.json: steps_per_print");
}

TEST(ConfigTest, DeprecatedAndDegenerateValuesAreMapped) {
  Config c = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
      "cpu_offload": true, "cpu_offload_use_pin_memory": true}})");
  EXPECT_EQ(c.zero.offload_optimizer.device, Home::kCpu);
  EXPECT_TRUE(c.zero.offload_optimizer.pin_memory);
  std::string all;
  for (const auto& w : c.warnings) all += w + "\n";
  EXPECT_HAS(all, "zero_optimization.cpu_offload: deprecated; read as offload_optimizer");
  c = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "cpu_offload": true, "cpu_offload_param": true}})");
  EXPECT_EQ(c.zero.offload_param.device, Home::kCpu);
  EXPECT_EQ(c.zero.offload_optimizer.device, Home::kCpu);
  std::string e = Error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
      "cpu_offload": true, "offload_optimizer": {"device": "cpu"}}})");
  EXPECT_HAS(e, "zero_optimization.cpu_offload: given together");
  c = Parse(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "cpu_offload_param": true}})");
  EXPECT_EQ(c.zero.offload_param.device, Home::kDevice);  // ignored below stage 3, as DeepSpeed
  c = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "sub_group_size": 0}})");
  EXPECT_GT(c.zero.sub_group_size, int64_t{1} << 40);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_HAS(c.warnings[0], "sub_group_size: 0");
  c = Parse(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
      "params": {"warmup_num_steps": 0}}})");
  ASSERT_TRUE(c.scheduler.has_value());
  // What DeepSpeed ignores or reinterprets below stage 3, and its oldest boolean form.
  c = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
      "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "nvme",
      "nvme_path": "/nonexistent/never/created"}}})");
  EXPECT_EQ(c.zero.offload_param.device, Home::kDevice);
  EXPECT_EQ(c.zero.offload_optimizer.device, Home::kCpu);
  EXPECT_EQ(c.warnings.size(), 2u);
  c = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 0,
      "offload_optimizer": {"device": "cpu"}}})");
  EXPECT_EQ(c.zero.offload_optimizer.device, Home::kDevice);
  c = Parse(R"({"train_batch_size": 8, "zero_optimization": true})");
  EXPECT_EQ(c.zero.stage, 1);
  c = Parse(R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 0}})");
  EXPECT_EQ(c.zero.reduce_bucket_size, 0);
  // Comments, as DeepSpeed's hjson reader allows them.
  c = Parse("{\"train_batch_size\": 8, // the global batch\n /* block */ \"steps_per_print\": 3}");
  EXPECT_EQ(c.steps_per_print, 3);
}

TEST(ConfigTest, StrictDeepSpeedSectionsStrataIgnoresStillRefuseUnknownKeys) {
  std::string e =
      Error(R"({"train_batch_size": 8, "compile": {"disable": false, "backend": "inductor"}})");
  EXPECT_HAS(e, "compile.backend: unknown key");
  EXPECT_HAS(e, "compile.disable: unknown key");
  e = Error(R"({"train_batch_size": 8, "tensorboard": {"enabled": true, "output_pth": "x"}})");
  EXPECT_HAS(e, "tensorboard.output_pth: unknown key (did you mean \"output_path\"?)");
  e = Error(R"({"train_batch_size": 8, "bf16": {"enabled": true, "hysteresis": 2}})");
  EXPECT_HAS(e, "bf16.hysteresis: unknown key");
  e = Error(R"({"train_batch_size": 8, "fp16": {"enabled": true, "min_loss_scale": 1e-10}})");
  EXPECT_HAS(e, "fp16.min_loss_scale: expected an integer >= 1");
  e = Error(R"({"train_batch_size": 8, "fp16": {"enabled": true, "opt_level": "O2"}})");
  EXPECT_HAS(e, "fp16.opt_level: unknown key");
  Config c = Parse(R"({"train_batch_size": 8, "comms_logger": {"enabled": true, "prof_ops": []},
      "bf16": {"enabled": true, "check_grad_overflow": false}})");
  EXPECT_TRUE(c.bf16.enabled);
}

TEST(ConfigTest, UnknownKeysSuggestTheNearest) {
  ParseOptions options{.source = "config.json"};
  std::string e = Error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "offload_param": {"devise": "cpu"}}})",
                        options);
  EXPECT_EQ(e,
            "config.json: zero_optimization.offload_param.devise: unknown key (did you mean "
            "\"device\"?)");
  e = Error(R"({"train_batch_size": 8, "zero_optimisation": {}})", options);
  EXPECT_HAS(e,
             "config.json: zero_optimisation: unknown key (did you mean \"zero_optimization\"?)");
  e = Error(R"({"train_batch_size": 8, "aio": {"queue_dept": 8}})");
  EXPECT_HAS(e, "aio.queue_dept: unknown key (did you mean \"queue_depth\"?)");
  e = Error(R"({"train_batch_size": 8, "zero_optimization": {"stage3_prefetch_bucket": 1}})");
  EXPECT_HAS(e, "did you mean \"stage3_prefetch_bucket_size\"");
  e = Error(R"({"train_batch_size": 8, "fp16": {"loss_scale_windows": 10}})");
  EXPECT_HAS(e, "fp16.loss_scale_windows: unknown key (did you mean \"loss_scale_window\"?)");
  // Far from every DeepSpeed key: ignored with a warning, as DeepSpeed ignores it.
  Config c = Parse(R"({"train_batch_size": 8, "completely_unrelated_thing": 1,
      "monitor_config": {"enabled": false}, "comms_logger": {"enabled": true}})");
  ASSERT_EQ(c.warnings.size(), 2u);
  EXPECT_HAS(c.warnings[0], "accepted but ignored by strata: comms_logger, monitor_config");
  EXPECT_HAS(c.warnings[1], "not DeepSpeed config keys, ignored");
  EXPECT_HAS(c.warnings[1], "completely_unrelated_thing");
}

// strata's own section: swap_checksums on by default, off when asked; checked key by key.
// bf16.bf16_optimizer_states (DeepSpeed's bf16 moments): read with bf16 enabled (either section
// name), ignored with a warning without it, and checked like any boolean.
TEST(ConfigTest, Bf16OptimizerStates) {
  EXPECT_FALSE(
      Parse(R"({"train_batch_size": 8, "bf16": {"enabled": true}})").bf16.optimizer_states);
  Config on =
      Parse(R"({"train_batch_size": 8, "bf16": {"enabled": true, "bf16_optimizer_states": true}})");
  EXPECT_TRUE(on.bf16.optimizer_states);
  EXPECT_TRUE(on.warnings.empty()) << on.warnings[0];
  EXPECT_TRUE(Parse(R"({"train_batch_size": 8,
                        "bfloat16": {"enabled": true, "bf16_optimizer_states": true}})")
                  .bf16.optimizer_states);
  Config off = Parse(
      R"({"train_batch_size": 8, "bf16": {"enabled": false, "bf16_optimizer_states": true}})");
  EXPECT_FALSE(off.bf16.optimizer_states);
  ASSERT_EQ(off.warnings.size(), 1u);
  EXPECT_NE(off.warnings[0].find("bf16.bf16_optimizer_states: ignored"), std::string::npos)
      << off.warnings[0];
  ParseOptions options{.source = "ds.json"};
  EXPECT_EQ(Error(R"({"train_batch_size": 8, "bf16": {"enabled": true,
                      "bf16_optimizer_states": "yes"}})",
                  options),
            "ds.json: bf16.bf16_optimizer_states: expected true or false, got \"yes\"");
}

TEST(ConfigTest, StrataSectionSwapChecksums) {
  EXPECT_TRUE(Parse(R"({"train_batch_size": 8})").strata.swap_checksums);
  EXPECT_TRUE(Parse(R"({"train_batch_size": 8, "strata": {}})").strata.swap_checksums);
  EXPECT_TRUE(Parse(R"({"train_batch_size": 8, "strata": {"swap_checksums": null}})")
                  .strata.swap_checksums);
  Config off = Parse(R"({"train_batch_size": 8, "strata": {"swap_checksums": false}})");
  EXPECT_FALSE(off.strata.swap_checksums);
  EXPECT_TRUE(off.warnings.empty()) << off.warnings[0];  // a section strata reads: no warning
  EXPECT_TRUE(Parse(R"({"train_batch_size": 8, "strata": {"swap_checksums": true}})")
                  .strata.swap_checksums);

  ParseOptions options{.source = "ds.json"};
  EXPECT_EQ(Error(R"({"train_batch_size": 8, "strata": {"swap_checksum": false}})", options),
            "ds.json: strata.swap_checksum: unknown key (did you mean \"swap_checksums\"?)");
  EXPECT_EQ(Error(R"({"train_batch_size": 8, "strata": {"swap_checksums": "no"}})", options),
            "ds.json: strata.swap_checksums: expected true or false, got \"no\"");
  EXPECT_EQ(Error(R"({"train_batch_size": 8, "strata": {"swap_checksums": "auto"}})", options),
            "ds.json: strata.swap_checksums: expected true or false, got \"auto\"");
  EXPECT_EQ(Error(R"({"train_batch_size": 8, "strata": true})", options),
            "ds.json: strata: expected an object, got true");
  EXPECT_HAS(Error(R"({"train_batch_size": 8, "strat": {}})"),
             "strat: unknown key (did you mean \"strata\"?)");
}

TEST(ConfigTest, WrongTypesAndRanges) {
  std::string e = Error(R"({"train_batch_size": 8, "zero_optimization": {"stage": "three"}})",
                        {.source = "c.json"});
  EXPECT_EQ(e, "c.json: zero_optimization.stage: expected an integer 0..3, got \"three\"");
  e = Error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 4}})");
  EXPECT_HAS(e, "zero_optimization.stage: expected an integer 0..3, got 4");
  e = Error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                "offload_param": {"device": "gpu"}}})");
  EXPECT_HAS(e, "zero_optimization.offload_param.device: expected \"none\", \"cpu\" or \"nvme\"");
  e = Error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                "offload_param": {"device": "cpu", "buffer_count": 0}}})");
  EXPECT_HAS(e, "zero_optimization.offload_param.buffer_count: expected an integer >= 1, got 0");
  e = Error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
                "offload_optimizer": {"device": "cpu", "buffer_count": -1}}})");
  EXPECT_HAS(e, "zero_optimization.offload_optimizer.buffer_count: expected an integer >= 1");
  e = Error(R"({"train_batch_size": 8, "zero_optimization": {"contiguous_gradients": "yes"}})");
  EXPECT_HAS(e, "zero_optimization.contiguous_gradients: expected true or false, got \"yes\"");
  e = Error(R"({"train_batch_size": 8, "zero_optimization": {"sub_group_size": 1.25}})");
  EXPECT_HAS(e, "zero_optimization.sub_group_size: expected an integer >= 0, got 1.25");
  e = Error(R"({"train_batch_size": 8, "aio": {"block_size": 1000}})");
  EXPECT_HAS(e, "aio.block_size");
  e = Error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                "offload_optimizer": {"device": "cpu", "ratio": 1.5}}})");
  EXPECT_HAS(e, "zero_optimization.offload_optimizer.ratio: expected a number in [0, 1]");
  e = Error(R"({"train_batch_size": 8, "zero_optimization": []})");
  EXPECT_HAS(e, "zero_optimization: expected an object");
  e = Error(R"({"train_batch_size": 8,)");
  EXPECT_HAS(e, "not valid JSON");
  e = Error(R"([1, 2])");
  EXPECT_HAS(e, "expected a JSON object");
}

TEST(ConfigTest, Contradictions) {
  std::string e = Error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                "offload_param": {"device": "nvme"}}})");
  EXPECT_HAS(e, "zero_optimization.offload_param.nvme_path: required when device is \"nvme\"");
  e = Error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                "offload_optimizer": {"device": "nvme"}}})");
  EXPECT_HAS(e, "zero_optimization.offload_optimizer.nvme_path: required");
  e = Error(R"({"train_batch_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true}})");
  EXPECT_HAS(e, "fp16 and bf16 are both enabled");
  e = Error(R"({"train_batch_size": 8, "fp16": {"enabled": true},
                "bfloat16": {"enabled": true}})");
  EXPECT_HAS(e, "fp16 and bf16 are both enabled");
  e = Error(R"({"train_batch_size": 8, "aio": {"thread_count": 2, "intra_op_parallelism": 4}})");
  EXPECT_HAS(e, "aio.thread_count: 2 contradicts aio.intra_op_parallelism 4");
  e = Error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                "stage3_max_live_parameters": 1, "max_live_parameters": 2}})");
  EXPECT_HAS(e, "alias");
}

TEST(ConfigTest, NvmePathIsCreatedOrRefused) {
  ScratchDir dir;
  const std::string nested = dir.str() + "/a/b/c";
  Config c = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme", "nvme_path": ")" +
                   nested + R"("}}})");
  EXPECT_TRUE(fs::is_directory(nested));
  // A path below a regular file cannot be created: the error names the path and the errno.
  const std::string file = dir.str() + "/file";
  std::ofstream(file) << "x";
  std::string e = Error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme", "nvme_path": ")" +
                        file + R"(/sub"}}})");
  EXPECT_HAS(e, "zero_optimization.offload_param.nvme_path: cannot create directory");
  EXPECT_HAS(e, file + "/sub");
  EXPECT_HAS(e, "errno");
  e = Error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme", "nvme_path": ")" +
            file + R"("}}})");
  EXPECT_HAS(e, "is not a directory");
  if (::geteuid() != 0) {  // root may write anywhere
    const std::string locked = dir.str() + "/locked";
    fs::create_directories(locked);
    fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
    e = Error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
        "offload_param": {"device": "nvme", "nvme_path": ")" +
              locked + R"("}}})");
    EXPECT_HAS(e, "is not writable");
    fs::permissions(locked, fs::perms::owner_all);
  }
}

TEST(ConfigTest, NumbersIn1e9Forms) {
  Config c = Parse(R"({"train_batch_size": "8", "zero_optimization": {"stage": 3,
      "sub_group_size": 1e9, "reduce_bucket_size": "5e8", "stage3_prefetch_bucket_size": 5E7,
      "stage3_max_live_parameters": "1e9", "stage3_max_reuse_distance": 1000000000.0},
      "fp16": {"enabled": true, "min_loss_scale": "2", "loss_scale_window": 5e2}})");
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.zero.sub_group_size, 1'000'000'000);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(c.zero.max_live_parameters, 1'000'000'000);
  EXPECT_EQ(c.zero.max_reuse_distance, 1'000'000'000);
  EXPECT_EQ(c.fp16.min_loss_scale, 2);
  EXPECT_EQ(c.fp16.loss_scale_window, 500);
  std::string e =
      Error(R"({"train_batch_size": 8, "zero_optimization": {"sub_group_size": "1e9x"}})");
  EXPECT_HAS(e, "zero_optimization.sub_group_size: expected an integer >= 0, got \"1e9x\"");
  e = Error(R"({"train_batch_size": 8, "zero_optimization": {"sub_group_size": 1e30}})");
  EXPECT_HAS(e, "zero_optimization.sub_group_size");
}

TEST(ConfigTest, BatchDerivationAllCombinations) {
  auto batch = [](const std::string& keys, int world) {
    ParseOptions o;
    o.world_size = world;
    Config c = Parse("{" + keys + "}", o);
    return std::make_tuple(c.train_batch_size, c.train_micro_batch_size_per_gpu,
                           c.gradient_accumulation_steps);
  };
  using T = std::tuple<int64_t, int64_t, int64_t>;
  EXPECT_EQ(batch(R"("train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                     "gradient_accumulation_steps": 4)",
                  2),
            T(32, 4, 4));
  EXPECT_EQ(batch(R"("train_batch_size": 32, "train_micro_batch_size_per_gpu": 4)", 2),
            T(32, 4, 4));
  EXPECT_EQ(batch(R"("train_batch_size": 32, "gradient_accumulation_steps": 8)", 2), T(32, 2, 8));
  EXPECT_EQ(batch(R"("train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5)", 2),
            T(30, 3, 5));
  EXPECT_EQ(batch(R"("train_batch_size": 12)", 3), T(12, 4, 1));
  EXPECT_EQ(batch(R"("train_micro_batch_size_per_gpu": 6)", 2), T(12, 6, 1));
  EXPECT_EQ(batch(R"("train_batch_size": 12, "gradient_accumulation_steps": null)", 1),
            T(12, 12, 1));

  std::string e = Error(R"({"steps_per_print": 5})");
  EXPECT_HAS(e, "set train_batch_size or train_micro_batch_size_per_gpu");
  e = Error(R"({"gradient_accumulation_steps": 4})");
  EXPECT_HAS(e, "set train_batch_size or train_micro_batch_size_per_gpu");
  e = Error(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4,
                "gradient_accumulation_steps": 4})");
  EXPECT_HAS(e, "30 == 4 * 4 * 1 = 16");
  e = Error(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})");
  EXPECT_HAS(e, "gradient_accumulation_steps: cannot derive");
  EXPECT_HAS(e, "4 * 1 = 4");
  e = Error(R"({"train_batch_size": 30, "gradient_accumulation_steps": 4})");
  EXPECT_HAS(e, "train_micro_batch_size_per_gpu: cannot derive");
  e = Error(R"({"train_batch_size": 0})");
  EXPECT_HAS(e, "train_batch_size: expected an integer 1..1099511627776, got 0");
  // Bounded so the engine's int counts never narrow (2^31 accumulation steps trained nothing).
  e = Error(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2147483648})");
  EXPECT_HAS(e, "gradient_accumulation_steps: expected an integer 1..1073741824, got 2147483648");
  e = Error(R"({"train_batch_size": 1099511627776, "gradient_accumulation_steps": 1})");
  EXPECT_HAS(e, "expected train_batch_size <= 2^40 and the other two <= 2^30");
}

TEST(ConfigTest, WarningsForAliasesAndIgnoredKeys) {
  Config c = Parse(R"({"train_batch_size": 8, "tensorboard": {"enabled": true},
      "aio": {"thread_count": 4}, "zero_optimization": {"stage": 2, "reduce_scatter": true,
      "allgather_bucket_size": 5e8}, "zero_allow_untested_optimizer": true})");
  EXPECT_EQ(c.aio.intra_op_parallelism, 4);
  ASSERT_EQ(c.warnings.size(), 3u);
  std::string all;
  for (const auto& w : c.warnings) all += w + "\n";
  EXPECT_HAS(all, "aio.thread_count: legacy name, read as aio.intra_op_parallelism = 4");
  EXPECT_HAS(all, "accepted but ignored by strata: tensorboard, zero_allow_untested_optimizer");
  EXPECT_HAS(all,
             "accepted but ignored by strata: zero_optimization.allgather_bucket_size, "
             "zero_optimization.reduce_scatter");
  // Same value under both names: accepted with the warning.
  c = Parse(R"({"train_batch_size": 8, "aio": {"thread_count": 2, "intra_op_parallelism": 2}})");
  EXPECT_EQ(c.aio.intra_op_parallelism, 2);
  EXPECT_EQ(c.warnings.size(), 1u);
  // Every listed ignored key is accepted where it lives, with one warning naming it.
  for (std::string_view key : IgnoredKeys()) {
    nlohmann::json nested = {{"train_batch_size", 8}};
    if (key.starts_with("optimizer.")) nested["optimizer"]["type"] = "adam";
    nlohmann::json* node = &nested;
    std::string_view rest = key;
    for (size_t dot; (dot = rest.find('.')) != std::string_view::npos;
         rest.remove_prefix(dot + 1)) {
      node = &(*node)[std::string(rest.substr(0, dot))];
    }
    (*node)[std::string(rest)] = true;
    Config ci = Parse(nested.dump());
    ASSERT_EQ(ci.warnings.size(), 1u) << key;
    EXPECT_HAS(ci.warnings[0], "accepted but ignored");
    EXPECT_HAS(ci.warnings[0], std::string(key));
  }
  for (std::string_view key : IgnoredSections()) {
    nlohmann::json j = {{"train_batch_size", 8}, {std::string(key), nlohmann::json::object()}};
    Config ci = Parse(j.dump());
    ASSERT_EQ(ci.warnings.size(), 1u) << key;
    EXPECT_HAS(ci.warnings[0], "accepted but ignored by strata: " + std::string(key));
  }
}

TEST(ConfigTest, SchedulerValidatedAtParse) {
  std::string e = Error(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
      "params": {"warmup_max": 0.1}}})");
  EXPECT_HAS(e,
             "config: scheduler.params.warmup_max: unknown key (did you mean \"warmup_max_lr\"?)");
  e = Error(R"({"train_batch_size": 8, "scheduler": {"type": "Cosine"}})");
  EXPECT_HAS(e, "scheduler.type");
  Config c = Parse(R"({"train_batch_size": 8, "optimizer": {"type": "adamw",
      "params": {"lr": 0.25}}, "scheduler": {"type": "WarmupLR"}})");
  ASSERT_TRUE(c.scheduler);
  auto s = MakeLrSchedule(*c.scheduler, c.optimizer->lr);
  ASSERT_TRUE(s.ok());
  EXPECT_DOUBLE_EQ((*s)->LearningRate(5000), 0.25);
}

TEST(ConfigTest, LoadConfigFileNamesThePath) {
  ScratchDir dir;
  fs::create_directories(dir.str());
  const std::string path = dir.str() + "/ds.json";
  std::ofstream(path) << R"({"train_batch_size": 8, "zero_optimization": {"stag": 1}})";
  auto c = LoadConfigFile(path);
  ASSERT_FALSE(c.ok());
  EXPECT_HAS(std::string(c.status().message()), path + ": zero_optimization.stag: unknown key");
  auto missing = LoadConfigFile(dir.str() + "/nope.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(ConfigTest, EditDistance) {
  EXPECT_EQ(EditDistance("devise", "device"), 1u);
  EXPECT_EQ(EditDistance("", "abc"), 3u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
}

// Hugging Face's schedule from the flags when the config has no scheduler section.
ParseOptions ScheduleFlags(int64_t total) {
  ParseOptions o;
  o.auto_values = DefaultAutoValues();
  o.auto_values.total_num_steps = total;
  return o;
}

TEST(ConfigTest, ScheduleFlagsWithoutASchedulerSection) {
  ParseOptions o = ScheduleFlags(40);
  o.given.lr_scheduler_type = "cosine";
  o.given.warmup_ratio = 0.1;
  Config c = Parse(R"({"train_batch_size": 8})", o);
  ASSERT_TRUE(c.scheduler);
  EXPECT_EQ(c.scheduler->type, "cosine");
  EXPECT_EQ(c.scheduler->params["num_warmup_steps"], 4);  // ceil(0.1 × 40)
  EXPECT_EQ(c.scheduler->params["num_training_steps"], 40);
  EXPECT_EQ(c.scheduler->params["num_cycles"], 0.5);
  ASSERT_TRUE(c.strata.lr_scheduler);
  EXPECT_EQ(*c.strata.lr_scheduler, (nlohmann::json{{"type", "cosine"}, {"warmup_ratio", 0.1}}));

  // TrainingArguments.get_warmup_steps: math.ceil of the double product, as Python computes it
  // (25 × 0.28 is 7.000000000000001 there, so 8 steps).
  o = ScheduleFlags(25);
  o.given.lr_scheduler_type = "linear";
  o.given.warmup_ratio = 0.28;
  EXPECT_EQ(Parse(R"({"train_batch_size": 8})", o).scheduler->params["num_warmup_steps"], 8);
  // warmup_steps > 0 wins over the ratio, with a warning; 0 leaves it to the ratio.
  o.given.warmup_num_steps = 2;
  c = Parse(R"({"train_batch_size": 8})", o);
  EXPECT_EQ(c.scheduler->params["num_warmup_steps"], 2);
  std::string warnings;
  for (const std::string& w : c.warnings) warnings += w + "\n";
  EXPECT_HAS(warnings, "--warmup-steps 2 overrides --warmup-ratio 0.28");
  o.given.warmup_num_steps = 0;
  EXPECT_EQ(Parse(R"({"train_batch_size": 8})", o).scheduler->params["num_warmup_steps"], 8);

  // --warmup-steps alone: linear, Hugging Face's default, said so.
  o = ScheduleFlags(12);
  o.given.warmup_num_steps = 3;
  c = Parse(R"({"train_batch_size": 8})", o);
  ASSERT_TRUE(c.scheduler);
  EXPECT_EQ(c.scheduler->type, "linear");
  EXPECT_HAS(c.scheduler->origin, "default lr_scheduler_type");
  EXPECT_HAS(DescribeLrSchedule(c.scheduler, 5e-5), "linear (");
  EXPECT_HAS(DescribeLrSchedule(c.scheduler, 5e-5), "3 warmup steps of 12, peak 5e-05");

  // No flag and no section: no schedule (constant lr), as before.
  c = Parse(R"({"train_batch_size": 8})", ScheduleFlags(12));
  EXPECT_FALSE(c.scheduler);
  EXPECT_FALSE(c.strata.lr_scheduler);
}

TEST(ConfigTest, ScheduleFlagsMinLr) {
  ParseOptions o = ScheduleFlags(10);
  o.given.lr_scheduler_type = "cosine_with_min_lr";
  std::string e = Error(R"({"train_batch_size": 8})", o);
  EXPECT_HAS(e, "cosine_with_min_lr needs --min-lr or --min-lr-rate");
  o.given.min_lr = 1e-6;
  Config c = Parse(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW",
      "params": {"lr": 1e-4}}})",
                   o);
  ASSERT_TRUE(c.scheduler);
  EXPECT_EQ(c.scheduler->params["min_lr"], 1e-6);
  auto s = MakeLrSchedule(*c.scheduler, c.optimizer->lr);
  ASSERT_TRUE(s.ok());
  EXPECT_DOUBLE_EQ((*s)->LearningRate(10), 1e-6);
  o.given.lr_scheduler_type = "linear";
  e = Error(R"({"train_batch_size": 8})", o);
  EXPECT_HAS(e, "--min-lr: for --lr-scheduler cosine_with_min_lr only; the schedule is linear");
}

TEST(ConfigTest, ScheduleFlagsAgainstASchedulerSection) {
  const std::string section = R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
      "params": {"warmup_num_steps": "auto"}}})";
  ParseOptions o = ScheduleFlags(20);
  o.given.lr_scheduler_type = "cosine";
  std::string e = Error(section, o);
  EXPECT_HAS(e,
             "scheduler: the config's WarmupLR section decides the schedule, and "
             "--lr-scheduler cosine asks for Hugging Face's");
  // The warmup flags answer the section's "auto", as HF's Trainer does (ratio included).
  o = ScheduleFlags(20);
  o.given.warmup_ratio = 0.25;
  Config c = Parse(section, o);
  ASSERT_TRUE(c.scheduler);
  EXPECT_EQ(c.scheduler->type, "WarmupLR");
  EXPECT_EQ(c.scheduler->params["warmup_num_steps"], 5);
  EXPECT_FALSE(c.strata.lr_scheduler);
  e = Error(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
      "params": {"warmup_num_steps": 3}}})",
            o);
  EXPECT_HAS(e, "scheduler.params.warmup_num_steps: the config says 3, --warmup-ratio 0.25 says 5");
  // A Hugging Face name in DeepSpeed's section.
  e = Error(R"({"train_batch_size": 8, "scheduler": {"type": "cosine"}})", ScheduleFlags(20));
  EXPECT_HAS(e, "scheduler.type: \"cosine\" is a Hugging Face lr_scheduler_type");
}

TEST(ConfigTest, SavedHuggingFaceScheduleAndTheFlags) {
  // What a checkpoint's config keeps: resumed without flags, the same schedule.
  const std::string saved = R"({"train_batch_size": 8,
      "strata": {"lr_scheduler": {"type": "cosine", "warmup_steps": 3}}})";
  Config c = Parse(saved, ScheduleFlags(12));
  ASSERT_TRUE(c.scheduler);
  EXPECT_EQ(c.scheduler->type, "cosine");
  EXPECT_EQ(c.scheduler->params["num_warmup_steps"], 3);
  EXPECT_EQ(c.scheduler->params["num_training_steps"], 12);
  // Flags that agree are fine; flags that do not are refused naming both.
  ParseOptions o = ScheduleFlags(12);
  o.given.lr_scheduler_type = "cosine";
  o.given.warmup_ratio = 0.25;  // ceil(0.25 × 12) = 3
  EXPECT_TRUE(ParseConfig(saved, o).ok());
  o.given.lr_scheduler_type = "linear";
  std::string e = Error(saved, o);
  EXPECT_HAS(e,
             "strata.lr_scheduler.type: the config says \"cosine\", --lr-scheduler says "
             "\"linear\"");
  o = ScheduleFlags(12);
  o.given.warmup_num_steps = 4;
  e = Error(saved, o);
  EXPECT_HAS(e,
             "strata.lr_scheduler: the config warms up for 3 steps, "
             "--warmup-steps/--warmup-ratio for 4");
  e = Error(R"({"train_batch_size": 8, "strata": {"lr_scheduler": {"type": "cosin"}}})",
            ScheduleFlags(12));
  EXPECT_HAS(e, "did you mean \"cosine\"");
  e = Error(R"({"train_batch_size": 8, "strata": {"lr_scheduler": {"warmup_step": 3}}})",
            ScheduleFlags(12));
  EXPECT_HAS(e, "strata.lr_scheduler.warmup_step: unknown key");
  e = Error(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR"},
      "strata": {"lr_scheduler": {"type": "cosine"}}})",
            ScheduleFlags(12));
  EXPECT_HAS(e, "strata.lr_scheduler: given together with a scheduler section (WarmupLR)");
}

}  // namespace
}  // namespace strata::runtime
