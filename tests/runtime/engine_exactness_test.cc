// Exactness of offload: the same fp32 training run gives the same losses and final parameters in
// every mode as plain libtorch (torch::optim::AdamW, loss / gas per micro-batch, .grad
// accumulation). Bitwise, except with gradient clipping: both sides clip as DeepSpeed does
// (coefficient 1/((norm + 1e-6)/max_norm), norm summed in double), but the engine sums squares per
// flat sub-group with SIMD lanes and the reference per tensor, so the double sums may differ in
// the last bits and, rarely, the fp32 coefficient by one ulp; a 1-ulp difference compounds over
// 20 steps to ~1e-7 relative. So clipping runs compare at 1e-6 of each tensor's largest value.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/gpt.h"

namespace strata::runtime {
namespace {

constexpr int kSteps = 20;

GptOptions TinyGpt(int layers = 3) {
  GptOptions o;
  o.n_layers = layers;
  o.d_model = 32;
  o.n_heads = 4;
  o.seq_len = 16;
  return o;
}

struct Batch {
  torch::Tensor x, y;
};

std::vector<Batch> MakeData(int n) {
  torch::manual_seed(1234);
  std::vector<Batch> data;
  for (int i = 0; i < n; ++i) {
    auto seq = torch::randint(0, 256, {2, 17}, torch::kLong);
    data.push_back({seq.narrow(1, 0, 16).contiguous(), seq.narrow(1, 1, 16).contiguous()});
  }
  return data;
}

struct RunResult {
  std::vector<float> losses;
  std::vector<std::pair<std::string, torch::Tensor>> params;
  TierTelemetry telemetry;
};

cpu_optimizer::OptimizerOptions AdamW() {
  cpu_optimizer::OptimizerOptions o;
  o.type = cpu_optimizer::OptimizerType::kAdamW;
  o.lr = 3e-3;
  o.weight_decay = 0.01;
  o.threads = 1;
  return o;
}

// Plain libtorch: the reference.
RunResult RunPlain(int gas, double clip) {
  torch::manual_seed(0);
  Gpt model(TinyGpt());
  auto data = MakeData(kSteps * gas);
  torch::optim::AdamW optim(model->parameters(),
                            torch::optim::AdamWOptions(3e-3).weight_decay(0.01));
  RunResult r;
  for (int step = 0; step < kSteps; ++step) {
    for (int m = 0; m < gas; ++m) {
      const Batch& b = data[step * gas + m];
      auto loss = model->Loss(b.x, b.y);
      r.losses.push_back(loss.item<float>());
      (gas > 1 ? loss / static_cast<double>(gas) : loss).backward();
    }
    if (clip > 0) {  // DeepSpeed's formula: coefficient 1 / ((norm + 1e-6) / clip) when > 1
      double total = 0;
      for (const auto& p : model->parameters())
        total += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
      const double c = (std::sqrt(total) + 1e-6) / clip;
      torch::NoGradGuard no_grad;
      if (c > 1) {
        for (auto& p : model->parameters()) p.mutable_grad().mul_(1.0 / c);
      }
    }
    optim.step();
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  }
  for (const auto& item : model->named_parameters())
    r.params.emplace_back(item.key(), item.value().detach().clone());
  return r;
}

class EngineExactnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-engine-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  EngineOptions Options(Home params, Home optimizer) {
    EngineOptions o;
    o.params = params;
    o.optimizer = optimizer;
    o.param_nvme_path = dir_;
    o.optimizer_nvme_path = dir_;
    o.optimizer_options = AdamW();
    o.persistence_threshold = 100;  // LayerNorm and qkv/proj biases stay resident
    o.pin_memory = false;
    return o;
  }

  RunResult RunEngine(EngineOptions options, int gas, double clip) {
    options.gradient_accumulation_steps = gas;
    options.gradient_clipping = clip;
    torch::manual_seed(0);
    Gpt model(TinyGpt());
    auto data = MakeData(kSteps * gas);
    auto engine = Engine::Create(model.ptr(), std::move(options));
    EXPECT_TRUE(engine.ok()) << engine.status().ToString();
    RunResult r;
    if (!engine.ok()) return r;
    for (int step = 0; step < kSteps; ++step) {
      for (int m = 0; m < gas; ++m) {
        const Batch& b = data[step * gas + m];
        auto loss = model->Loss(b.x, b.y);
        r.losses.push_back(loss.item<float>());
        Status s = (*engine)->Backward(loss);
        EXPECT_TRUE(s.ok()) << s.ToString();
        s = (*engine)->Step();
        EXPECT_TRUE(s.ok()) << s.ToString();
      }
    }
    EXPECT_EQ((*engine)->global_steps(), kSteps);
    auto values = (*engine)->ParameterValues();
    EXPECT_TRUE(values.ok()) << values.status().ToString();
    if (values.ok()) r.params = std::move(*values);
    r.telemetry = (*engine)->telemetry();
    return r;
  }

  std::string dir_;
};

void ExpectSame(const RunResult& want, const RunResult& got, double rtol) {
  ASSERT_EQ(want.losses.size(), got.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    if (rtol == 0) {
      EXPECT_EQ(want.losses[i], got.losses[i]) << "loss " << i;
    } else {
      EXPECT_NEAR(want.losses[i], got.losses[i], rtol * std::abs(want.losses[i])) << "loss " << i;
    }
  }
  ASSERT_EQ(want.params.size(), got.params.size());
  for (size_t i = 0; i < want.params.size(); ++i) {
    ASSERT_EQ(want.params[i].first, got.params[i].first);
    const auto& a = want.params[i].second;
    const auto& b = got.params[i].second;
    ASSERT_EQ(a.sizes(), b.sizes()) << want.params[i].first;
    if (rtol == 0) {
      EXPECT_TRUE(torch::equal(a, b))
          << want.params[i].first << " max diff " << (a - b).abs().max().item<float>();
    } else {
      const double scale = a.abs().max().item<double>() + 1e-12;
      const double diff = (a - b).abs().max().item<double>();
      EXPECT_LE(diff, rtol * scale) << want.params[i].first;
    }
  }
}

TEST_F(EngineExactnessTest, NoOffloadMatchesPlainTorch) {
  ExpectSame(RunPlain(1, 0), RunEngine(Options(Home::kDevice, Home::kDevice), 1, 0), 0);
}

TEST_F(EngineExactnessTest, OptimizerOnCpuMatchesPlainTorch) {
  ExpectSame(RunPlain(1, 0), RunEngine(Options(Home::kDevice, Home::kCpu), 1, 0), 0);
}

TEST_F(EngineExactnessTest, OptimizerOnNvmeMatchesPlainTorch) {
  ExpectSame(RunPlain(1, 0), RunEngine(Options(Home::kDevice, Home::kNvme), 1, 0), 0);
}

TEST_F(EngineExactnessTest, ParamsAndOptimizerOnCpuMatchPlainTorch) {
  ExpectSame(RunPlain(1, 0), RunEngine(Options(Home::kCpu, Home::kCpu), 1, 0), 0);
}

TEST_F(EngineExactnessTest, ParamsAndOptimizerOnNvmeMatchPlainTorch) {
  auto got = RunEngine(Options(Home::kNvme, Home::kNvme), 1, 0);
  ExpectSame(RunPlain(1, 0), got, 0);
  EXPECT_GT(got.telemetry.pinned_to_nvme, 0u);  // state, gradients and parameters written
}

// Budgets so small that every unit is evicted and fetched again in every pass, and sub-groups
// smaller than a unit.
TEST_F(EngineExactnessTest, TinyBudgetsEvictAndRefetchEveryUnit) {
  EngineOptions o = Options(Home::kNvme, Home::kNvme);
  o.sub_group_size = 1000;
  o.param_buffer_count = 2;
  // Resident parameters plus one unit's block (a unit is ~12.6K fp32 = ~50 KB, padded).
  Gpt probe(TinyGpt());
  uint64_t resident = 0, unit = 0;
  for (const auto& item : probe->named_parameters()) {
    const bool in_unit = item.key().rfind("blocks.", 0) == 0;
    const uint64_t n = item.value().numel();
    if (!in_unit || n <= o.persistence_threshold) resident += n; else if (item.key().rfind("blocks.0.", 0) == 0) unit += n;
  }
  o.device_budget = ((resident * 4 + 4095) / 4096 + (unit * 4 + 4095) / 4096) * 4096;
  auto got = RunEngine(o, 1, 0);
  ExpectSame(RunPlain(1, 0), got, 0);
  // Each step reads every unit twice (forward and backward) from NVMe: 3 units x 2 x 20 steps.
  EXPECT_GE(got.telemetry.nvme_to_pinned, 2ull * 3 * kSteps * unit * 4);
  EXPECT_GT(got.telemetry.evictions, 0u);
}

TEST_F(EngineExactnessTest, GradientAccumulationMatchesPlainTorch) {
  auto want = RunPlain(3, 0);
  ExpectSame(want, RunEngine(Options(Home::kDevice, Home::kCpu), 3, 0), 0);
  ExpectSame(want, RunEngine(Options(Home::kNvme, Home::kNvme), 3, 0), 0);
}

TEST_F(EngineExactnessTest, ClippingMatchesPlainTorchWithinReductionOrder) {
  auto want = RunPlain(2, 0.05);
  ExpectSame(want, RunEngine(Options(Home::kDevice, Home::kDevice), 2, 0.05), 1e-6);
  ExpectSame(want, RunEngine(Options(Home::kNvme, Home::kNvme), 2, 0.05), 1e-6);
}

}  // namespace
}  // namespace strata::runtime
