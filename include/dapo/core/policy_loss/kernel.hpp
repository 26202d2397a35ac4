// The fused per-token policy loss on plain buffers: one pass over [B, T] computes the loss, the metrics and
// d loss / d logp for every token-level loss (<dapo/core/policy_loss/*.hpp>: vanilla, gspo, sapo, cispo, dppo_tv,
// dppo_kl, dro, gpg), weighted per token when weights are given, and aggregated by any LossAggregation.
// No LibTorch here; <dapo/core/loss.hpp> is the checked front end on spans, <dapo/loss.hpp> the tensor one.
//
// Shapes: B = rows (responses), T = cols (response tokens, right-padded); every [B, T] buffer is row-major.
//   logp, old_logp, mask [B, T]; advantages [B] (one per response, broadcast over tokens) or [B, T]; weights [B, T].
//
// Every aggregation is a per-row weight w_b times the masked token sum, loss = sum_b w_b * sum_t mask[b,t] * pg[b,t],
// which is what lets one pass produce the loss and its gradient. A micro-batch of a larger mini-batch computes its
// exact share of the mini-batch's loss when the batch-wide part of w_b comes from the whole mini-batch (the global_*
// options; <dapo/core/accumulation.hpp> fills them in).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "dapo/core/error.hpp"
#include "dapo/core/parallel.hpp"
#include "dapo/core/policy_loss/cispo.hpp"
#include "dapo/core/policy_loss/dppo.hpp"
#include "dapo/core/policy_loss/dro.hpp"
#include "dapo/core/policy_loss/gpg.hpp"
#include "dapo/core/policy_loss/gspo.hpp"
#include "dapo/core/policy_loss/sapo.hpp"
#include "dapo/core/policy_loss/vanilla.hpp"
#include "dapo/core/policy_loss_options.hpp"
#include "dapo/core/simd.hpp"

namespace dapo {

namespace core {

struct PolicyLossResult {
  double loss = 0.0;
  double clip_fraction = 0.0;       // share of masked tokens where the (decoupled) clip bound the loss (pg_clipfrac)
  double dual_clip_fraction = 0.0;  // share of masked tokens capped by the dual clip (0 when dual_clip = 0), or
                                    // dppo's ratio cap: verl's pg_clipfrac_lower
  double approx_kl = 0.0;           // masked mean of old_logp - logp (log-ratio clamped to [-20, 20]); verl's ppo_kl
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
  const A* weights = nullptr;  // [B, T] per-token weights of the loss (verl's rollout_is_weights), or null

  // The advantage of flat token i (row-major), whether advantages are [B] or [B, T].
  double advantage_at(int64_t i) const {
    return static_cast<double>(per_token_advantages ? advantages[i] : advantages[i / cols]);
  }
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
// Token: the loss's per-token function (<dapo/core/policy_loss/*.hpp>).
template <class Token_, bool kPerTokenAdvantage_, bool kWeights_, bool kWithGrad_>
struct RowVariant {
  using Token = Token_;
  static constexpr bool kPerTokenAdvantage = kPerTokenAdvantage_, kWeights = kWeights_, kWithGrad = kWithGrad_;
};

// One row's pointers; advantages and weights are null when the variant does not read them.
template <class T, class A, class M>
struct RowPointers {
  const T* logp;
  const T* old_logp;
  const A* advantages;
  const A* weights;
  const M* mask;
};

template <class Math, class Variant, bool kPartial, class T, class A, class M, class G>
DAPO_INLINE void loss_lanes(const RowPointers<T, A, M>& row, const typename Math::Value& row_advantage,
                            const typename Math::Value& row_log_ratio,
                            const dapo::detail::TokenParams<typename Math::Value>& params, int64_t t, int64_t lanes,
                            G* grad, ChunkSums<Math>& sums) {
  using V = typename Math::Value;
  const V m = load_lanes<Math, kPartial>(row.mask + t, lanes);
  V advantage = row_advantage;
  if constexpr (Variant::kPerTokenAdvantage) advantage = load_lanes<Math, kPartial>(row.advantages + t, lanes);
  const dapo::detail::TokenInputs<V> inputs{load_lanes<Math, kPartial>(row.logp + t, lanes),
                                            load_lanes<Math, kPartial>(row.old_logp + t, lanes), advantage,
                                            row_log_ratio};
  auto token = Variant::Token::template terms<Math>(inputs, params);
  if constexpr (Variant::kWeights) {
    const V weight = load_lanes<Math, kPartial>(row.weights + t, lanes);
    token.loss = token.loss * weight;
    token.grad = token.grad * weight;
  }
  // A masked-out token contributes exactly 0, even when its inputs are garbage (padding may hold NaN).
  const V zero = Math::splat(0.0), one = Math::splat(1.0);
  const auto on = m != zero;
  if constexpr (!std::is_same_v<M, bool>) sums.invalid = sums.invalid + Math::select(on & (m != one), one, zero);
  sums.loss = sums.loss + Math::select(on, token.loss, zero);
  sums.tokens = sums.tokens + m;
  sums.clipped = sums.clipped + Math::select(on, token.clipped, zero);
  sums.dual_clipped = sums.dual_clipped + Math::select(on, token.dual_clipped, zero);
  sums.kl = sums.kl + Math::select(on, token.kl, zero);
  if constexpr (Variant::kWithGrad) {
    if constexpr (kPartial) {
      Math::store_partial(grad + t, Math::select(on, token.grad, zero), lanes);
    } else {
      Math::store(grad + t, Math::select(on, token.grad, zero));
    }
  }
}

// The options as the per-token functions take them, in the compute type.
template <class Math>
DAPO_INLINE dapo::detail::TokenParams<typename Math::Value> token_params(const PolicyLossOptions& o) {
  return {Math::splat(1.0 - o.clip_low), Math::splat(1.0 + o.clip_high), Math::splat(o.clip_low),
          Math::splat(o.clip_high),      Math::splat(o.dual_clip),       Math::splat(o.ratio_cap),
          Math::splat(o.tau_pos),        Math::splat(o.tau_neg),         Math::splat(o.dro_beta),
          Math::splat(o.delta)};
}

// gspo's sequence-level log-ratio of one row: sum_t mask * (logp - old_logp) / max(tokens, 1), in double.
template <class T, class M>
double row_mean_log_ratio(const T* logp, const T* old_logp, const M* mask, int64_t cols) {
  double sum = 0.0, tokens = 0.0;
  for (int64_t t = 0; t < cols; ++t) {
    const auto m = static_cast<double>(mask[t]);
    if (m == 0.0) continue;
    sum += m * (static_cast<double>(logp[t]) - static_cast<double>(old_logp[t]));
    tokens += m;
  }
  return sum / (tokens > 1.0 ? tokens : 1.0);
}

// One row: raw per-token gradient into grad (when not null) and the row's sums. Returns false on a mask value that
// is neither 0 nor 1 (its column in bad_col).
template <class Math, class Variant, class T, class A, class M, class G>
DAPO_INLINE bool loss_row_variant(const RowPointers<T, A, M>& row, int64_t cols, double row_advantage_value,
                                  const PolicyLossOptions& options, G* grad_row, RowSums& sums, int64_t& bad_col) {
  constexpr int64_t kLanes = Math::kLanes;
  constexpr int64_t kChunk = 64 * kLanes;  // partial sums in the compute type stay short; their totals go to double
  const auto params = token_params<Math>(options);
  const auto row_advantage = Math::splat(row_advantage_value);
  double row_log_ratio_value = 0.0;
  if constexpr (Variant::Token::kRowLogRatio) {
    row_log_ratio_value = row_mean_log_ratio(row.logp, row.old_logp, row.mask, cols);
  }
  const auto row_log_ratio = Math::splat(row_log_ratio_value);
  for (int64_t start = 0; start < cols; start += kChunk) {
    const int64_t stop = start + kChunk < cols ? start + kChunk : cols;
    ChunkSums<Math> chunk;
    int64_t t = start;
    for (; t + kLanes <= stop; t += kLanes) {
      loss_lanes<Math, Variant, false>(row, row_advantage, row_log_ratio, params, t, kLanes, grad_row, chunk);
    }
    if (t < stop) {
      loss_lanes<Math, Variant, true>(row, row_advantage, row_log_ratio, params, t, stop - t, grad_row, chunk);
    }
    if (Math::sum(chunk.invalid) != 0.0) {
      for (int64_t col = start; col < stop; ++col) {
        const double m = static_cast<double>(row.mask[col]);
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

// One row of the loss `Token`, with or without a gradient. kBuffered: advantages and weights are read per token
// (a [B] advantage is broadcast into a row buffer by the caller, absent weights are a row of ones), which keeps the
// instantiations few for the losses and options beyond DAPO's own fast path.
template <class Math, class Token, bool kPerTokenAdvantage, bool kBuffered, class T, class A, class M, class G>
DAPO_INLINE bool loss_row_of(const RowPointers<T, A, M>& row, int64_t cols, double row_advantage,
                             const PolicyLossOptions& options, G* grad_row, RowSums& sums, int64_t& bad_col) {
  // No lambda here: it would not be inlined, and so not compiled for the caller's instruction set.
  using WithGrad = RowVariant<Token, kPerTokenAdvantage || kBuffered, kBuffered, true>;
  using NoGrad = RowVariant<Token, kPerTokenAdvantage || kBuffered, kBuffered, false>;
  if (grad_row != nullptr) {
    return loss_row_variant<Math, WithGrad>(row, cols, row_advantage, options, grad_row, sums, bad_col);
  }
  return loss_row_variant<Math, NoGrad>(row, cols, row_advantage, options, grad_row, sums, bad_col);
}

// loss_row_of for options.mode, as a kernel for simd::run: one instantiation per arithmetic (Scalar,
// FloatVector<4, 8, 16>). Vanilla without weights is DAPO's own path: the advantage is read per row when it is one.
template <bool kPerTokenAdvantage, bool kBuffered>
struct LossRowKernel {
  template <class Math, class T, class A, class M, class G>
  DAPO_INLINE static bool run(const RowPointers<T, A, M>& row, const int64_t& cols, const double& row_advantage,
                              const PolicyLossOptions& options, G* const& grad_row, RowSums& sums, int64_t& bad_col) {
    using dapo::detail::VanillaToken;
    switch (options.mode) {
      case PolicyLossMode::kVanilla:
        if constexpr (kBuffered) {  // the two-sided clip runs buffered (see policy_loss_kernel_impl)
          if (options.delta > 0.0) {
            if (options.dual_clip > 0.0) {
              return loss_row_of<Math, VanillaToken<true, true>, true, true>(row, cols, row_advantage, options,
                                                                             grad_row, sums, bad_col);
            }
            return loss_row_of<Math, VanillaToken<false, true>, true, true>(row, cols, row_advantage, options, grad_row,
                                                                            sums, bad_col);
          }
        }
        if (options.dual_clip > 0.0) {
          return loss_row_of<Math, VanillaToken<true>, kPerTokenAdvantage, kBuffered>(row, cols, row_advantage, options,
                                                                                      grad_row, sums, bad_col);
        }
        return loss_row_of<Math, VanillaToken<false>, kPerTokenAdvantage, kBuffered>(row, cols, row_advantage, options,
                                                                                     grad_row, sums, bad_col);
      default:
        if constexpr (kBuffered) {
          switch (options.mode) {
            case PolicyLossMode::kGspo:
              return loss_row_of<Math, dapo::detail::GspoToken, true, true>(row, cols, row_advantage, options, grad_row,
                                                                            sums, bad_col);
            case PolicyLossMode::kSapo:
              return loss_row_of<Math, dapo::detail::SapoToken, true, true>(row, cols, row_advantage, options, grad_row,
                                                                            sums, bad_col);
            case PolicyLossMode::kCispo:
              return loss_row_of<Math, dapo::detail::CispoToken, true, true>(row, cols, row_advantage, options,
                                                                             grad_row, sums, bad_col);
            case PolicyLossMode::kDppoTv:
              return loss_row_of<Math, dapo::detail::DppoTvToken, true, true>(row, cols, row_advantage, options,
                                                                              grad_row, sums, bad_col);
            case PolicyLossMode::kDppoKl:
              return loss_row_of<Math, dapo::detail::DppoKlToken, true, true>(row, cols, row_advantage, options,
                                                                              grad_row, sums, bad_col);
            case PolicyLossMode::kDro:
              return loss_row_of<Math, dapo::detail::DroToken, true, true>(row, cols, row_advantage, options, grad_row,
                                                                           sums, bad_col);
            case PolicyLossMode::kGpg:
              return loss_row_of<Math, dapo::detail::GpgToken, true, true>(row, cols, row_advantage, options, grad_row,
                                                                           sums, bad_col);
            default:
              break;
          }
        }
        return false;  // not reached: policy_loss_kernel takes token-level modes only, buffered unless vanilla
    }
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

// The loss (the sums' loss times the batch-wide factor `scale`, which is also grad_scale) and the metrics, the shares
// of masked tokens, each count + count_epsilon as verl divides. Host and device code (a CUDA kernel finishes there).
DAPO_HOST_DEVICE inline PolicyLossKernelResult scaled_result(const PolicyLossSums& total, double scale,
                                                             const PolicyLossOptions& options) {
  PolicyLossKernelResult out;
  out.grad_scale = scale;
  out.result.loss = total.loss * scale;
  out.result.token_count = total.tokens;
  if (total.tokens > 0.0) {
    const double tokens = total.tokens + options.count_epsilon;
    out.result.clip_fraction = total.clipped / tokens;
    out.result.dual_clip_fraction = total.dual_clipped / tokens;
    out.result.approx_kl = total.kl / tokens;
  }
  return out;
}

// The aggregations whose batch-wide count is of rows with a masked token, or of all rows (seq-mean-token-sum-norm).
DAPO_HOST_DEVICE inline bool is_seq_mean(LossAggregation aggregation) {
  return aggregation == LossAggregation::kSeqMeanTokenMean || aggregation == LossAggregation::kSeqMeanTokenSum ||
         aggregation == LossAggregation::kSeqMeanTokenSumNorm;
}

// Whether the sums hold more masked tokens, or rows with one, than the options' global counts allow (what
// finish_policy_loss refuses).
DAPO_HOST_DEVICE inline bool beyond_global_counts(const PolicyLossSums& total, const PolicyLossOptions& options) {
  const bool tokens = options.global_token_count != 0.0 && options.global_token_count < total.tokens;
  const bool rows = is_seq_mean(options.aggregation) && options.global_row_count != 0.0 &&
                    options.global_row_count < static_cast<double>(total.nonempty_rows);
  return tokens || rows;
}

// The batch-wide factor of the aggregation: 1 / the count it divides by, this call's own or the options' global one.
DAPO_HOST_DEVICE inline double aggregation_scale(const PolicyLossSums& total, int64_t rows, int64_t cols,
                                                 const PolicyLossOptions& options) {
  switch (options.aggregation) {
    case LossAggregation::kTokenMean: {
      const double denominator = options.global_token_count > 0.0 ? options.global_token_count : total.tokens;
      return denominator > 0.0 ? 1.0 / denominator : 0.0;
    }
    case LossAggregation::kGroupTokenMean:
      if (options.global_group_count > 0.0) return 1.0 / options.global_group_count;
      return rows > 0 ? static_cast<double>(options.group_size) / static_cast<double>(rows) : 0.0;
    case LossAggregation::kSeqMeanTokenMean:
    case LossAggregation::kSeqMeanTokenSum: {
      const double denominator =
          options.global_row_count > 0.0 ? options.global_row_count : static_cast<double>(total.nonempty_rows);
      return denominator > 0.0 ? 1.0 / denominator : 0.0;
    }
    case LossAggregation::kSeqMeanTokenSumNorm: {
      const double norm_length = options.norm_length > 0.0 ? options.norm_length : static_cast<double>(cols);
      const double row_count = options.global_row_count > 0.0 ? options.global_row_count : static_cast<double>(rows);
      // 0 when the batch has no row or no column (nothing to average), never 1/0.
      const double denominator = norm_length * row_count;
      return denominator > 0.0 ? 1.0 / denominator : 0.0;
    }
    case LossAggregation::kTokenSum:
      return 1.0;
  }
  return 0.0;
}

// The loss, the metrics and grad_scale from the weighted sums of a whole batch (any device's kernel), after checking
// the sums against the options' global counts.
inline PolicyLossKernelResult finish_policy_loss(const PolicyLossSums& total, int64_t rows, int64_t cols,
                                                 const PolicyLossOptions& options, const char* where) {
  DAPO_REQUIRE(options.global_token_count == 0.0 || options.global_token_count >= total.tokens, where,
               "global_token_count is ", options.global_token_count, " but this batch alone holds ", total.tokens,
               " masked tokens");
  DAPO_REQUIRE(!is_seq_mean(options.aggregation) || options.global_row_count == 0.0 ||
                   options.global_row_count >= static_cast<double>(total.nonempty_rows),
               where, "global_row_count is ", options.global_row_count, " but this batch alone holds ",
               total.nonempty_rows, " rows with a masked token");
  return scaled_result(total, aggregation_scale(total, rows, cols, options), options);
}

// The fused policy loss: one pass over the inputs writes the raw gradient (when raw_grad is not null) and returns the
// loss, the metrics and grad_scale (d loss / d logp = raw_grad * grad_scale). The per-row part of each aggregation's
// weight (1 / response tokens, 1 / group tokens) is applied while the row or group is still in cache.
// Checks the data (mask values, empty groups, global token and row counts); the caller has checked shapes and options.
// float_lanes: the SIMD width for float compute (0: the widest this CPU runs; 4, 8, 16 to force one, for tests).
//
// policy_loss_kernel computes every token-level loss; vanilla_policy_loss_kernel only vanilla without weights (DAPO's
// own path), so that a caller instantiating many input types (every logp and mask dtype of the tensor front end) does
// not instantiate every loss for each of them.
}  // namespace DAPO_KERNEL_ABI
}  // namespace core

namespace detail {
inline namespace DAPO_KERNEL_ABI {

template <bool kFamily, class C, class T, class A, class M, class G, class ParallelFor>
core::PolicyLossKernelResult policy_loss_kernel_impl(const core::PolicyLossInputs<T, A, M>& in,
                                                     const PolicyLossOptions& options, G* raw_grad, const char* where,
                                                     const ParallelFor& parallel, int float_lanes) {
  using core::PolicyLossSums;
  const bool grouped = options.aggregation == LossAggregation::kGroupTokenMean;
  const int64_t unit = grouped ? options.group_size : 1;  // a block never splits a group
  constexpr int64_t kBlockTokens = 1 << 15;
  const int64_t rows_per_unit_block = in.cols > 0 ? (kBlockTokens / (in.cols * unit)) : 1;
  const int64_t block_rows = unit * (rows_per_unit_block > 1 ? rows_per_unit_block : 1);
  const int64_t num_blocks = (in.rows + block_rows - 1) / block_rows;
  std::vector<detail::BlockSums> blocks(static_cast<std::size_t>(num_blocks));
  DAPO_REQUIRE(is_token_level(options.mode), where, "the ", policy_loss_name(options.mode),
               " loss is not token-level; dapo::core::policy_loss computes it");

  const int lanes = simd::resolve_float_lanes(float_lanes, where);
  const bool per_row_mean = options.aggregation == LossAggregation::kSeqMeanTokenMean;
  // DAPO's own path reads a [B] advantage per row and no weights; every other loss, and vanilla with weights, reads
  // both per token from row buffers when they are not [B, T] already.
  const bool buffered = options.mode != PolicyLossMode::kVanilla || in.weights != nullptr || options.delta > 0.0;
  DAPO_REQUIRE(kFamily || !buffered, where,
               "vanilla_policy_loss_kernel computes vanilla without weights or delta; this call needs "
               "policy_loss_kernel");

  parallel(num_blocks, [&](int64_t first_block, int64_t last_block) {
    std::vector<A> advantage_row, ones;
    if (buffered && !in.per_token_advantages) advantage_row.resize(static_cast<std::size_t>(in.cols));
    if (buffered && in.weights == nullptr) ones.assign(static_cast<std::size_t>(in.cols), static_cast<A>(1));
    for (int64_t block = first_block; block < last_block; ++block) {
      detail::BlockSums& block_sums = blocks[static_cast<std::size_t>(block)];
      const int64_t block_end = (block + 1) * block_rows < in.rows ? (block + 1) * block_rows : in.rows;
      for (int64_t unit_start = block * block_rows; unit_start < block_end; unit_start += unit) {
        PolicyLossSums unit_sums;
        for (int64_t row = unit_start; row < unit_start + unit; ++row) {
          PolicyLossSums row_sums;
          int64_t bad_col = 0;
          const int64_t offset = row * in.cols;
          const A* advantages = in.per_token_advantages ? in.advantages + offset : nullptr;
          if (buffered && !in.per_token_advantages) {
            std::fill(advantage_row.begin(), advantage_row.end(), in.advantages[row]);
            advantages = advantage_row.data();
          }
          const detail::RowPointers<T, A, M> pointers{in.logp + offset, in.old_logp + offset, advantages,
                                                      in.weights != nullptr ? in.weights + offset : ones.data(),
                                                      in.mask + offset};
          const double row_advantage = in.per_token_advantages ? 0.0 : static_cast<double>(in.advantages[row]);
          G* grad_row = raw_grad != nullptr ? raw_grad + offset : nullptr;
          bool ok = false;
          if (buffered) {
            if constexpr (kFamily) {
              ok = simd::run<C, detail::LossRowKernel<true, true>>(lanes, pointers, in.cols, row_advantage, options,
                                                                   grad_row, row_sums, bad_col);
            }
          } else if (in.per_token_advantages) {
            ok = simd::run<C, detail::LossRowKernel<true, false>>(lanes, pointers, in.cols, row_advantage, options,
                                                                  grad_row, row_sums, bad_col);
          } else {
            ok = simd::run<C, detail::LossRowKernel<false, false>>(lanes, pointers, in.cols, row_advantage, options,
                                                                   grad_row, row_sums, bad_col);
          }
          if (!ok) {
            const M value = in.mask[row * in.cols + bad_col];
            block_sums.error = dapo::detail::concat(where, ": mask[", row, ", ", bad_col, "] is ",
                                                    static_cast<double>(value), ", expected 0 or 1");
            return;
          }
          row_sums.nonempty_rows = row_sums.tokens > 0.0;
          if (per_row_mean && row_sums.tokens > 0.0) {
            const double row_divisor = row_sums.tokens + options.count_epsilon;
            detail::scale_rows(raw_grad, row, row + 1, in.cols, 1.0 / row_divisor);
            row_sums.loss /= row_divisor;
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
  return core::finish_policy_loss(total, in.rows, in.cols, options, where);
}

}  // namespace DAPO_KERNEL_ABI
}  // namespace detail

namespace core {
inline namespace DAPO_KERNEL_ABI {

template <class C, class T, class A, class M, class G, class ParallelFor = SerialFor>
PolicyLossKernelResult policy_loss_kernel(const PolicyLossInputs<T, A, M>& in, const PolicyLossOptions& options,
                                          G* raw_grad, const char* where, const ParallelFor& parallel = {},
                                          int float_lanes = 0) {
  return detail::policy_loss_kernel_impl<true, C>(in, options, raw_grad, where, parallel, float_lanes);
}

template <class C, class T, class A, class M, class G, class ParallelFor = SerialFor>
PolicyLossKernelResult vanilla_policy_loss_kernel(const PolicyLossInputs<T, A, M>& in, const PolicyLossOptions& options,
                                                  G* raw_grad, const char* where, const ParallelFor& parallel = {},
                                                  int float_lanes = 0) {
  return detail::policy_loss_kernel_impl<false, C>(in, options, raw_grad, where, parallel, float_lanes);
}

// The aggregation of per-token terms that a loss computed outside the fused pass (kl_cov and clip_cov choose their
// tokens by a statistic of the whole call first), with the kernel's rules and data checks, serially in double.
// terms(row, col) gives the token's TokenTerms<double> (already weighted); raw_grad as policy_loss_kernel's.
template <class M, class G, class Terms>
PolicyLossKernelResult aggregate_token_terms(const M* mask, int64_t rows, int64_t cols,
                                             const PolicyLossOptions& options, const Terms& terms, G* raw_grad,
                                             const char* where) {
  const bool grouped = options.aggregation == LossAggregation::kGroupTokenMean;
  const int64_t unit = grouped ? options.group_size : 1;
  const bool per_row_mean = options.aggregation == LossAggregation::kSeqMeanTokenMean;
  PolicyLossSums total;
  for (int64_t unit_start = 0; unit_start < rows; unit_start += unit) {
    PolicyLossSums unit_sums;
    for (int64_t row = unit_start; row < unit_start + unit; ++row) {
      PolicyLossSums row_sums;
      for (int64_t col = 0; col < cols; ++col) {
        const auto m = static_cast<double>(mask[row * cols + col]);
        DAPO_REQUIRE(m == 0.0 || m == 1.0, where, "mask[", row, ", ", col, "] is ", m, ", expected 0 or 1");
        double grad = 0.0;
        if (m != 0.0) {
          const dapo::detail::TokenTerms<double> token = terms(row, col);
          row_sums.loss += token.loss;
          row_sums.tokens += 1.0;
          row_sums.clipped += token.clipped;
          row_sums.dual_clipped += token.dual_clipped;
          row_sums.kl += token.kl;
          grad = token.grad;
        }
        if (raw_grad != nullptr) raw_grad[row * cols + col] = static_cast<G>(grad);
      }
      row_sums.nonempty_rows = row_sums.tokens > 0.0;
      if (per_row_mean && row_sums.tokens > 0.0) {
        const double row_divisor = row_sums.tokens + options.count_epsilon;
        detail::scale_rows(raw_grad, row, row + 1, cols, 1.0 / row_divisor);
        row_sums.loss /= row_divisor;
      }
      unit_sums.add(row_sums);
    }
    if (grouped) {
      if (unit_sums.tokens == 0.0)
        throw std::invalid_argument(detail::empty_group_message(where, unit_start / unit, unit));
      detail::scale_rows(raw_grad, unit_start, unit_start + unit, cols, 1.0 / unit_sums.tokens);
      unit_sums.loss /= unit_sums.tokens;
    }
    total.add(unit_sums);
  }
  return finish_policy_loss(total, rows, cols, options, where);
}

}  // namespace DAPO_KERNEL_ABI
}  // namespace core
}  // namespace dapo
