// The policy-gradient losses on plain buffers: loss, metrics and d loss / d logp, for every loss by its verl name
// (<dapo/core/policy_loss_options.hpp>: vanilla = DAPO's Eq. 8 with Clip-Higher, Eq. 10, and the family verl and
// TRL users compare it with) and every aggregation. No LibTorch here; <dapo/loss.hpp> is the tensor front end.
//
// Shapes: B = rows (responses), T = cols (response tokens, right-padded); every [B, T] buffer is row-major.
//   logp, old_logp, mask [B, T]; advantages [B] (one per response, broadcast over tokens) or [B, T];
//   weights [B, T] (verl's rollout_is_weights: each token's loss is multiplied by its weight) or none.
//
// The token-level losses run in one fused pass (<dapo/core/policy_loss/kernel.hpp>); geo_mean (a loss per row),
// kl_cov and clip_cov (which choose tokens by a statistic of the whole call) have kernels of their own beside it.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>

#include "dapo/core/error.hpp"
#include "dapo/core/kernel_abi.hpp"
#include "dapo/core/policy_loss/clip_cov.hpp"
#include "dapo/core/policy_loss/geo_mean.hpp"
#include "dapo/core/policy_loss/kernel.hpp"
#include "dapo/core/policy_loss/kl_cov.hpp"
#include "dapo/core/policy_loss_options.hpp"

namespace dapo {
namespace detail {

// Kept for callers written before check_policy_loss_options was public.
using dapo::check_policy_loss_options;

}  // namespace detail

namespace core {
inline namespace DAPO_KERNEL_ABI {  // the CPU kernel: see kernel_abi.hpp

// Any loss on its kernel: the fused pass for the token-level ones, geo_mean's, kl_cov's and clip_cov's own otherwise
// (clip_cov draws its tokens with `choose`).
template <class C, class T, class A, class M, class G, class ParallelFor = SerialFor>
PolicyLossKernelResult any_policy_loss_kernel(const PolicyLossInputs<T, A, M>& in, const PolicyLossOptions& options,
                                              G* raw_grad, const char* where, const ParallelFor& parallel = {},
                                              const ClipCovChoice& choose = {}) {
  switch (options.mode) {
    case PolicyLossMode::kGeoMean:
      return geo_mean_kernel(in, options, raw_grad, where);
    case PolicyLossMode::kKlCov:
      return kl_cov_kernel(in, options, raw_grad, where);
    case PolicyLossMode::kClipCov:
      return clip_cov_kernel(in, options, raw_grad, where, choose);
    default:
      return policy_loss_kernel<C>(in, options, raw_grad, where, parallel);
  }
}

// logp, old_logp, mask [B, T]; advantages [B] or [B, T]; grad_logp [B, T] or empty (then no gradient is written);
// weights [B, T] or empty; choose: clip_cov's random draw (dapo::clip_cov_choice(generator)), required by clip_cov.
// Computes in T (float or double), sums in double. With no masked token at all the loss, the metrics and the gradient
// are 0, except under kGroupTokenMean, where every group must hold a token (an empty group has no mean).
template <std::floating_point T>
PolicyLossResult policy_loss(std::span<const T> logp, std::span<const T> old_logp, std::span<const T> advantages,
                             std::span<const T> mask, int64_t rows, int64_t cols, const PolicyLossOptions& options = {},
                             std::span<T> grad_logp = {}, std::span<const T> weights = {},
                             const ClipCovChoice& choose = {}) {
  constexpr const char* kWhere = "dapo::core::policy_loss";
  DAPO_REQUIRE(rows >= 0 && cols >= 0, kWhere, "shape [", rows, ", ", cols, "] has a negative extent");
  const auto size = static_cast<std::size_t>(rows * cols);
  DAPO_REQUIRE(logp.size() == size, kWhere, "logp has ", logp.size(), " elements, expected B * T = ", rows, " * ",
               cols);
  DAPO_REQUIRE(old_logp.size() == size, kWhere, "old_logp has ", old_logp.size(), " elements but logp has ", size);
  DAPO_REQUIRE(mask.size() == size, kWhere, "mask has ", mask.size(), " elements but logp has ", size);
  DAPO_REQUIRE(advantages.size() == static_cast<std::size_t>(rows) || advantages.size() == size, kWhere,
               "advantages has ", advantages.size(), " elements, expected B = ", rows, " or B * T = ", size);
  DAPO_REQUIRE(grad_logp.empty() || grad_logp.size() == size, kWhere, "grad_logp has ", grad_logp.size(),
               " elements, expected 0 (no gradient) or ", size);
  DAPO_REQUIRE(weights.empty() || weights.size() == size, kWhere, "weights has ", weights.size(),
               " elements, expected 0 (none) or ", size);
  dapo::check_policy_loss_options(options, rows, kWhere);

  const PolicyLossInputs<T, T, T> inputs{logp.data(),
                                         old_logp.data(),
                                         advantages.data(),
                                         mask.data(),
                                         rows,
                                         cols,
                                         advantages.size() == size && cols != 1,
                                         weights.empty() ? nullptr : weights.data()};
  T* grad = grad_logp.empty() ? nullptr : grad_logp.data();
  const auto out = any_policy_loss_kernel<T>(inputs, options, grad, kWhere, SerialFor{}, choose);
  detail::scale_rows(grad, 0, rows, cols, out.grad_scale);
  return out.result;
}

// Under DAPO_SEPARATE_COMPILATION, float and double are compiled in one translation unit of the program
// (kernel_abi.hpp).
#define DAPO_CORE_POLICY_LOSS_INSTANCE(T)                                                                         \
  PolicyLossResult policy_loss<T>(std::span<const T>, std::span<const T>, std::span<const T>, std::span<const T>, \
                                  int64_t, int64_t, const PolicyLossOptions&, std::span<T>, std::span<const T>,   \
                                  const ClipCovChoice&)
#if !DAPO_DEFINE_CORE_KERNELS
extern template DAPO_CORE_POLICY_LOSS_INSTANCE(float);
extern template DAPO_CORE_POLICY_LOSS_INSTANCE(double);
#elif defined(DAPO_SEPARATE_COMPILATION)
template DAPO_CORE_POLICY_LOSS_INSTANCE(float);
template DAPO_CORE_POLICY_LOSS_INSTANCE(double);
#endif
#undef DAPO_CORE_POLICY_LOSS_INSTANCE

}  // namespace DAPO_KERNEL_ABI
}  // namespace core
}  // namespace dapo
