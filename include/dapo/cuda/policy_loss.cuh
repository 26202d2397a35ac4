// The fused policy loss on CUDA: a kernel and its launcher on raw device pointers. No LibTorch, no allocation: the
// caller provides the per-unit partial sums buffer and the stream (flashinfer's launcher style).
//
// One thread block per unit: a row, or a group of group_size rows under group-token-mean. The block counts the unit's
// tokens when the aggregation needs them first (seq-mean-token-mean per row, group-token-mean per group), then computes
// every token's loss and raw gradient with the loss's per-token function of <dapo/core/policy_loss/> (the same function
// the CPU kernel runs; gspo's row log-ratio is a block sum first), weighted when weights are given, scales the gradient
// by the unit's own factor, and writes the unit's sums. The caller adds the units' sums in order and calls
// core::finish_policy_loss, exactly as the CPU kernel does.
//
// Shapes: B = rows, T = cols; logp, old_logp, mask [B, T]; advantages [B] or [B, T]; weights [B, T] or null;
// raw_grad [B, T] or null; partials [num_units].
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dapo/core/loss.hpp"

namespace dapo::cuda {

// One unit's sums; invalid_mask counts mask values that are neither 0 nor 1 (the caller reports them).
struct UnitSums {
  double loss, tokens, clipped, dual_clipped, kl, nonempty_rows, invalid_mask;
};
constexpr int kUnitFields = 7;
constexpr int kThreads = 256;

inline int64_t policy_loss_units(int64_t rows, const PolicyLossOptions& options) {
  return options.aggregation == LossAggregation::kGroupTokenMean ? rows / options.group_size : rows;
}

namespace detail {

// Sums kUnitFields doubles over the block; thread 0 gets the totals.
__device__ inline void block_sum(double (&values)[kUnitFields]) {
  __shared__ double shared[kUnitFields][kThreads];
  for (int f = 0; f < kUnitFields; ++f) shared[f][threadIdx.x] = values[f];
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) {
      for (int f = 0; f < kUnitFields; ++f) shared[f][threadIdx.x] += shared[f][threadIdx.x + stride];
    }
    __syncthreads();
  }
  for (int f = 0; f < kUnitFields; ++f) values[f] = shared[f][0];
  __syncthreads();
}

template <class T>
__device__ inline double block_count(const T* mask, int64_t count) {
  double values[kUnitFields] = {};
  for (int64_t i = threadIdx.x; i < count; i += kThreads) values[0] += static_cast<double>(mask[i]) != 0.0;
  block_sum(values);
  return values[0];
}

template <class C, class Token, class T, class A, class M, class G>
__global__ void __launch_bounds__(kThreads)
    policy_loss_units_kernel(core::PolicyLossInputs<T, A, M> in, int64_t unit_rows, bool per_row_mean,
                             double row_epsilon, dapo::detail::TokenParams<C> params, G* raw_grad, UnitSums* partials) {
  using Math = simd::Scalar<C>;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * unit_rows;
  // Group-token-mean: the group's token count scales every gradient of the group.
  const double unit_tokens = unit_rows > 1 ? block_count(in.mask + first_row * in.cols, unit_rows * in.cols) : 0.0;
  double sums[kUnitFields] = {};
  for (int64_t row = first_row; row < first_row + unit_rows; ++row) {
    const int64_t offset = row * in.cols;
    const double row_tokens = per_row_mean ? block_count(in.mask + offset, in.cols) : 0.0;
    const double factor = unit_rows > 1  ? (unit_tokens > 0.0 ? 1.0 / unit_tokens : 0.0)
                          : per_row_mean ? (row_tokens > 0.0 ? 1.0 / (row_tokens + row_epsilon) : 0.0)
                                         : 1.0;
    C row_log_ratio = C(0);
    if constexpr (Token::kRowLogRatio) {  // gspo: the row's mean log-ratio, in double as on the CPU
      double row_values[kUnitFields] = {};
      for (int64_t t = threadIdx.x; t < in.cols; t += kThreads) {
        const auto m = static_cast<double>(in.mask[offset + t]);
        if (m == 0.0) continue;
        row_values[0] += m * (static_cast<double>(in.logp[offset + t]) - static_cast<double>(in.old_logp[offset + t]));
        row_values[1] += m;
      }
      block_sum(row_values);
      row_log_ratio = static_cast<C>(row_values[0] / (row_values[1] > 1.0 ? row_values[1] : 1.0));
    }
    double row_sums[kUnitFields] = {};
    for (int64_t t = threadIdx.x; t < in.cols; t += kThreads) {
      const int64_t i = offset + t;
      const C m = static_cast<C>(in.mask[i]);
      const C advantage = static_cast<C>(in.per_token_advantages ? in.advantages[i] : in.advantages[row]);
      const dapo::detail::TokenInputs<C> inputs{static_cast<C>(in.logp[i]), static_cast<C>(in.old_logp[i]), advantage,
                                                row_log_ratio};
      auto token = Token::template terms<Math>(inputs, params);
      if (in.weights != nullptr) {
        const auto weight = static_cast<C>(in.weights[i]);
        token.loss = token.loss * weight;
        token.grad = token.grad * weight;
      }
      const bool on = m != C(0);
      row_sums[0] += on ? static_cast<double>(token.loss) : 0.0;
      row_sums[1] += static_cast<double>(m);
      row_sums[2] += on ? static_cast<double>(token.clipped) : 0.0;
      row_sums[3] += on ? static_cast<double>(token.dual_clipped) : 0.0;
      row_sums[4] += on ? static_cast<double>(token.kl) : 0.0;
      row_sums[6] += (on && m != C(1)) ? 1.0 : 0.0;
      if (raw_grad != nullptr) raw_grad[i] = static_cast<G>(on ? static_cast<double>(token.grad) * factor : 0.0);
    }
    block_sum(row_sums);
    row_sums[5] = row_sums[1] > 0.0 ? 1.0 : 0.0;
    if (per_row_mean || unit_rows > 1) row_sums[0] *= factor;
    for (int f = 0; f < kUnitFields; ++f) sums[f] += row_sums[f];
  }
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = UnitSums{sums[0], sums[1], sums[2], sums[3], sums[4], sums[5], sums[6]};
  }
}

template <class C, class Token, class T, class A, class M, class G>
void launch_units(const core::PolicyLossInputs<T, A, M>& in, int64_t units, int64_t unit_rows, bool per_row_mean,
                  const PolicyLossOptions& options, G* raw_grad, UnitSums* partials, cudaStream_t stream) {
  const auto params = dapo::detail::token_params<simd::Scalar<C>>(options);
  policy_loss_units_kernel<C, Token><<<static_cast<unsigned>(units), kThreads, 0, stream>>>(
      in, unit_rows, per_row_mean, options.count_epsilon, params, raw_grad, partials);
}

}  // namespace detail

// Whether launch_policy_loss computes options.mode: the token-level losses (all but geo_mean, kl_cov, clip_cov).
inline bool cuda_computes(const PolicyLossOptions& options) {
  return is_token_level(options.mode);
}

namespace detail {

template <bool kFamily, class C, class T, class A, class M, class G>
cudaError_t launch_impl(const core::PolicyLossInputs<T, A, M>& in, const PolicyLossOptions& options, G* raw_grad,
                        UnitSums* partials, cudaStream_t stream) {
  const int64_t units = policy_loss_units(in.rows, options);
  if (!cuda_computes(options)) return cudaErrorInvalidValue;
  if (!kFamily && (options.mode != PolicyLossMode::kVanilla || in.weights != nullptr || options.delta > 0.0)) {
    return cudaErrorInvalidValue;
  }
  if (units == 0) return cudaSuccess;
  const int64_t unit_rows = options.aggregation == LossAggregation::kGroupTokenMean ? options.group_size : 1;
  const bool per_row_mean = options.aggregation == LossAggregation::kSeqMeanTokenMean;
  namespace token = dapo::detail;
  const auto launch = [&](auto token_tag) {
    using Token = decltype(token_tag);
    launch_units<C, Token>(in, units, unit_rows, per_row_mean, options, raw_grad, partials, stream);
  };
  if constexpr (!kFamily) {
    if (options.dual_clip > 0.0) {
      launch(token::VanillaToken<true>{});
    } else {
      launch(token::VanillaToken<false>{});
    }
    return cudaGetLastError();
  }
  switch (options.mode) {
    case PolicyLossMode::kVanilla:
      if (options.delta > 0.0) {
        if (options.dual_clip > 0.0) {
          launch(token::VanillaToken<true, true>{});
        } else {
          launch(token::VanillaToken<false, true>{});
        }
      } else if (options.dual_clip > 0.0) {
        launch(token::VanillaToken<true>{});
      } else {
        launch(token::VanillaToken<false>{});
      }
      break;
    case PolicyLossMode::kGspo:
      launch(token::GspoToken{});
      break;
    case PolicyLossMode::kSapo:
      launch(token::SapoToken{});
      break;
    case PolicyLossMode::kCispo:
      launch(token::CispoToken{});
      break;
    case PolicyLossMode::kDppoTv:
      launch(token::DppoTvToken{});
      break;
    case PolicyLossMode::kDppoKl:
      launch(token::DppoKlToken{});
      break;
    case PolicyLossMode::kDro:
      launch(token::DroToken{});
      break;
    case PolicyLossMode::kGpg:
      launch(token::GpgToken{});
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace detail

// Launches the kernel on `stream`: partials must hold policy_loss_units(in.rows, options) entries (device memory);
// raw_grad [B, T] or null. C: the compute type (float, or double for double inputs). A loss that is not token-level
// returns cudaErrorInvalidValue without launching (cuda_computes says which). launch_vanilla_policy_loss launches
// vanilla without weights only (anything else: cudaErrorInvalidValue): a caller instantiating every input dtype
// does not instantiate every loss for each.
template <class C, class T, class A, class M, class G>
cudaError_t launch_policy_loss(const core::PolicyLossInputs<T, A, M>& in, const PolicyLossOptions& options, G* raw_grad,
                               UnitSums* partials, cudaStream_t stream) {
  return detail::launch_impl<true, C>(in, options, raw_grad, partials, stream);
}

template <class C, class T, class A, class M, class G>
cudaError_t launch_vanilla_policy_loss(const core::PolicyLossInputs<T, A, M>& in, const PolicyLossOptions& options,
                                       G* raw_grad, UnitSums* partials, cudaStream_t stream) {
  return detail::launch_impl<false, C>(in, options, raw_grad, partials, stream);
}

// Adds the units' sums (in unit order: host copies, or the device's in finish_units_kernel) into the batch's; returns
// the index of the first unit with an invalid mask value or, under group-token-mean, of the first group without a
// token; -1 when all are fine.
DAPO_HOST_DEVICE inline int64_t add_unit_sums(const UnitSums* host_partials, int64_t units, bool grouped,
                                              core::PolicyLossSums& total, bool& invalid_mask) {
  invalid_mask = false;
  for (int64_t u = 0; u < units; ++u) {
    const UnitSums& s = host_partials[u];
    if (s.invalid_mask > 0.0) {
      invalid_mask = true;
      return u;
    }
    if (grouped && s.tokens == 0.0) return u;
    total.loss += s.loss;
    total.tokens += s.tokens;
    total.clipped += s.clipped;
    total.dual_clipped += s.dual_clipped;
    total.kl += s.kl;
    total.nonempty_rows += static_cast<int64_t>(s.nonempty_rows);
  }
  return -1;
}

// The finished call on the device, float64 values in this order (launch_finish_policy_loss).
enum FinishedField : int {
  kFinishedLoss,
  kFinishedClipFraction,
  kFinishedDualClipFraction,
  kFinishedApproxKl,
  kFinishedGradScale,
  kFinishedDataCheck,  // 0: the data passed; 1: a bad mask value, an empty group or counts beyond the global ones
  kFinishedFields
};

namespace detail {

// One thread: the units' sums in unit order, then core::finish_policy_loss's arithmetic, so the values are the bits
// the host would compute from the same partials, and the data checks are a flag instead of an exception. (A template,
// as every kernel here, so that each program's .cu files share one definition.)
template <class Options>
__global__ void finish_units_kernel(const UnitSums* partials, int64_t units, bool grouped, int64_t rows, int64_t cols,
                                    Options options, double* finished) {
  core::PolicyLossSums total;
  bool invalid_mask = false;
  const bool bad =
      add_unit_sums(partials, units, grouped, total, invalid_mask) >= 0 || core::beyond_global_counts(total, options);
  const core::PolicyLossKernelResult out =
      core::scaled_result(total, core::aggregation_scale(total, rows, cols, options), options);
  finished[kFinishedLoss] = out.result.loss;
  finished[kFinishedClipFraction] = out.result.clip_fraction;
  finished[kFinishedDualClipFraction] = out.result.dual_clip_fraction;
  finished[kFinishedApproxKl] = out.result.approx_kl;
  finished[kFinishedGradScale] = out.grad_scale;
  finished[kFinishedDataCheck] = bad ? 1.0 : 0.0;
}

}  // namespace detail

// Finishes a call on `stream` from the kernel's partials (device memory, policy_loss_units entries) into finished
// (device memory, kFinishedFields doubles): no copy to the host, nothing waits.
inline cudaError_t launch_finish_policy_loss(const UnitSums* partials, int64_t units, int64_t rows, int64_t cols,
                                             const PolicyLossOptions& options, double* finished, cudaStream_t stream) {
  const bool grouped = options.aggregation == LossAggregation::kGroupTokenMean;
  detail::finish_units_kernel<PolicyLossOptions>
      <<<1, 1, 0, stream>>>(partials, units, grouped, rows, cols, options, finished);
  return cudaGetLastError();
}

}  // namespace dapo::cuda
