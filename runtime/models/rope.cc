// See rope.h. Each type follows its _compute_*_parameters in modeling_rope_utils.py, with the same
// order of fp32 operations so the tables round as transformers' do.
#include "runtime/models/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace strata::runtime {
namespace {

// arange(0, dim, 2) / dim in fp32: the exponent of every frequency.
torch::Tensor Exponents(int64_t dim) {
  return torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) / static_cast<double>(dim);
}

// Python's `scalar / tensor` is reciprocal(tensor) * scalar in PyTorch (Tensor.__rtruediv__), so
// 1 / x is reciprocal(x) here.
torch::Tensor Llama3Frequencies(const torch::Tensor& inv_freq, const RopeScaling& r) {
  const double old_context = static_cast<double>(r.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / r.low_freq_factor;
  const double high_freq_wavelen = old_context / r.high_freq_factor;
  const torch::Tensor wavelen = torch::reciprocal(inv_freq) * (2 * std::numbers::pi);
  torch::Tensor scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / r.factor, inv_freq);
  const torch::Tensor smooth = (torch::reciprocal(wavelen) * old_context - r.low_freq_factor) /
                               (r.high_freq_factor - r.low_freq_factor);
  const torch::Tensor smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
  const torch::Tensor medium =
      (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return torch::where(medium, smoothed, scaled);
}

// YaRN: extrapolated (unscaled) frequencies for the fast-rotating dims, interpolated (/ factor)
// for the slow ones, a linear ramp between the dims that rotate beta_fast and beta_slow times
// over the original length.
torch::Tensor YarnFrequencies(double theta, int64_t dim, const RopeScaling& r) {
  const double original = static_cast<double>(r.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return static_cast<double>(dim) * std::log(original / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(theta));
  };
  double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  const torch::Tensor pos_freqs = torch::pow(theta, Exponents(dim));
  const torch::Tensor extrapolation = torch::reciprocal(pos_freqs);
  const torch::Tensor interpolation = torch::reciprocal(pos_freqs * r.factor);
  const torch::Tensor ramp =
      ((torch::arange(dim / 2, torch::kFloat32) - low) / (high - low)).clamp(0, 1);
  const torch::Tensor extrapolation_weight = 1 - ramp;
  return interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight;
}

torch::Tensor LongropeFrequencies(double theta, int64_t dim, const std::vector<double>& factors) {
  const torch::Tensor ext = torch::tensor(factors, torch::kFloat64).to(torch::kFloat32);
  return torch::reciprocal(ext * torch::pow(theta, Exponents(dim)));
}

}  // namespace

RotaryEmbedding::RotaryEmbedding(const LlamaShape& s)
    : theta_(s.rope_theta),
      dim_(RotaryDim(s)),
      max_position_embeddings_(s.max_position_embeddings),
      scaling_(s.rope_scaling) {
  using Type = RopeScaling::Type;
  inv_freq_ = DefaultFrequencies();
  if (!scaling_) return;
  switch (scaling_->type) {
    case Type::kLinear:
      inv_freq_ = inv_freq_ / scaling_->factor;
      break;
    case Type::kDynamic:  // the default frequencies up to max_position_embeddings
      break;
    case Type::kYarn:
      inv_freq_ = YarnFrequencies(theta_, dim_, *scaling_);
      break;
    case Type::kLongrope:
      inv_freq_ = LongropeFrequencies(theta_, dim_, scaling_->short_factor);
      long_inv_freq_ = LongropeFrequencies(theta_, dim_, scaling_->long_factor);
      break;
    case Type::kLlama3:
      inv_freq_ = Llama3Frequencies(inv_freq_, *scaling_);
      break;
  }
}

torch::Tensor RotaryEmbedding::DefaultFrequencies() const {
  return torch::reciprocal(torch::pow(theta_, Exponents(dim_)));
}

torch::Tensor RotaryEmbedding::InverseFrequencies(int64_t seq_len) const {
  if (!scaling_) return inv_freq_;
  if (scaling_->type == RopeScaling::Type::kDynamic && seq_len > max_position_embeddings_) {
    // base · (factor · seq_len / max_pos - (factor - 1))^(dim / (dim - 2)), a tensor in
    // transformers (seq_len is one), so fp32 throughout.
    const double factor = scaling_->factor;
    const double dim = static_cast<double>(dim_);
    const torch::Tensor grown =
        torch::tensor(seq_len, torch::kInt64) * factor / max_position_embeddings_ - (factor - 1);
    const torch::Tensor base = torch::pow(grown, dim / (dim - 2)) * theta_;
    return torch::reciprocal(torch::pow(base, Exponents(dim_)));
  }
  if (scaling_->type == RopeScaling::Type::kLongrope &&
      seq_len > scaling_->original_max_position_embeddings) {
    return long_inv_freq_;
  }
  return inv_freq_;
}

RopeTables RotaryEmbedding::Tables(int64_t position_offset, int64_t T, torch::ScalarType dtype,
                                   const torch::Device& device) const {
  const torch::Tensor positions = torch::arange(position_offset, position_offset + T,
                                                torch::dtype(torch::kFloat32).device(device));
  const torch::Tensor freqs =
      torch::outer(positions, InverseFrequencies(position_offset + T).to(device));
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  torch::Tensor cos = emb.cos(), sin = emb.sin();
  const double attention_factor = scaling_ ? scaling_->attention_factor : 1.0;
  if (attention_factor != 1.0) {
    cos = cos * attention_factor;
    sin = sin * attention_factor;
  }
  return {cos.to(dtype), sin.to(dtype)};
}

torch::Tensor ApplyRotary(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin) {
  const int64_t rotary = cos.size(-1), head_dim = x.size(-1), half = rotary / 2;
  const torch::Tensor x_rot = rotary == head_dim ? x : x.narrow(-1, 0, rotary);
  const torch::Tensor rotated =
      torch::cat({-x_rot.narrow(-1, half, rotary - half), x_rot.narrow(-1, 0, half)}, -1);
  const torch::Tensor embedded = x_rot * cos + rotated * sin;
  if (rotary == head_dim) return embedded;
  return torch::cat({embedded, x.narrow(-1, rotary, head_dim - rotary)}, -1);
}

}  // namespace strata::runtime
