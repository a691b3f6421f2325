// Self-tests of the Hugging Face reference (hf_reference.h). The reference is what strata's
// model is judged by, so these check it against things computed another way: a scalar
// double-precision forward written with loops and complex-number RoPE, hand-computed llama3
// frequencies, hand-rounded bf16 bits and a separate safetensors parser.
#include "tests/testing/hf_reference.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace strata::testing {
namespace {

using Weights = std::map<std::string, torch::Tensor>;

LlamaSpec Small(const std::string& arch = "LlamaForCausalLM") {
  LlamaSpec s;
  s.architecture = arch;
  s.vocab_size = 23;
  s.hidden_size = 16;
  s.intermediate_size = 24;
  s.num_hidden_layers = 2;
  s.num_attention_heads = 4;
  s.num_key_value_heads = 2;
  return s;
}

torch::Tensor RandomIds(const LlamaSpec& spec, int64_t b, int64_t t, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randint(spec.vocab_size, {b, t}, torch::kLong);
}

std::set<std::string> Names(const Weights& w) {
  std::set<std::string> out;
  for (const auto& [name, t] : w) out.insert(name);
  return out;
}

// ---- An independent forward: scalar loops in double, RoPE as a complex rotation. -------------

struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<double> v;
  double at(int64_t r, int64_t c) const { return v[static_cast<size_t>(r * cols + c)]; }
};

Mat ToMat(const torch::Tensor& t) {
  torch::Tensor d = t.to(torch::kDouble).contiguous();
  Mat m;
  m.rows = d.dim() == 2 ? d.size(0) : 1;
  m.cols = d.dim() == 2 ? d.size(1) : d.size(0);
  m.v.assign(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
  return m;
}

using Vec = std::vector<double>;

Vec Affine(const Weights& w, const std::string& name, const Vec& x) {
  Mat m = ToMat(w.at(name + ".weight"));
  Vec y(static_cast<size_t>(m.rows), 0.0);
  for (int64_t r = 0; r < m.rows; ++r) {
    double s = 0;
    for (int64_t c = 0; c < m.cols; ++c) s += m.at(r, c) * x[static_cast<size_t>(c)];
    y[static_cast<size_t>(r)] = s;
  }
  auto it = w.find(name + ".bias");
  if (it != w.end()) {
    Mat b = ToMat(it->second);
    for (size_t r = 0; r < y.size(); ++r) y[r] += b.v[r];
  }
  return y;
}

Vec Rms(const Vec& x, const torch::Tensor& weight, double eps) {
  Mat g = ToMat(weight);
  double ss = 0;
  for (double e : x) ss += e * e;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = g.v[i] * (x[i] * inv);
  return y;
}

// inv_freq_i = theta^(-2i/d), then the llama3 rule written case by case.
std::vector<double> InvFreqDouble(const LlamaSpec& spec, int64_t d) {
  std::vector<double> inv(static_cast<size_t>(d / 2));
  for (int64_t i = 0; i < d / 2; ++i) {
    double f = std::pow(spec.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    if (spec.rope_scaling) {
      const Llama3Scaling& r = *spec.rope_scaling;
      const double old_len = static_cast<double>(r.original_max_position_embeddings);
      const double wavelen = 2 * M_PI / f;
      if (wavelen < old_len / r.high_freq_factor) {
        // high frequency: kept
      } else if (wavelen > old_len / r.low_freq_factor) {
        f = f / r.factor;  // low frequency: interpolated fully
      } else {
        const double s =
            (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        f = (1 - s) * f / r.factor + s * f;
      }
    }
    inv[static_cast<size_t>(i)] = f;
  }
  return inv;
}

// Rotates each head's pairs (x_i, x_{i+d/2}) as the complex number x_i + i x_{i+d/2} by
// e^{i pos inv_i}.
void RotateComplex(Vec& x, int64_t n_heads, int64_t d, int64_t pos,
                   const std::vector<double>& inv) {
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < d / 2; ++i) {
      const size_t a = static_cast<size_t>(h * d + i), c = static_cast<size_t>(h * d + i + d / 2);
      std::complex<double> z(x[a], x[c]);
      z *= std::polar(1.0, static_cast<double>(pos) * inv[static_cast<size_t>(i)]);
      x[a] = z.real();
      x[c] = z.imag();
    }
  }
}

torch::Tensor NaiveLogits(const LlamaSpec& spec, const Weights& w, const torch::Tensor& ids) {
  const int64_t B = ids.size(0), T = ids.size(1), H = spec.hidden_size, V = spec.vocab_size;
  const int64_t d = spec.head_dim != 0 ? spec.head_dim : H / spec.num_attention_heads;
  const int64_t nh = spec.num_attention_heads, nkv = spec.num_key_value_heads;
  const std::vector<double> inv = InvFreqDouble(spec, d);
  Mat embed = ToMat(w.at("model.embed_tokens.weight"));
  Mat head = spec.tie_word_embeddings ? embed : ToMat(w.at("lm_head.weight"));
  torch::Tensor out = torch::zeros({B, T, V}, torch::kDouble);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<Vec> hs(static_cast<size_t>(T), Vec(static_cast<size_t>(H)));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t tok = ids[b][t].item<int64_t>();
      for (int64_t j = 0; j < H; ++j)
        hs[static_cast<size_t>(t)][static_cast<size_t>(j)] = embed.at(tok, j);
    }
    for (int64_t l = 0; l < spec.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      std::vector<Vec> q(T), k(T), v(T);
      for (int64_t t = 0; t < T; ++t) {
        Vec x = Rms(hs[t], w.at(p + "input_layernorm.weight"), spec.rms_norm_eps);
        q[t] = Affine(w, p + "self_attn.q_proj", x);
        k[t] = Affine(w, p + "self_attn.k_proj", x);
        v[t] = Affine(w, p + "self_attn.v_proj", x);
        RotateComplex(q[t], nh, d, t, inv);
        RotateComplex(k[t], nkv, d, t, inv);
      }
      for (int64_t t = 0; t < T; ++t) {
        Vec concat(static_cast<size_t>(nh * d), 0.0);
        for (int64_t hq = 0; hq < nh; ++hq) {
          const int64_t g = hq / (nh / nkv);  // the kv head serving query head hq
          std::vector<double> s(static_cast<size_t>(t + 1));
          double mx = -1e300;
          for (int64_t j = 0; j <= t; ++j) {  // causal: keys 0..t only
            double dot = 0;
            for (int64_t e = 0; e < d; ++e) dot += q[t][hq * d + e] * k[j][g * d + e];
            s[j] = dot / std::sqrt(static_cast<double>(d));
            mx = std::max(mx, s[j]);
          }
          double z = 0;
          for (double& e : s) z += (e = std::exp(e - mx));
          for (int64_t j = 0; j <= t; ++j) {
            for (int64_t e = 0; e < d; ++e) concat[hq * d + e] += s[j] / z * v[j][g * d + e];
          }
        }
        Vec o = Affine(w, p + "self_attn.o_proj", concat);
        for (int64_t j = 0; j < H; ++j) hs[t][j] += o[j];
      }
      for (int64_t t = 0; t < T; ++t) {
        Vec x = Rms(hs[t], w.at(p + "post_attention_layernorm.weight"), spec.rms_norm_eps);
        Vec gate = Affine(w, p + "mlp.gate_proj", x);
        Vec up = Affine(w, p + "mlp.up_proj", x);
        for (size_t j = 0; j < gate.size(); ++j)
          gate[j] = gate[j] / (1 + std::exp(-gate[j])) * up[j];
        Vec down = Affine(w, p + "mlp.down_proj", gate);
        for (int64_t j = 0; j < H; ++j) hs[t][j] += down[j];
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      Vec x = Rms(hs[t], w.at("model.norm.weight"), spec.rms_norm_eps);
      for (int64_t c = 0; c < V; ++c) {
        double s = 0;
        for (int64_t j = 0; j < H; ++j) s += head.at(c, j) * x[j];
        out[b][t][c] = s;
      }
    }
  }
  return out;
}

void ExpectMatchesNaive(const LlamaSpec& spec, uint64_t seed) {
  Weights w = RandomLlamaWeights(spec, seed);
  torch::Tensor ids = RandomIds(spec, 2, 9, seed);
  torch::Tensor got = ReferenceLogits(spec, w, ids);
  ASSERT_EQ(got.scalar_type(), torch::kFloat);
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, 9, spec.vocab_size}));
  torch::Tensor want = NaiveLogits(spec, w, ids);
  const double err = (got.to(torch::kDouble) - want).abs().max().item<double>();
  const double scale = want.abs().max().item<double>();
  EXPECT_LT(err, 3e-5 * std::max(1.0, scale)) << spec.architecture << " max |logit| " << scale;
  // The logits are O(1) and not degenerate (the check above means something).
  EXPECT_GT(scale, 0.3);
  EXPECT_LT(scale, 30.0);
  EXPECT_GT(want.std().item<double>(), 0.1);
}

TEST(HfReferenceForward, MatchesScalarDoubleForwardLlamaGqa) { ExpectMatchesNaive(Small(), 1); }

TEST(HfReferenceForward, MatchesScalarDoubleForwardLlamaBiasesHeadDimLlama3) {
  LlamaSpec s = Small();
  s.head_dim = 6;  // not hidden / heads (= 4): q is 24 wide, o maps 24 -> 16
  s.attention_bias = true;
  s.mlp_bias = true;
  s.num_key_value_heads = 1;
  // inv_freq = 1, 0.0464, 0.00215: wavelen 6.3 (kept), 135 (smoothed), 2920 (divided).
  s.rope_scaling = Llama3Scaling{4.0, 1.0, 8.0, 512};
  ExpectMatchesNaive(s, 2);
}

TEST(HfReferenceForward, MatchesScalarDoubleForwardQwen2Tied) {
  LlamaSpec s = Small("Qwen2ForCausalLM");
  s.tie_word_embeddings = true;
  s.rope_theta = 1000000.0;
  ExpectMatchesNaive(s, 3);
}

TEST(HfReferenceForward, MatchesScalarDoubleForwardMistralMha) {
  LlamaSpec s = Small("MistralForCausalLM");
  s.num_key_value_heads = 4;  // kv heads == heads: plain per-head attention
  s.rms_norm_eps = 1e-5;
  ExpectMatchesNaive(s, 4);
}

TEST(HfReferenceForward, CausalLaterTokensDoNotChangeEarlierLogits) {
  LlamaSpec s = Small();
  Weights w = RandomLlamaWeights(s, 5);
  torch::Tensor ids = RandomIds(s, 2, 10, 5);
  torch::Tensor changed = ids.clone();
  changed.index_put_({torch::indexing::Slice(), 6},
                     (ids.index({torch::indexing::Slice(), 6}) + 1) % s.vocab_size);
  torch::Tensor a = ReferenceLogits(s, w, ids), b = ReferenceLogits(s, w, changed);
  using torch::indexing::Slice;
  EXPECT_TRUE(
      torch::allclose(a.index({Slice(), Slice(0, 6)}), b.index({Slice(), Slice(0, 6)}), 0, 1e-6));
  for (int64_t t = 6; t < 10; ++t) {  // the change reaches every later position
    EXPECT_GT((a.index({Slice(), t}) - b.index({Slice(), t})).abs().max().item<float>(), 1e-4)
        << "position " << t;
  }
}

TEST(HfReferenceForward, BatchRowsAreIndependent) {
  LlamaSpec s = Small();
  Weights w = RandomLlamaWeights(s, 6);
  torch::Tensor ids = RandomIds(s, 3, 7, 6);
  torch::Tensor all = ReferenceLogits(s, w, ids);
  for (int64_t b = 0; b < 3; ++b) {
    torch::Tensor one = ReferenceLogits(s, w, ids.narrow(0, b, 1));
    EXPECT_TRUE(torch::allclose(all.narrow(0, b, 1), one, 1e-5, 1e-5)) << b;
  }
}

// GQA with 2 kv heads for 4 query heads equals MHA whose kv head h copies kv head h / 2 (repeat_kv
// = repeat_interleave); copying kv head h % 2 instead (tiling) gives different logits.
TEST(HfReferenceForward, GqaIsRepeatInterleaveOfKvHeads) {
  LlamaSpec gqa = Small();
  const int64_t d = HeadDim(gqa);
  Weights w = RandomLlamaWeights(gqa, 7);
  LlamaSpec mha = gqa;
  mha.num_key_value_heads = gqa.num_attention_heads;
  Weights interleaved = w, tiled = w;
  for (int64_t l = 0; l < gqa.num_hidden_layers; ++l) {
    for (const char* proj : {"k_proj", "v_proj"}) {
      const std::string name =
          "model.layers." + std::to_string(l) + ".self_attn." + proj + ".weight";
      torch::Tensor heads = w.at(name).view({gqa.num_key_value_heads, d, gqa.hidden_size});
      interleaved[name] = heads.repeat_interleave(2, 0).reshape({-1, gqa.hidden_size});
      tiled[name] = heads.repeat({2, 1, 1}).reshape({-1, gqa.hidden_size});
    }
  }
  torch::Tensor ids = RandomIds(gqa, 2, 8, 7);
  torch::Tensor a = ReferenceLogits(gqa, w, ids);
  EXPECT_TRUE(torch::allclose(a, ReferenceLogits(mha, interleaved, ids), 1e-5, 1e-5));
  EXPECT_GT((a - ReferenceLogits(mha, tiled, ids)).abs().max().item<float>(), 1e-3);
}

TEST(HfReferenceForward, TiedHeadIsTheEmbedding) {
  LlamaSpec tied = Small();
  tied.tie_word_embeddings = true;
  Weights w = RandomLlamaWeights(tied, 8);
  LlamaSpec untied = tied;
  untied.tie_word_embeddings = false;
  Weights with_head = w;
  with_head["lm_head.weight"] = w.at("model.embed_tokens.weight").clone();
  torch::Tensor ids = RandomIds(tied, 2, 6, 8);
  EXPECT_TRUE(torch::equal(ReferenceLogits(tied, w, ids), ReferenceLogits(untied, with_head, ids)));
}

TEST(HfReferenceForward, Qwen2BiasesAreUsed) {
  LlamaSpec s = Small("Qwen2ForCausalLM");
  Weights w = RandomLlamaWeights(s, 9);
  torch::Tensor ids = RandomIds(s, 1, 6, 9);
  torch::Tensor a = ReferenceLogits(s, w, ids);
  for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
    Weights z = w;
    z["model.layers.0.self_attn." + std::string(proj) + ".bias"] =
        torch::zeros_like(w.at("model.layers.0.self_attn." + std::string(proj) + ".bias"));
    EXPECT_GT((a - ReferenceLogits(s, z, ids)).abs().max().item<float>(), 1e-5) << proj;
  }
}

TEST(HfReferenceForward, RejectsBadInputs) {
  LlamaSpec s = Small();
  Weights w = RandomLlamaWeights(s, 10);
  EXPECT_THROW(ReferenceLogits(s, w, torch::full({1, 3}, s.vocab_size, torch::kLong)),
               std::invalid_argument);
  EXPECT_THROW(ReferenceLogits(s, w, torch::zeros({3}, torch::kLong)), std::invalid_argument);
  Weights missing = w;
  missing.erase("model.layers.1.mlp.up_proj.weight");
  EXPECT_THROW(ReferenceLogits(s, missing, torch::zeros({1, 3}, torch::kLong)),
               std::invalid_argument);
}

// ---- RoPE --------------------------------------------------------------------------------------

TEST(HfReferenceRope, DefaultInvFreq) {
  LlamaSpec s = Small();
  s.head_dim = 4;
  torch::Tensor inv = RopeInvFreq(s);
  ASSERT_EQ(inv.numel(), 2);
  EXPECT_FLOAT_EQ(inv[0].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(inv[1].item<float>(), 0.01f);  // 10000^(-2/4)
}

// Llama 3.1 8B: theta 500000, head_dim 128, factor 8, low 1, high 4, original 8192. Wavelength
// thresholds 8192 / 4 = 2048 and 8192 / 1 = 8192.
TEST(HfReferenceRope, Llama3InvFreqHandComputed) {
  LlamaSpec s;
  s.hidden_size = 4096;
  s.num_attention_heads = 32;
  s.num_key_value_heads = 8;
  s.rope_theta = 500000.0;
  s.rope_scaling = Llama3Scaling{8.0, 1.0, 4.0, 8192};
  torch::Tensor inv = RopeInvFreq(s);
  ASSERT_EQ(inv.numel(), 64);
  // i = 0: inv 1, wavelen 2 pi < 2048: kept.
  EXPECT_NEAR(inv[0].item<float>(), 1.0, 1e-7);
  // i = 30: inv 500000^(-60/128) = 0.0021311195, wavelen 2948.3 in [2048, 8192]:
  // s = (8192 / 2948.3 - 1) / 3 = 0.59285, (1 - s) inv / 8 + s inv = 0.0013718936.
  EXPECT_NEAR(inv[30].item<float>() / 0.0013718935677611381, 1.0, 2e-6);
  // i = 63: inv 500000^(-126/128) = 2.4551408e-6, wavelen 2.56e6 > 8192: inv / 8.
  EXPECT_NEAR(inv[63].item<float>() / 3.068925988914511e-07, 1.0, 2e-6);
  // Every frequency against the case-by-case formula; all three regimes occur.
  std::vector<double> want = InvFreqDouble(s, 128);
  int kept = 0, divided = 0, smoothed = 0;
  LlamaSpec plain = s;
  plain.rope_scaling.reset();
  torch::Tensor base = RopeInvFreq(plain);
  for (int64_t i = 0; i < 64; ++i) {
    EXPECT_NEAR(inv[i].item<float>() / want[i], 1.0, 2e-6) << i;
    const double ratio = inv[i].item<double>() / base[i].item<double>();
    if (std::abs(ratio - 1) < 1e-6) {
      ++kept;
    } else if (std::abs(ratio - 0.125) < 1e-6) {
      ++divided;
    } else {
      ++smoothed;
      EXPECT_GT(ratio, 0.125);
      EXPECT_LT(ratio, 1.0);
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_EQ(smoothed, 6);  // i = 29..34 have wavelengths in (2048, 8192)
}

TEST(HfReferenceRope, CosSinAreCatOfFreqs) {
  LlamaSpec s = Small();  // head_dim 4
  auto [cos, sin] = RopeCosSin(s, torch::tensor({0, 3}, torch::kLong));
  ASSERT_EQ(cos.sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_TRUE(torch::equal(cos[0], torch::ones({4})));
  EXPECT_TRUE(torch::equal(sin[0], torch::zeros({4})));
  const double f[4] = {1.0, 0.01, 1.0, 0.01};  // cat(freqs, freqs), not interleaved
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(cos[1][i].item<float>(), std::cos(3 * f[i]), 1e-6);
    EXPECT_NEAR(sin[1][i].item<float>(), std::sin(3 * f[i]), 1e-6);
  }
}

// ApplyRope rotates (x_i, x_{i+d/2}) as a complex number by e^{i pos inv_i}, so q.k after RoPE
// depends only on the position difference.
TEST(HfReferenceRope, ComplexRotationAndRelativePositions) {
  LlamaSpec s = Small();
  s.head_dim = 8;
  torch::manual_seed(11);
  torch::Tensor q = torch::randn({8}), k = torch::randn({8});
  std::vector<double> inv = InvFreqDouble(s, 8);
  auto rope_at = [&](const torch::Tensor& x, int64_t pos) {
    auto [cos, sin] = RopeCosSin(s, torch::tensor({pos}, torch::kLong));
    return ApplyRope(x.view({1, 8}), cos, sin).view({8});
  };
  for (int64_t pos : {0, 1, 5, 37}) {
    Vec x(q.data_ptr<float>(), q.data_ptr<float>() + 8);
    RotateComplex(x, 1, 8, pos, inv);
    torch::Tensor got = rope_at(q, pos);
    for (int i = 0; i < 8; ++i) EXPECT_NEAR(got[i].item<float>(), x[i], 2e-5) << pos << " " << i;
  }
  auto score = [&](int64_t m, int64_t n) {
    return torch::dot(rope_at(q, m), rope_at(k, n)).item<float>();
  };
  EXPECT_NEAR(score(7, 3), score(27, 23), 1e-4);
  EXPECT_NEAR(score(3, 3), score(0, 0), 1e-5);
  EXPECT_NEAR(score(2, 9), score(12, 19), 1e-4);
  EXPECT_GT(std::abs(score(7, 3) - score(3, 7)), 1e-3);  // not symmetric in the difference
}

// ---- Weights and config ------------------------------------------------------------------------

std::set<std::string> LayerNames(int64_t layers, const std::vector<std::string>& per_layer) {
  std::set<std::string> out;
  for (int64_t l = 0; l < layers; ++l) {
    for (const std::string& n : per_layer)
      out.insert("model.layers." + std::to_string(l) + "." + n);
  }
  return out;
}

const std::vector<std::string> kPlainLayer = {
    "input_layernorm.weight",  "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",
    "mlp.down_proj.weight"};

TEST(HfReferenceWeights, LlamaHasExactlyTransformersTensors) {
  LlamaSpec s;  // the default spec: 97 x 64, 2 layers, 4 heads, 2 kv heads, 160 intermediate
  Weights w = RandomLlamaWeights(s, 1);
  std::set<std::string> want = LayerNames(2, kPlainLayer);
  want.insert({"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"});
  EXPECT_EQ(Names(w), want);
  auto shape = [&](const std::string& n) { return w.at(n).sizes().vec(); };
  EXPECT_EQ(shape("model.embed_tokens.weight"), (std::vector<int64_t>{97, 64}));
  EXPECT_EQ(shape("lm_head.weight"), (std::vector<int64_t>{97, 64}));
  EXPECT_EQ(shape("model.layers.1.self_attn.q_proj.weight"), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(shape("model.layers.1.self_attn.k_proj.weight"), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(shape("model.layers.1.self_attn.v_proj.weight"), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(shape("model.layers.1.self_attn.o_proj.weight"), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(shape("model.layers.0.mlp.gate_proj.weight"), (std::vector<int64_t>{160, 64}));
  EXPECT_EQ(shape("model.layers.0.mlp.down_proj.weight"), (std::vector<int64_t>{64, 160}));
  EXPECT_EQ(shape("model.norm.weight"), (std::vector<int64_t>{64}));
  for (const auto& [name, t] : w) {
    EXPECT_EQ(t.scalar_type(), torch::kFloat) << name;
    EXPECT_TRUE(t.is_contiguous()) << name;
  }
  // Norm weights around 1, matrices small and centred.
  EXPECT_NEAR(w.at("model.norm.weight").mean().item<float>(), 1.0, 0.1);
  EXPECT_NEAR(w.at("model.layers.0.mlp.up_proj.weight").std().item<float>(), 0.125, 0.01);
}

TEST(HfReferenceWeights, TiedSpecHasNoLmHead) {
  LlamaSpec s = Small();
  s.tie_word_embeddings = true;
  Weights w = RandomLlamaWeights(s, 1);
  EXPECT_EQ(w.count("lm_head.weight"), 0u);
  EXPECT_EQ(w.count("model.embed_tokens.weight"), 1u);
}

TEST(HfReferenceWeights, Qwen2HasQkvBiasesOnly) {
  LlamaSpec s = Small("Qwen2ForCausalLM");
  s.head_dim = 8;
  Weights w = RandomLlamaWeights(s, 1);
  std::set<std::string> want = LayerNames(2, kPlainLayer);
  std::set<std::string> biases =
      LayerNames(2, {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"});
  want.insert(biases.begin(), biases.end());
  want.insert({"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"});
  EXPECT_EQ(Names(w), want);
  EXPECT_EQ(w.at("model.layers.0.self_attn.q_proj.bias").sizes().vec(), (std::vector<int64_t>{32}));
  EXPECT_EQ(w.at("model.layers.0.self_attn.k_proj.bias").sizes().vec(), (std::vector<int64_t>{16}));
  EXPECT_EQ(w.at("model.layers.0.self_attn.o_proj.weight").sizes().vec(),
            (std::vector<int64_t>{16, 32}));
  EXPECT_NE(w.at("model.layers.0.self_attn.v_proj.bias").abs().sum().item<float>(), 0.0f);
}

TEST(HfReferenceWeights, LlamaBiasFlags) {
  LlamaSpec s = Small();
  s.attention_bias = true;
  s.mlp_bias = true;
  Weights w = RandomLlamaWeights(s, 1);
  std::set<std::string> want = LayerNames(2, kPlainLayer);
  std::set<std::string> biases = LayerNames(
      2, {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
          "self_attn.o_proj.bias", "mlp.gate_proj.bias", "mlp.up_proj.bias", "mlp.down_proj.bias"});
  want.insert(biases.begin(), biases.end());
  want.insert({"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"});
  EXPECT_EQ(Names(w), want);
  EXPECT_EQ(w.at("model.layers.1.mlp.up_proj.bias").sizes().vec(), (std::vector<int64_t>{24}));
  EXPECT_EQ(w.at("model.layers.1.mlp.down_proj.bias").sizes().vec(), (std::vector<int64_t>{16}));
  EXPECT_EQ(w.at("model.layers.1.self_attn.o_proj.bias").sizes().vec(), (std::vector<int64_t>{16}));
}

TEST(HfReferenceWeights, MistralHasNoBiases) {
  Weights w = RandomLlamaWeights(Small("MistralForCausalLM"), 1);
  std::set<std::string> want = LayerNames(2, kPlainLayer);
  want.insert({"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"});
  EXPECT_EQ(Names(w), want);
}

TEST(HfReferenceWeights, DeterministicPerSeedAndPerName) {
  LlamaSpec s = Small();
  Weights a = RandomLlamaWeights(s, 42), b = RandomLlamaWeights(s, 42),
          c = RandomLlamaWeights(s, 43);
  for (const auto& [name, t] : a) {
    EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
    EXPECT_FALSE(torch::equal(t, c.at(name))) << name;
  }
  // Adding biases leaves every other tensor as it was.
  LlamaSpec biased = s;
  biased.attention_bias = true;
  Weights d = RandomLlamaWeights(biased, 42);
  for (const auto& [name, t] : a) EXPECT_TRUE(torch::equal(t, d.at(name))) << name;
  // Distinct tensors of equal shape are not copies of each other.
  EXPECT_FALSE(torch::equal(a.at("model.layers.0.mlp.gate_proj.weight"),
                            a.at("model.layers.0.mlp.up_proj.weight")));
}

TEST(HfReferenceWeights, ValidateSpecRejectsWhatTransformersCannotBuild) {
  LlamaSpec s = Small();
  s.num_key_value_heads = 3;
  EXPECT_THROW(ValidateSpec(s), std::invalid_argument);
  s = Small();
  s.head_dim = 5;
  EXPECT_THROW(ValidateSpec(s), std::invalid_argument);
  s = Small();
  s.hidden_size = 18;  // 18 / 4 heads
  EXPECT_THROW(ValidateSpec(s), std::invalid_argument);
  s.head_dim = 4;  // explicit head_dim: fine
  EXPECT_NO_THROW(ValidateSpec(s));
  s = Small("Qwen2ForCausalLM");
  s.attention_bias = true;
  EXPECT_THROW(ValidateSpec(s), std::invalid_argument);
  s = Small("MistralForCausalLM");
  s.rope_scaling = Llama3Scaling{};
  EXPECT_THROW(ValidateSpec(s), std::invalid_argument);
  s = Small("GPT2LMHeadModel");
  EXPECT_THROW(ValidateSpec(s), std::invalid_argument);
}

TEST(HfReferenceConfig, LlamaKeys) {
  LlamaSpec s = Small();
  nlohmann::json c = LlamaConfigJson(s, "bfloat16");
  EXPECT_EQ(c["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["vocab_size"], 23);
  EXPECT_EQ(c["hidden_size"], 16);
  EXPECT_EQ(c["intermediate_size"], 24);
  EXPECT_EQ(c["num_hidden_layers"], 2);
  EXPECT_EQ(c["num_attention_heads"], 4);
  EXPECT_EQ(c["num_key_value_heads"], 2);
  EXPECT_FALSE(c.contains("head_dim"));
  EXPECT_EQ(c["hidden_act"], "silu");
  EXPECT_EQ(c["rms_norm_eps"], 1e-6);
  EXPECT_EQ(c["rope_theta"], 10000.0);
  EXPECT_TRUE(c["rope_theta"].is_number_float());
  EXPECT_EQ(c["tie_word_embeddings"], false);
  EXPECT_EQ(c["attention_bias"], false);
  EXPECT_EQ(c["mlp_bias"], false);
  EXPECT_EQ(c["pretraining_tp"], 1);
  EXPECT_TRUE(c.contains("rope_scaling"));
  EXPECT_TRUE(c["rope_scaling"].is_null());
  EXPECT_EQ(c["max_position_embeddings"], 2048);
  EXPECT_EQ(c["bos_token_id"], 1);
  EXPECT_EQ(c["eos_token_id"], 2);
  EXPECT_EQ(c["torch_dtype"], "bfloat16");

  s.head_dim = 8;
  s.tie_word_embeddings = true;
  s.rope_scaling = Llama3Scaling{32.0, 1.0, 4.0, 8192};
  c = LlamaConfigJson(s, "float32");
  EXPECT_EQ(c["head_dim"], 8);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_EQ(c["rope_scaling"], (nlohmann::json{{"rope_type", "llama3"},
                                               {"factor", 32.0},
                                               {"low_freq_factor", 1.0},
                                               {"high_freq_factor", 4.0},
                                               {"original_max_position_embeddings", 8192}}));
  EXPECT_EQ(c["torch_dtype"], "float32");
  EXPECT_THROW(LlamaConfigJson(s, "float64"), std::invalid_argument);
}

TEST(HfReferenceConfig, MistralAndQwen2Keys) {
  nlohmann::json m = LlamaConfigJson(Small("MistralForCausalLM"), "float16");
  EXPECT_EQ(m["model_type"], "mistral");
  EXPECT_EQ(m["architectures"], nlohmann::json::array({"MistralForCausalLM"}));
  EXPECT_EQ(m["sliding_window"], 4096);
  EXPECT_FALSE(m.contains("rope_scaling"));
  EXPECT_FALSE(m.contains("attention_bias"));
  EXPECT_EQ(m["torch_dtype"], "float16");
  nlohmann::json q = LlamaConfigJson(Small("Qwen2ForCausalLM"), "bfloat16");
  EXPECT_EQ(q["model_type"], "qwen2");
  EXPECT_EQ(q["use_sliding_window"], false);
  EXPECT_TRUE(q["rope_scaling"].is_null());
  EXPECT_FALSE(q.contains("attention_bias"));
  EXPECT_FALSE(q.contains("mlp_bias"));
  EXPECT_EQ(q["hidden_act"], "silu");
}

// ---- Safetensors, parsed by a separate reader ---------------------------------------------------

struct StTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Parses a safetensors file, checking the layout rules (header length, offsets contiguous from 0
// to the end of the file, byte counts matching dtype x shape).
std::map<std::string, StTensor> ParseSafetensors(const std::string& path) {
  std::string f = ReadAll(path);
  EXPECT_GE(f.size(), 8u) << path;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(f[i])) << (8 * i);
  EXPECT_LE(8 + n, f.size()) << path;
  EXPECT_EQ(n % 8, 0u) << "header padded to 8 bytes";
  nlohmann::json h = nlohmann::json::parse(f.substr(8, n));
  const std::string data = f.substr(8 + n);
  EXPECT_EQ(h["__metadata__"], (nlohmann::json{{"format", "pt"}}));
  std::map<std::string, StTensor> out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    StTensor t;
    t.dtype = it.value()["dtype"];
    t.shape = it.value()["shape"].get<std::vector<int64_t>>();
    const uint64_t b = it.value()["data_offsets"][0], e = it.value()["data_offsets"][1];
    int64_t count = 1;
    for (int64_t d : t.shape) count *= d;
    const uint64_t width = t.dtype == "F32" ? 4 : 2;
    EXPECT_EQ(e - b, count * width) << it.key();
    EXPECT_LE(e, data.size());
    t.bytes = data.substr(b, e - b);
    ranges.push_back({b, e});
    out[it.key()] = t;
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (auto [b, e] : ranges) {
    EXPECT_EQ(b, at) << "gap or overlap in " << path;
    at = e;
  }
  EXPECT_EQ(at, data.size()) << "data region fully covered in " << path;
  return out;
}

// fp32 -> bf16 by round-to-nearest-even on the bits (the values here are finite).
uint16_t Bf16Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// IEEE half bits -> double.
double HalfToDouble(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v = exp == 0 ? std::ldexp(man, -24) : std::ldexp(1024 + man, exp - 25);
  return sign ? -v : v;
}

std::vector<uint16_t> U16(const std::string& bytes) {
  std::vector<uint16_t> v(bytes.size() / 2);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<uint16_t>(static_cast<unsigned char>(bytes[2 * i]) |
                                 (static_cast<unsigned char>(bytes[2 * i + 1]) << 8));
  }
  return v;
}

TEST(HfReferenceCheckpoint, SingleFileEveryDtypeParsesBack) {
  LlamaSpec s = Small("Qwen2ForCausalLM");
  Weights w = RandomLlamaWeights(s, 12);
  for (const std::string dtype : {"F32", "BF16", "F16"}) {
    TempDir dir("hf-ref");
    ASSERT_TRUE(dir.ok());
    WriteHfCheckpoint(dir.path(), s, w, dtype, 1);
    EXPECT_FALSE(std::filesystem::exists(dir.File("model.safetensors.index.json")));
    nlohmann::json config = nlohmann::json::parse(ReadAll(dir.File("config.json")));
    EXPECT_EQ(config, LlamaConfigJson(s, dtype == "F32"    ? "float32"
                                         : dtype == "BF16" ? "bfloat16"
                                                           : "float16"));
    std::map<std::string, StTensor> st = ParseSafetensors(dir.File("model.safetensors"));
    EXPECT_EQ(st.size(), w.size());
    Weights round = RoundTripWeights(w, dtype);
    for (const auto& [name, t] : w) {
      ASSERT_EQ(st.count(name), 1u) << name;
      const StTensor& got = st.at(name);
      EXPECT_EQ(got.dtype, dtype);
      EXPECT_EQ(got.shape, t.sizes().vec()) << name;
      const float* x = t.data_ptr<float>();
      const float* r = round.at(name).data_ptr<float>();
      if (dtype == "F32") {
        EXPECT_EQ(std::memcmp(got.bytes.data(), x, got.bytes.size()), 0) << name;
        EXPECT_TRUE(torch::equal(round.at(name), t));
        continue;
      }
      std::vector<uint16_t> bits = U16(got.bytes);
      for (size_t i = 0; i < bits.size(); ++i) {
        double stored;
        if (dtype == "BF16") {
          ASSERT_EQ(bits[i], Bf16Bits(x[i])) << name << "[" << i << "]";
          uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
          float f;
          std::memcpy(&f, &u, 4);
          stored = f;
        } else {
          stored = HalfToDouble(bits[i]);
          ASSERT_LE(std::abs(stored - x[i]), std::max(std::abs(x[i]) * 0x1p-11, 0x1p-25))
              << name << "[" << i << "]";
        }
        ASSERT_EQ(static_cast<double>(r[i]), stored) << "RoundTripWeights " << name;
      }
    }
  }
}

TEST(HfReferenceCheckpoint, ShardedIndexCoversEveryTensorOnce) {
  LlamaSpec s;                   // 21 tensors
  s.tie_word_embeddings = true;  // 20 tensors: shards of 6, 7, 7
  Weights w = RandomLlamaWeights(s, 13);
  TempDir dir("hf-ref");
  ASSERT_TRUE(dir.ok());
  WriteHfCheckpoint(dir.path(), s, w, "BF16", 3);
  EXPECT_FALSE(std::filesystem::exists(dir.File("model.safetensors")));
  nlohmann::json index = nlohmann::json::parse(ReadAll(dir.File("model.safetensors.index.json")));
  const std::vector<std::string> files = {"model-00001-of-00003.safetensors",
                                          "model-00002-of-00003.safetensors",
                                          "model-00003-of-00003.safetensors"};
  std::map<std::string, std::string> where;
  uint64_t total = 0;
  std::string last_name;
  for (size_t k = 0; k < files.size(); ++k) {
    ASSERT_TRUE(std::filesystem::exists(dir.File(files[k]))) << files[k];
    std::map<std::string, StTensor> st = ParseSafetensors(dir.File(files[k]));
    EXPECT_GE(st.size(), 6u);
    EXPECT_LE(st.size(), 7u);
    for (const auto& [name, t] : st) {
      EXPECT_EQ(where.count(name), 0u) << name << " in two shards";
      where[name] = files[k];
      total += t.bytes.size();
      EXPECT_EQ(t.dtype, "BF16");
      EXPECT_GT(name, last_name) << "shards follow name order";
      last_name = name;
    }
  }
  EXPECT_EQ(Names(w), [&] {
    std::set<std::string> n;
    for (const auto& [name, f] : where) n.insert(name);
    return n;
  }());
  EXPECT_EQ(index["weight_map"].size(), w.size());
  for (const auto& [name, file] : where) EXPECT_EQ(index["weight_map"][name], file) << name;
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(
      total, 2u * [&] {
        uint64_t n = 0;
        for (const auto& [name, t] : w) n += t.numel();
        return n;
      }());
  EXPECT_THROW(WriteHfCheckpoint(dir.path(), s, w, "BF16", 0), std::invalid_argument);
  EXPECT_THROW(WriteHfCheckpoint(dir.path(), s, w, "BF16", 21), std::invalid_argument);
  EXPECT_THROW(WriteHfCheckpoint(dir.path(), s, w, "F64", 1), std::invalid_argument);
}

// ---- Loss ---------------------------------------------------------------------------------------

TEST(HfReferenceLoss, ZeroWeightsGiveLogVocab) {
  LlamaSpec s = Small();
  Weights w = RandomLlamaWeights(s, 14);
  for (auto& [name, t] : w) t.zero_();
  torch::Tensor windows = RandomIds(s, 3, 9, 14);
  EXPECT_NEAR(ReferenceLoss(s, w, windows), std::log(23.0), 1e-14);
}

TEST(HfReferenceLoss, IsShiftedCrossEntropyOfTheLogits) {
  LlamaSpec s = Small();
  Weights w = RandomLlamaWeights(s, 15);
  torch::Tensor windows = RandomIds(s, 2, 8, 15);  // T = 7
  torch::Tensor logits = ReferenceLogits(s, w, windows.narrow(1, 0, 7)).to(torch::kDouble);
  double sum = 0;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 7; ++t) {
      torch::Tensor row = logits[b][t];
      const double mx = row.max().item<double>();
      const double lse = mx + std::log((row - mx).exp().sum().item<double>());
      sum += lse - row[windows[b][t + 1].item<int64_t>()].item<double>();
    }
  }
  const double loss = ReferenceLoss(s, w, windows);
  EXPECT_NEAR(loss, sum / 14, 1e-12);
  EXPECT_GT(loss, 1.0);  // random weights: roughly log(23) = 3.1, not degenerate
  EXPECT_LT(loss, 8.0);
  EXPECT_THROW(ReferenceLoss(s, w, windows.narrow(1, 0, 1)), std::invalid_argument);
}

}  // namespace
}  // namespace strata::testing
