// The row math behind dapo::linear_logprobs on plain buffers: softmax statistics of a block of logits, and the
// gradient of log-probs and entropy with respect to those logits, written in place. No LibTorch here.
//
// Shapes: R = rows (tokens) of the block, V = vocabulary; logits [R, V] row-major (already divided by the
// temperature), targets [R] int64; every per-row input and output [R].
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "dapo/core/error.hpp"
#include "dapo/core/parallel.hpp"
#include "dapo/core/simd.hpp"

namespace dapo {
namespace detail {
inline namespace DAPO_KERNEL_ABI {  // see kernel_abi.hpp

// One row's statistics: max, then sum exp(z - max) and sum exp(z - max) * z. Vector partial sums cover blocks of
// 64 registers and are promoted to double, so long rows (V = 151936) keep float32 sums accurate.
struct RowSoftmax {
  double max = -std::numeric_limits<double>::infinity();
  double sum = 0.0, weighted = 0.0;
};

template <class Math, class T>
DAPO_INLINE RowSoftmax softmax_row(const T* z, int64_t vocab, bool with_mean) {
  using V = typename Math::Value;
  constexpr int64_t kLanes = Math::kLanes, kBlock = 64 * kLanes;
  const V zero = Math::splat(0.0), one = Math::splat(1.0);
  const int64_t full = vocab - vocab % kLanes;
  RowSoftmax row;
  V max = Math::splat(-std::numeric_limits<double>::infinity()), nan = zero;
  for (int64_t j = 0; j < full; j += kLanes) {
    const V x = Math::load(z + j);
    max = Math::select(x > max, x, max);
    nan = nan + Math::select(x != x, one, zero);
  }
  bool has_nan = Math::sum(nan) != 0.0;
  if (full > 0) row.max = Math::max(max);
  for (int64_t j = full; j < vocab; ++j) {
    const double x = static_cast<double>(z[j]);
    has_nan = has_nan || x != x;
    row.max = x > row.max ? x : row.max;
  }
  if (has_nan) {  // as torch.logsumexp: NaN in, NaN out
    row.max = row.sum = row.weighted = std::numeric_limits<double>::quiet_NaN();
    return row;
  }
  const V shift = Math::splat(row.max);
  for (int64_t start = 0; start < full; start += kBlock) {
    const int64_t stop = start + kBlock < full ? start + kBlock : full;
    V sum = zero, weighted = zero;
    for (int64_t j = start; j < stop; j += kLanes) {
      const V x = Math::load(z + j);
      const V e = Math::exp(x - shift);
      sum = sum + e;
      if (with_mean) weighted = weighted + e * x;
    }
    row.sum += Math::sum(sum);
    row.weighted += Math::sum(weighted);
  }
  for (int64_t j = full; j < vocab; ++j) {
    const double x = static_cast<double>(z[j]);
    const double e = std::exp(x - row.max);
    row.sum += e;
    row.weighted += e * x;
  }
  return row;
}

// In place: z_j <- -p_j * (g_entropy * (z_j - mean) + g_logp), p = exp(z - lse); the caller adds g_logp at the target.
template <class Math, class T>
DAPO_INLINE void logits_grad_row(T* z, int64_t vocab, double lse, double mean, double grad_logp, double grad_entropy) {
  using V = typename Math::Value;
  constexpr int64_t kLanes = Math::kLanes;
  const V lse_v = Math::splat(lse), mean_v = Math::splat(mean), g_logp = Math::splat(grad_logp),
          g_entropy = Math::splat(grad_entropy), zero = Math::splat(0.0);
  const int64_t full = vocab - vocab % kLanes;
  for (int64_t j = 0; j < full; j += kLanes) {
    const V x = Math::load(z + j);
    const V p = Math::exp(x - lse_v);
    Math::store(z + j, zero - p * (g_entropy * (x - mean_v) + g_logp));
  }
  for (int64_t j = full; j < vocab; ++j) {
    const double x = static_cast<double>(z[j]);
    z[j] = static_cast<T>(-std::exp(x - lse) * (grad_entropy * (x - mean) + grad_logp));
  }
}

struct SoftmaxRowKernel {
  template <class Math, class T>
  DAPO_INLINE static RowSoftmax run(const T* const& z, const int64_t& vocab, const bool& with_mean) {
    return softmax_row<Math>(z, vocab, with_mean);
  }
};

struct LogitsGradRowKernel {
  template <class Math, class T>
  DAPO_INLINE static void run(T* const& z, const int64_t& vocab, const double& lse, const double& mean,
                              const double& grad_logp, const double& grad_entropy) {
    logits_grad_row<Math>(z, vocab, lse, mean, grad_logp, grad_entropy);
  }
};

}  // namespace DAPO_KERNEL_ABI
}  // namespace detail

namespace core {
inline namespace DAPO_KERNEL_ABI {

// For each row r of logits [R, V] (element type T; statistics in C = float or double, exp in the SIMD arithmetic of
// C): lse[r] = logsumexp(z_r), chosen[r] = z_r[targets[r]], and, when mean is not null, mean[r] = E_softmax(z_r)[z_r],
// so that log p(target) = chosen - lse and entropy = lse - mean. float_lanes: see simd::resolve_float_lanes.
template <class C, class T, class ParallelFor = SerialFor>
void softmax_statistics(const T* logits, int64_t rows, int64_t vocab, const int64_t* targets, C* lse, C* chosen,
                        C* mean, const ParallelFor& parallel = {}, int float_lanes = 0) {
  constexpr const char* kWhere = "dapo::core::softmax_statistics";
  DAPO_REQUIRE(vocab >= 1, kWhere, "vocab is ", vocab, ", expected >= 1");
  const int lanes = simd::resolve_float_lanes(float_lanes, kWhere);
  const bool with_mean = mean != nullptr;
  parallel(rows, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const T* z = logits + r * vocab;
      const detail::RowSoftmax row = simd::run<C, detail::SoftmaxRowKernel>(lanes, z, vocab, with_mean);
      const double row_lse = row.max + std::log(row.sum);
      lse[r] = static_cast<C>(row_lse);
      chosen[r] = static_cast<C>(z[targets[r]]);
      if (with_mean) mean[r] = static_cast<C>(row.weighted / row.sum);
    }
  });
}

// In place, for each row r: z_r <- d/dz_r [grad_logp[r] * log p(targets[r]) + grad_entropy[r] * entropy(z_r)]
//   = grad_logp[r] * (onehot(targets[r]) - p) - grad_entropy[r] * p * (z_r - mean[r]),   p = softmax(z_r),
// from the statistics softmax_statistics returned. grad_logp or grad_entropy (with mean) may be null: zero.
template <class C, class T, class ParallelFor = SerialFor>
void logprob_logits_grad(T* logits, int64_t rows, int64_t vocab, const int64_t* targets, const C* lse, const C* mean,
                         const C* grad_logp, const C* grad_entropy, const ParallelFor& parallel = {},
                         int float_lanes = 0) {
  constexpr const char* kWhere = "dapo::core::logprob_logits_grad";
  DAPO_REQUIRE(grad_entropy == nullptr || mean != nullptr, kWhere, "grad_entropy needs the row means (mean is null)");
  const int lanes = simd::resolve_float_lanes(float_lanes, kWhere);
  parallel(rows, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      T* z = logits + r * vocab;
      const double g_logp = grad_logp != nullptr ? static_cast<double>(grad_logp[r]) : 0.0;
      const double g_entropy = grad_entropy != nullptr ? static_cast<double>(grad_entropy[r]) : 0.0;
      const double row_mean = mean != nullptr ? static_cast<double>(mean[r]) : 0.0;
      const double row_lse = static_cast<double>(lse[r]);
      simd::run<C, detail::LogitsGradRowKernel>(lanes, z, vocab, row_lse, row_mean, g_logp, g_entropy);
      z[targets[r]] = static_cast<T>(static_cast<double>(z[targets[r]]) + g_logp);
    }
  });
}

}  // namespace DAPO_KERNEL_ABI
}  // namespace core
}  // namespace dapo
