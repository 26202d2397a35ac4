// The DAPO policy-gradient loss (Eq. 8 with Clip-Higher, Eq. 10, and the other aggregations for comparison) on plain
// buffers: loss, metrics and d loss / d logp in one pass. No LibTorch here; <dapo/loss.hpp> is the tensor front end.
//
// Shapes: B = rows (responses), T = cols (response tokens, right-padded); every [B, T] buffer is row-major.
//   logp, old_logp, mask [B, T]; advantages [B] (one per response, broadcast over tokens) or [B, T].
//
// Per token (verl core_algos.compute_policy_loss_vanilla, which follows Eq. 8):
//   ratio = exp(clamp(logp - old_logp, -20, 20))
//   pg    = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))
//   pg    = min(pg, -A * dual_clip)            only where A < 0 and dual_clip > 0 (dual-clip PPO)
// The aggregation turns pg [B, T] into one number; every mode is a per-row weight w_b times the masked token sum,
// loss = sum_b w_b * sum_t mask[b,t] * pg[b,t], which is what lets one pass produce the loss and its gradient.
// A micro-batch of a larger mini-batch computes its exact share of the mini-batch's loss when the batch-wide part of
// w_b comes from the whole mini-batch (the global_* options; <dapo/core/accumulation.hpp> fills them in).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dapo/core/error.hpp"
#include "dapo/core/parallel.hpp"
#include "dapo/core/simd.hpp"

namespace dapo {

// How per-token losses become the scalar loss. Explicit, never implied (verl: loss_agg_mode; TRL: loss_type).
enum class LossAggregation {
  kTokenMean,           // DAPO Eq. 8/12: sum over all tokens of the batch / token count ("token-mean", TRL "dapo")
  kGroupTokenMean,      // per group of group_size rows: token sum / token count, then mean over groups (seed, Eq. 8)
  kSeqMeanTokenMean,    // GRPO: mean over responses of the response's token mean ("seq-mean-token-mean", TRL "grpo")
  kSeqMeanTokenSum,     // mean over responses of the response's token sum ("seq-mean-token-sum")
  kSeqMeanTokenSumNorm  // Dr. GRPO: token sum / (norm_length * rows) ("seq-mean-token-sum-norm", TRL "dr_grpo")
};

struct PolicyLossOptions {
  double clip_low = 0.2, clip_high = 0.28;  // decoupled clip (Clip-Higher): epsilon_low, epsilon_high of Eq. 10
  double dual_clip = 0.0;                   // c > 1 bounds the loss of A < 0 tokens at -A*c; 0 disables
  LossAggregation aggregation = LossAggregation::kTokenMean;
  int64_t group_size = 0;    // required by kGroupTokenMean
  double norm_length = 0.0;  // kSeqMeanTokenSumNorm divisor per row; 0 means this call's T
  // The whole mini-batch's count that the aggregation divides by, when this call is one micro-batch (on one rank) of
  // it; 0 means this call's own count. Each applies to its modes only and must be at least this call's own count.
  // dapo::micro_batch_options sets the right one from the mini-batch's counts.
  double global_token_count = 0.0;  // kTokenMean: masked tokens
  double global_group_count = 0.0;  // kGroupTokenMean: groups of group_size rows
  double global_row_count = 0.0;    // kSeqMeanTokenMean, kSeqMeanTokenSum: rows with a masked token;
                                    // kSeqMeanTokenSumNorm: rows
};

// verl's loss_agg_mode names.
constexpr std::array<std::pair<LossAggregation, std::string_view>, 5> kAggregationNames{{
    {LossAggregation::kTokenMean, "token-mean"},
    {LossAggregation::kGroupTokenMean, "group-token-mean"},
    {LossAggregation::kSeqMeanTokenMean, "seq-mean-token-mean"},
    {LossAggregation::kSeqMeanTokenSum, "seq-mean-token-sum"},
    {LossAggregation::kSeqMeanTokenSumNorm, "seq-mean-token-sum-norm"},
}};

inline std::string_view aggregation_name(LossAggregation aggregation) {
  for (const auto& [value, name] : kAggregationNames) {
    if (value == aggregation) return name;
  }
  DAPO_REQUIRE(false, "dapo::aggregation_name", "unknown LossAggregation value ", static_cast<int>(aggregation));
  return {};
}

inline LossAggregation aggregation_from_name(std::string_view name) {
  std::string known;
  for (const auto& [value, known_name] : kAggregationNames) {
    if (known_name == name) return value;
    known += (known.empty() ? "" : ", ") + std::string(known_name);
  }
  DAPO_REQUIRE(false, "dapo::aggregation_from_name", "unknown loss aggregation '", name, "', expected one of ", known);
  return {};
}

namespace detail {

// A global_* count: finite, >= 0, and set only for the aggregations it applies to.
inline void check_global_count(double count, const char* name, bool applies, LossAggregation aggregation,
                               const char* description, const char* where) {
  DAPO_REQUIRE(std::isfinite(count) && count >= 0.0, where, name, " is ", count,
               ", expected a finite value >= 0 (0 = this call's own count)");
  DAPO_REQUIRE(count == 0.0 || applies, where, name, " is ", count, " but aggregation is ",
               aggregation_name(aggregation), "; ", description);
}

}  // namespace detail

// The checks of PolicyLossOptions that need only the options and the height of the batch (rows) they will be used
// with; both front ends call them first. `where` names the caller in the message ("dapo::policy_loss").
inline void check_policy_loss_options(const PolicyLossOptions& options, int64_t rows, const char* where) {
  DAPO_REQUIRE(std::isfinite(options.clip_low) && options.clip_low >= 0.0 && options.clip_low <= 1.0, where,
               "clip_low is ", options.clip_low,
               ", expected a value in [0, 1] (the ratio's lower bound is 1 - clip_low)");
  DAPO_REQUIRE(std::isfinite(options.clip_high) && options.clip_high >= 0.0, where, "clip_high is ", options.clip_high,
               ", expected a finite value >= 0");
  DAPO_REQUIRE(options.dual_clip == 0.0 || (std::isfinite(options.dual_clip) && options.dual_clip > 1.0), where,
               "dual_clip is ", options.dual_clip, ", expected 0 (disabled) or a finite value > 1");
  DAPO_REQUIRE(std::isfinite(options.norm_length) && options.norm_length >= 0.0, where, "norm_length is ",
               options.norm_length, ", expected a finite value >= 0 (0 means T)");
  const LossAggregation mode = options.aggregation;
  detail::check_global_count(options.global_token_count, "global_token_count", mode == LossAggregation::kTokenMean,
                             mode, "a global token count only applies to token-mean", where);
  detail::check_global_count(options.global_group_count, "global_group_count", mode == LossAggregation::kGroupTokenMean,
                             mode, "a global group count only applies to group-token-mean", where);
  detail::check_global_count(options.global_row_count, "global_row_count",
                             mode == LossAggregation::kSeqMeanTokenMean || mode == LossAggregation::kSeqMeanTokenSum ||
                                 mode == LossAggregation::kSeqMeanTokenSumNorm,
                             mode,
                             "a global row count only applies to seq-mean-token-mean, seq-mean-token-sum and "
                             "seq-mean-token-sum-norm",
                             where);
  if (mode == LossAggregation::kGroupTokenMean) {
    DAPO_REQUIRE(options.group_size >= 1, where, "aggregation group-token-mean needs group_size >= 1, got ",
                 options.group_size);
    DAPO_REQUIRE(rows % options.group_size == 0, where, "batch has ", rows,
                 " rows, which group_size = ", options.group_size, " does not divide (group-token-mean)");
    const int64_t groups = rows / options.group_size;
    DAPO_REQUIRE(options.global_group_count == 0.0 || options.global_group_count >= static_cast<double>(groups), where,
                 "global_group_count is ", options.global_group_count, " but this batch alone holds ", groups,
                 " groups (", rows, " rows / group_size ", options.group_size, ")");
  }
  // The seq-mean modes count rows with a masked token, which only the data pass knows (finish_policy_loss).
  if (mode == LossAggregation::kSeqMeanTokenSumNorm) {
    DAPO_REQUIRE(options.global_row_count == 0.0 || options.global_row_count >= static_cast<double>(rows), where,
                 "global_row_count is ", options.global_row_count, " but this batch alone holds ", rows, " rows");
  }
}

namespace detail {

// Kept for callers written before check_policy_loss_options was public.
using dapo::check_policy_loss_options;

// One token (or one SIMD register of tokens) of the clipped objective: its loss, d loss / d logp, and which clips
// decided it, in the arithmetic of Math (<dapo/core/simd.hpp>: Scalar<double>, Scalar<float>, FloatVector).
// Derivatives follow autograd through clamp (the gradient passes on [min, max] inclusive) and max/min (a tie splits it
// in half), so they equal a PyTorch composite's. Every branch is a select; the same code runs in CUDA kernels.
template <class V>
struct TokenTerms {
  V loss, grad;
  V clipped;       // 1 where -A * clamp(ratio) > -A * ratio: the trust region bound the update
  V dual_clipped;  // 1 where A < 0 and the loss was capped at -A * dual_clip
  V kl;            // old_logp - logp, clamped like the log-ratio
};

template <class Math, bool kDualClip, class V = typename Math::Value>
DAPO_HOST_DEVICE DAPO_INLINE TokenTerms<V> clipped_token(const V& log_ratio, const V& advantage, const V& low,
                                                         const V& high, const V& dual_clip) {
  const V bound = Math::splat(20.0), zero = Math::splat(0.0), one = Math::splat(1.0);
  const auto log_ratio_inside = (log_ratio >= -bound) & (log_ratio <= bound);
  const V bounded = Math::select(log_ratio < -bound, -bound, Math::select(log_ratio > bound, bound, log_ratio));
  const V ratio = Math::exp(bounded);  // NaN stays NaN
  const V clamped_ratio = Math::select(ratio < low, low, Math::select(ratio > high, high, ratio));
  const V unclipped_loss = zero - advantage * ratio;
  const V clipped_loss = zero - advantage * clamped_ratio;
  const auto clipped = clipped_loss > unclipped_loss;
  // max(unclipped, clipped) and its derivative. Where the clipped term wins, the ratio lies strictly outside
  // [low, high], so clamp passes no gradient; everywhere else the unclipped derivative is the answer, ties included
  // (inside the interval both terms are equal with equal derivatives; with A = 0 the derivative is 0 anyway).
  V loss = Math::select(clipped, clipped_loss, unclipped_loss);
  V grad = Math::select(clipped, zero, zero - advantage * Math::select(log_ratio_inside, ratio, zero));
  V dual_clipped = zero;
  if constexpr (kDualClip) {
    const V cap = zero - advantage * dual_clip;
    const auto negative = advantage < zero;
    const auto capped = negative & (loss > cap);
    grad = Math::select(capped, zero, Math::select(negative & (loss == cap), Math::splat(0.5) * grad, grad));
    loss = Math::select(capped, cap, loss);
    dual_clipped = Math::select(capped, one, zero);
  }
  return {loss, grad, Math::select(clipped, one, zero), dual_clipped, zero - bounded};
}

}  // namespace detail

namespace core {

struct PolicyLossResult {
  double loss = 0.0;
  double clip_fraction = 0.0;       // share of masked tokens where the (decoupled) clip bound the loss
  double dual_clip_fraction = 0.0;  // share of masked tokens capped by the dual clip (0 when dual_clip = 0)
  double approx_kl = 0.0;           // masked mean of old_logp - logp (log-ratio clamped to [-20, 20])
  double token_count = 0.0;         // mask.sum() of this call
};

// The buffers of one call, row-major. T: logp element type (float, double, or a 16-bit float type convertible to
// float); A: advantages; M: mask (bool or a floating type holding 0 and 1).
template <class T, class A, class M>
struct PolicyLossInputs {
  const T* logp = nullptr;        // [B, T]
  const T* old_logp = nullptr;    // [B, T]
  const A* advantages = nullptr;  // [B], or [B, T] when per_token_advantages
  const M* mask = nullptr;        // [B, T]
  int64_t rows = 0, cols = 0;
  bool per_token_advantages = false;
};

// The kernel's answer: the loss and metrics, and grad_scale, the factor that turns the raw gradient it wrote into
// d loss / d logp. The factor is global to the batch (1 / token count, 1 / groups, ...), so it is applied later, in the
// pass that has to touch the gradient anyway (the backward's multiply by grad_output), instead of in a pass of its own.
struct PolicyLossKernelResult {
  PolicyLossResult result;
  double grad_scale = 0.0;
};

// Sums over masked tokens, each already weighted by its row's or group's own factor (see policy_loss_kernel). Any
// device's kernel produces these; finish_policy_loss turns them into the result.
struct PolicyLossSums {
  double loss = 0.0, tokens = 0.0, clipped = 0.0, dual_clipped = 0.0, kl = 0.0;
  int64_t nonempty_rows = 0;

  void add(const PolicyLossSums& other) {
    loss += other.loss;
    tokens += other.tokens;
    clipped += other.clipped;
    dual_clipped += other.dual_clipped;
    kl += other.kl;
    nonempty_rows += other.nonempty_rows;
  }
};

}  // namespace core

namespace detail {
inline namespace DAPO_KERNEL_ABI {  // the CPU kernel: see kernel_abi.hpp

// Sums of one block of rows, in double. Blocks are fixed by the shape, not by the thread count, and are added in
// order, so results do not depend on how many threads ran.
struct BlockSums {
  core::PolicyLossSums sums;
  std::string error;  // the first bad input found in the block
};

using RowSums = core::PolicyLossSums;

// Accumulators of one chunk of a row, in the compute type.
template <class Math>
struct ChunkSums {
  using V = typename Math::Value;
  V loss = Math::splat(0.0), tokens = Math::splat(0.0), clipped = Math::splat(0.0), dual_clipped = Math::splat(0.0),
    kl = Math::splat(0.0), invalid = Math::splat(0.0);
};

// kLanes tokens starting at t (the first `lanes` of them when partial: padding lanes load mask 0 and add nothing).
template <class Math, bool kPartial, class P>
DAPO_INLINE typename Math::Value load_lanes(const P* p, int64_t lanes) {
  if constexpr (kPartial) {
    return Math::load_partial(p, lanes);
  } else {
    return Math::load(p);
  }
}

// What one row loop instantiation does, fixed at compile time so the loop carries no branch and no dead accumulator.
template <bool kPerTokenAdvantage_, bool kDualClip_, bool kWithGrad_>
struct RowVariant {
  static constexpr bool kPerTokenAdvantage = kPerTokenAdvantage_, kDualClip = kDualClip_, kWithGrad = kWithGrad_;
};

template <class Math, class Variant, bool kPartial, class T, class A, class M, class G>
DAPO_INLINE void loss_lanes(const T* logp, const T* old_logp, const A* advantages, const M* mask,
                            const typename Math::Value& row_advantage, int64_t t, int64_t lanes,
                            const typename Math::Value& low, const typename Math::Value& high,
                            const typename Math::Value& dual_clip, G* grad, ChunkSums<Math>& sums) {
  using V = typename Math::Value;
  const V m = load_lanes<Math, kPartial>(mask + t, lanes);
  V advantage = row_advantage;
  if constexpr (Variant::kPerTokenAdvantage) advantage = load_lanes<Math, kPartial>(advantages + t, lanes);
  const V log_ratio = load_lanes<Math, kPartial>(logp + t, lanes) - load_lanes<Math, kPartial>(old_logp + t, lanes);
  const auto token = dapo::detail::clipped_token<Math, Variant::kDualClip>(log_ratio, advantage, low, high, dual_clip);
  // A masked-out token contributes exactly 0, even when its inputs are garbage (padding may hold NaN).
  const V zero = Math::splat(0.0), one = Math::splat(1.0);
  const auto on = m != zero;
  if constexpr (!std::is_same_v<M, bool>) sums.invalid = sums.invalid + Math::select(on & (m != one), one, zero);
  sums.loss = sums.loss + Math::select(on, token.loss, zero);
  sums.tokens = sums.tokens + m;
  sums.clipped = sums.clipped + Math::select(on, token.clipped, zero);
  if constexpr (Variant::kDualClip) sums.dual_clipped = sums.dual_clipped + Math::select(on, token.dual_clipped, zero);
  sums.kl = sums.kl + Math::select(on, token.kl, zero);
  if constexpr (Variant::kWithGrad) {
    if constexpr (kPartial) {
      Math::store_partial(grad + t, Math::select(on, token.grad, zero), lanes);
    } else {
      Math::store(grad + t, Math::select(on, token.grad, zero));
    }
  }
}

template <class Math, class Variant, class T, class A, class M, class G>
DAPO_INLINE bool loss_row_variant(const core::PolicyLossInputs<T, A, M>& in, int64_t row, double low_bound,
                                  double high_bound, double dual_clip_value, G* grad, RowSums& sums, int64_t& bad_col) {
  constexpr int64_t kLanes = Math::kLanes;
  constexpr int64_t kChunk = 64 * kLanes;  // partial sums in the compute type stay short; their totals go to double
  const auto low = Math::splat(low_bound), high = Math::splat(high_bound), dual_clip = Math::splat(dual_clip_value);
  const int64_t offset = row * in.cols;
  const T* logp = in.logp + offset;
  const T* old_logp = in.old_logp + offset;
  const M* mask = in.mask + offset;
  const A* advantages = Variant::kPerTokenAdvantage ? in.advantages + offset : nullptr;
  const auto row_advantage = Math::splat(Variant::kPerTokenAdvantage ? 0.0 : static_cast<double>(in.advantages[row]));
  G* grad_row = Variant::kWithGrad ? grad + offset : nullptr;
  for (int64_t start = 0; start < in.cols; start += kChunk) {
    const int64_t stop = start + kChunk < in.cols ? start + kChunk : in.cols;
    ChunkSums<Math> chunk;
    int64_t t = start;
    for (; t + kLanes <= stop; t += kLanes) {
      loss_lanes<Math, Variant, false>(logp, old_logp, advantages, mask, row_advantage, t, kLanes, low, high, dual_clip,
                                       grad_row, chunk);
    }
    if (t < stop) {
      loss_lanes<Math, Variant, true>(logp, old_logp, advantages, mask, row_advantage, t, stop - t, low, high,
                                      dual_clip, grad_row, chunk);
    }
    if (Math::sum(chunk.invalid) != 0.0) {
      for (int64_t col = start; col < stop; ++col) {
        const double m = static_cast<double>(mask[col]);
        if (m != 0.0 && m != 1.0) {
          bad_col = col;
          return false;
        }
      }
    }
    sums.loss += Math::sum(chunk.loss);
    sums.tokens += Math::sum(chunk.tokens);
    sums.clipped += Math::sum(chunk.clipped);
    sums.dual_clipped += Math::sum(chunk.dual_clipped);
    sums.kl += Math::sum(chunk.kl);
  }
  return true;
}

// One row: raw per-token gradient into grad (when not null) and the row's sums. Returns false on a mask value that
// is neither 0 nor 1 (its column in bad_col). low_bound, high_bound: the ratio's clip interval.
template <class Math, bool kPerTokenAdvantage, class T, class A, class M, class G>
DAPO_INLINE bool loss_row(const core::PolicyLossInputs<T, A, M>& in, int64_t row, double low_bound, double high_bound,
                          double dual_clip, G* grad, RowSums& sums, int64_t& bad_col) {
  // No lambda here: it would not be inlined, and so not compiled for the caller's instruction set.
  using WithDualClip = RowVariant<kPerTokenAdvantage, true, true>;
  using WithDualClipNoGrad = RowVariant<kPerTokenAdvantage, true, false>;
  using Plain = RowVariant<kPerTokenAdvantage, false, true>;
  using PlainNoGrad = RowVariant<kPerTokenAdvantage, false, false>;
  if (dual_clip > 0.0) {
    if (grad != nullptr) {
      return loss_row_variant<Math, WithDualClip>(in, row, low_bound, high_bound, dual_clip, grad, sums, bad_col);
    }
    return loss_row_variant<Math, WithDualClipNoGrad>(in, row, low_bound, high_bound, dual_clip, grad, sums, bad_col);
  }
  if (grad != nullptr)
    return loss_row_variant<Math, Plain>(in, row, low_bound, high_bound, dual_clip, grad, sums, bad_col);
  return loss_row_variant<Math, PlainNoGrad>(in, row, low_bound, high_bound, dual_clip, grad, sums, bad_col);
}

// loss_row as a kernel for simd::run: one instantiation per arithmetic (Scalar, FloatVector<4, 8, 16>).
template <bool kPerTokenAdvantage>
struct LossRowKernel {
  template <class Math, class T, class A, class M, class G>
  DAPO_INLINE static bool run(const core::PolicyLossInputs<T, A, M>& in, const int64_t& row, const double& low,
                              const double& high, const double& dual_clip, G* const& grad, RowSums& sums,
                              int64_t& bad_col) {
    return loss_row<Math, kPerTokenAdvantage>(in, row, low, high, dual_clip, grad, sums, bad_col);
  }
};

inline std::string empty_group_message(const char* where, int64_t group, int64_t group_size) {
  return dapo::detail::concat(where, ": group ", group, " (rows ", group * group_size, "..",
                              (group + 1) * group_size - 1,
                              ") has no masked token; group-token-mean is undefined for it");
}

template <class G>
void scale_rows(G* grad, int64_t first_row, int64_t last_row, int64_t cols, double factor) {
  if (grad == nullptr || factor == 1.0) return;
  const auto scale = static_cast<G>(factor);
  for (int64_t i = first_row * cols; i < last_row * cols; ++i) grad[i] *= scale;
}

}  // namespace DAPO_KERNEL_ABI
}  // namespace detail

namespace core {
inline namespace DAPO_KERNEL_ABI {  // the CPU kernel: see kernel_abi.hpp

// The loss, the metrics and grad_scale from the weighted sums of a whole batch (any device's kernel). grad_scale is
// the batch-wide factor of the aggregation: 1 / the count it divides by, this call's own or the options' global one.
inline PolicyLossKernelResult finish_policy_loss(const PolicyLossSums& total, int64_t rows, int64_t cols,
                                                 const PolicyLossOptions& options, const char* where) {
  DAPO_REQUIRE(options.global_token_count == 0.0 || options.global_token_count >= total.tokens, where,
               "global_token_count is ", options.global_token_count, " but this batch alone holds ", total.tokens,
               " masked tokens");
  const bool seq_mean = options.aggregation == LossAggregation::kSeqMeanTokenMean ||
                        options.aggregation == LossAggregation::kSeqMeanTokenSum;
  DAPO_REQUIRE(!seq_mean || options.global_row_count == 0.0 ||
                   options.global_row_count >= static_cast<double>(total.nonempty_rows),
               where, "global_row_count is ", options.global_row_count, " but this batch alone holds ",
               total.nonempty_rows, " rows with a masked token");
  double scale = 0.0;
  switch (options.aggregation) {
    case LossAggregation::kTokenMean: {
      const double denominator = options.global_token_count > 0.0 ? options.global_token_count : total.tokens;
      scale = denominator > 0.0 ? 1.0 / denominator : 0.0;
      break;
    }
    case LossAggregation::kGroupTokenMean:
      if (options.global_group_count > 0.0) {
        scale = 1.0 / options.global_group_count;
      } else {
        scale = rows > 0 ? static_cast<double>(options.group_size) / static_cast<double>(rows) : 0.0;
      }
      break;
    case LossAggregation::kSeqMeanTokenMean:
    case LossAggregation::kSeqMeanTokenSum: {
      const double denominator =
          options.global_row_count > 0.0 ? options.global_row_count : static_cast<double>(total.nonempty_rows);
      scale = denominator > 0.0 ? 1.0 / denominator : 0.0;
      break;
    }
    case LossAggregation::kSeqMeanTokenSumNorm: {
      const double norm_length = options.norm_length > 0.0 ? options.norm_length : static_cast<double>(cols);
      const double row_count = options.global_row_count > 0.0 ? options.global_row_count : static_cast<double>(rows);
      // 0 when the batch has no row or no column (nothing to average), never 1/0.
      const double denominator = norm_length * row_count;
      scale = denominator > 0.0 ? 1.0 / denominator : 0.0;
      break;
    }
  }
  PolicyLossKernelResult out;
  out.grad_scale = scale;
  out.result.loss = total.loss * scale;
  out.result.token_count = total.tokens;
  if (total.tokens > 0.0) {
    out.result.clip_fraction = total.clipped / total.tokens;
    out.result.dual_clip_fraction = total.dual_clipped / total.tokens;
    out.result.approx_kl = total.kl / total.tokens;
  }
  return out;
}

// The fused policy loss: one pass over the inputs writes the raw gradient (when raw_grad is not null) and returns the
// loss, the metrics and grad_scale (d loss / d logp = raw_grad * grad_scale). The per-row part of each aggregation's
// weight (1 / response tokens, 1 / group tokens) is applied while the row or group is still in cache.
// Checks the data (mask values, empty groups, global token and row counts); the caller has checked shapes and options.
// float_lanes: the SIMD width for float compute (0: the widest this CPU runs; 4, 8, 16 to force one, for tests).
template <class C, class T, class A, class M, class G, class ParallelFor = SerialFor>
PolicyLossKernelResult policy_loss_kernel(const PolicyLossInputs<T, A, M>& in, const PolicyLossOptions& options,
                                          G* raw_grad, const char* where, const ParallelFor& parallel = {},
                                          int float_lanes = 0) {
  const bool grouped = options.aggregation == LossAggregation::kGroupTokenMean;
  const int64_t unit = grouped ? options.group_size : 1;  // a block never splits a group
  constexpr int64_t kBlockTokens = 1 << 15;
  const int64_t rows_per_unit_block = in.cols > 0 ? (kBlockTokens / (in.cols * unit)) : 1;
  const int64_t block_rows = unit * (rows_per_unit_block > 1 ? rows_per_unit_block : 1);
  const int64_t num_blocks = (in.rows + block_rows - 1) / block_rows;
  std::vector<detail::BlockSums> blocks(static_cast<std::size_t>(num_blocks));

  const double low = 1.0 - options.clip_low, high = 1.0 + options.clip_high;
  const int lanes = simd::resolve_float_lanes(float_lanes, where);
  const bool per_row_mean = options.aggregation == LossAggregation::kSeqMeanTokenMean;

  parallel(num_blocks, [&](int64_t first_block, int64_t last_block) {
    for (int64_t block = first_block; block < last_block; ++block) {
      detail::BlockSums& block_sums = blocks[static_cast<std::size_t>(block)];
      const int64_t block_end = (block + 1) * block_rows < in.rows ? (block + 1) * block_rows : in.rows;
      for (int64_t unit_start = block * block_rows; unit_start < block_end; unit_start += unit) {
        PolicyLossSums unit_sums;
        for (int64_t row = unit_start; row < unit_start + unit; ++row) {
          PolicyLossSums row_sums;
          int64_t bad_col = 0;
          const bool ok = in.per_token_advantages
                              ? simd::run<C, detail::LossRowKernel<true>>(lanes, in, row, low, high, options.dual_clip,
                                                                          raw_grad, row_sums, bad_col)
                              : simd::run<C, detail::LossRowKernel<false>>(lanes, in, row, low, high, options.dual_clip,
                                                                           raw_grad, row_sums, bad_col);
          if (!ok) {
            const M value = in.mask[row * in.cols + bad_col];
            block_sums.error = dapo::detail::concat(where, ": mask[", row, ", ", bad_col, "] is ",
                                                    static_cast<double>(value), ", expected 0 or 1");
            return;
          }
          row_sums.nonempty_rows = row_sums.tokens > 0.0;
          if (per_row_mean && row_sums.tokens > 0.0) {
            detail::scale_rows(raw_grad, row, row + 1, in.cols, 1.0 / row_sums.tokens);
            row_sums.loss /= row_sums.tokens;
          }
          unit_sums.add(row_sums);
        }
        if (grouped) {
          if (unit_sums.tokens == 0.0) {
            block_sums.error = detail::empty_group_message(where, unit_start / unit, unit);
            return;
          }
          detail::scale_rows(raw_grad, unit_start, unit_start + unit, in.cols, 1.0 / unit_sums.tokens);
          unit_sums.loss /= unit_sums.tokens;
        }
        block_sums.sums.add(unit_sums);
      }
    }
  });

  PolicyLossSums total;
  for (const auto& block : blocks) {
    if (!block.error.empty()) throw std::invalid_argument(block.error);
    total.add(block.sums);
  }
  return finish_policy_loss(total, in.rows, in.cols, options, where);
}

// logp, old_logp, mask [B, T]; advantages [B] or [B, T]; grad_logp [B, T] or empty (then no gradient is written).
// Computes in T (float or double), sums in double. With no masked token at all the loss, the metrics and the gradient
// are 0, except under kGroupTokenMean, where every group must hold a token (an empty group has no mean).
template <std::floating_point T>
PolicyLossResult policy_loss(std::span<const T> logp, std::span<const T> old_logp, std::span<const T> advantages,
                             std::span<const T> mask, int64_t rows, int64_t cols, const PolicyLossOptions& options = {},
                             std::span<T> grad_logp = {}) {
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
  dapo::check_policy_loss_options(options, rows, kWhere);

  const PolicyLossInputs<T, T, T> inputs{
      logp.data(), old_logp.data(), advantages.data(), mask.data(), rows, cols, advantages.size() == size && cols != 1};
  T* grad = grad_logp.empty() ? nullptr : grad_logp.data();
  const auto out = policy_loss_kernel<T>(inputs, options, grad, kWhere);
  detail::scale_rows(grad, 0, rows, cols, out.grad_scale);
  return out.result;
}

}  // namespace DAPO_KERNEL_ABI
}  // namespace core
}  // namespace dapo
