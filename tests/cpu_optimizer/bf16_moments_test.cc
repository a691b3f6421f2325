// Accuracy of bf16 moment storage against fp32 moments: the same small problems trained with
// AdamW both ways, loss curves printed side by side, and the bf16 curve required to stay within a
// stated tolerance of the fp32 one.
//
// bf16 keeps 8 significant bits, so m and v are rounded to ~0.4% after every update. With
// beta2 = 0.999 an update moves v by 0.1% of (g^2 - v), below half an ulp of bf16 unless g^2 and v
// differ by more than ~2x: v then tracks the gradient scale only coarsely (it rises readily, decays
// slowly). The effect on these problems is a few percent of loss at most (see the printed curves).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cpu_optimizer/optimizer.h"

namespace strata::cpu_optimizer {
namespace {

struct Problem {
  int rows, cols;
  bool logistic;
  std::vector<float> x, y;
};

Problem MakeProblem(int rows, int cols, bool logistic, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Problem p{rows, cols, logistic, std::vector<float>(rows * cols), std::vector<float>(rows)};
  std::vector<float> w_true(cols);
  for (float& w : w_true) w = normal(rng);
  for (float& v : p.x) v = normal(rng);
  for (int r = 0; r < rows; ++r) {
    double dot = 0;
    for (int c = 0; c < cols; ++c) dot += p.x[r * cols + c] * w_true[c];
    if (logistic) {
      p.y[r] = (dot + 0.5 * normal(rng)) > 0 ? 1.0f : 0.0f;
    } else {
      p.y[r] = static_cast<float>(dot + 0.01 * normal(rng));
    }
  }
  return p;
}

// Loss (MSE or mean logistic loss) and its gradient with respect to w.
double LossAndGrad(const Problem& p, const std::vector<float>& w, std::vector<float>* grad) {
  std::fill(grad->begin(), grad->end(), 0.0f);
  double loss = 0;
  for (int r = 0; r < p.rows; ++r) {
    double z = 0;
    for (int c = 0; c < p.cols; ++c) z += p.x[r * p.cols + c] * w[c];
    double dz;
    if (p.logistic) {
      const double prob = 1.0 / (1.0 + std::exp(-z));
      loss += -(p.y[r] * std::log(prob + 1e-12) + (1 - p.y[r]) * std::log(1 - prob + 1e-12));
      dz = prob - p.y[r];
    } else {
      const double e = z - p.y[r];
      loss += e * e;
      dz = 2 * e;
    }
    for (int c = 0; c < p.cols; ++c) (*grad)[c] += static_cast<float>(dz * p.x[r * p.cols + c]);
  }
  for (float& g : *grad) g /= static_cast<float>(p.rows);
  return loss / p.rows;
}

std::vector<double> Train(const Problem& p, DType moments, int steps) {
  OptimizerOptions o = OptimizerOptions::Defaults(OptimizerType::kAdamW);
  o.lr = 1e-2;
  o.weight_decay = 1e-4;
  Result<CpuOptimizer> opt = CpuOptimizer::Create(o);
  EXPECT_TRUE(opt.ok());
  std::vector<float> w(p.cols, 0.0f), g(p.cols);
  std::vector<float> m32(p.cols, 0.0f), v32(p.cols, 0.0f);
  std::vector<uint16_t> m16(p.cols, 0), v16(p.cols, 0);
  FlatSpan s;
  s.numel = p.cols;
  s.params = w.data();
  s.grads = g.data();
  s.moment_dtype = moments;
  s.exp_avg = moments == DType::kFloat32 ? static_cast<void*>(m32.data()) : m16.data();
  s.exp_avg_sq = moments == DType::kFloat32 ? static_cast<void*>(v32.data()) : v16.data();
  std::vector<double> curve;
  for (int step = 1; step <= steps; ++step) {
    curve.push_back(LossAndGrad(p, w, &g));
    EXPECT_TRUE(opt->Step(s, StepArgs{.step = step}).ok());
  }
  curve.push_back(LossAndGrad(p, w, &g));
  return curve;
}

void CompareCurves(const char* name, const Problem& p, int steps, double rel_tol, double abs_tol,
                   double trained_ratio) {
  const std::vector<double> fp32 = Train(p, DType::kFloat32, steps);
  const std::vector<double> bf16 = Train(p, DType::kBFloat16, steps);
  std::printf("%s: AdamW lr=1e-2, loss with fp32 vs bf16 moments\n  step        fp32        bf16\n",
              name);
  for (int s = 0; s <= steps; s += steps / 20) {
    std::printf("  %4d  %10.6f  %10.6f\n", s, fp32[s], bf16[s]);
  }
  // The bf16 curve stays within rel_tol (+ abs_tol near zero loss) of the fp32 one everywhere.
  double worst = 0;
  for (int s = 0; s <= steps; ++s) {
    const double allowed = rel_tol * fp32[s] + abs_tol;
    worst = std::max(worst, std::fabs(bf16[s] - fp32[s]) / allowed);
    EXPECT_LE(std::fabs(bf16[s] - fp32[s]), allowed) << name << " step " << s;
  }
  std::printf("  worst |bf16 - fp32| / allowed = %.3f (allowed = %.2f * fp32 + %g)\n", worst,
              rel_tol, abs_tol);
  EXPECT_LT(bf16.back(), trained_ratio * bf16.front()) << name << ": bf16 moments did not train";
}

TEST(Bf16Moments, LeastSquaresLossCurveTracksFp32) {
  const Problem p = MakeProblem(512, 64, /*logistic=*/false, 1);
  CompareCurves("least squares (512 x 64)", p, 600, 0.10, 1e-3, 0.01);
}

TEST(Bf16Moments, LogisticRegressionLossCurveTracksFp32) {
  const Problem p = MakeProblem(1024, 32, /*logistic=*/true, 2);
  CompareCurves("logistic regression (1024 x 32)", p, 600, 0.05, 1e-3, 0.6);
}

}  // namespace
}  // namespace strata::cpu_optimizer
