// verl's "geo_mean" policy loss (GMPO, Geometric-Mean Policy Optimization, arXiv 2507.20673; verl
// core_algos.compute_policy_loss_geo_mean): a sequence-level loss on the geometric mean of the token ratios. Per row b
// with n_b masked tokens (d_b = n_b + count_epsilon), r = logp - old_logp (not clamped), s = sign(A):
//   m_t     = s * min(s * r, s * clamp(r, -clip_low, clip_high))   (the pessimistic side of the log-ratio's clip)
//   ratio_b = exp(sum_t mask * m_t / d_b);   adv_b = sum_t mask * A / d_b
//   w_b     = exp(sum_t mask * log(weight + 1e-10) / d_b) with per-token weights, else 1
//   pg_b    = -adv_b * ratio_b * w_b;   loss = sum_b pg_b / rows (every row, as verl's torch.mean; or global_row_count)
// d loss / d logp[b, t] = pg_b / rows * mask / d_b * d m_t / d r (1 where the clip does not bind, 0 where it does).
// pg_clipfrac counts the masked tokens with r outside the clip and A > 0, pg_clipfrac_lower those with A < 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "dapo/core/policy_loss/kernel.hpp"

namespace dapo::core {
inline namespace DAPO_KERNEL_ABI {  // see kernel_abi.hpp

template <class T, class A, class M, class G>
PolicyLossKernelResult geo_mean_kernel(const PolicyLossInputs<T, A, M>& in, const PolicyLossOptions& options,
                                       G* raw_grad, const char* where) {
  const double rows = options.global_row_count > 0.0 ? options.global_row_count : static_cast<double>(in.rows);
  const double scale = rows > 0.0 ? 1.0 / rows : 0.0;
  PolicyLossSums total;
  for (int64_t row = 0; row < in.rows; ++row) {
    const int64_t offset = row * in.cols;
    double tokens = 0.0, sum_m = 0.0, sum_advantage = 0.0, sum_log_weight = 0.0;
    for (int64_t col = 0; col < in.cols; ++col) {
      const int64_t i = offset + col;
      const auto m = static_cast<double>(in.mask[i]);
      DAPO_REQUIRE(m == 0.0 || m == 1.0, where, "mask[", row, ", ", col, "] is ", m, ", expected 0 or 1");
      if (m == 0.0) continue;
      const double a = in.advantage_at(i);
      const double r = static_cast<double>(in.logp[i]) - static_cast<double>(in.old_logp[i]);
      const double clamped = std::clamp(r, -options.clip_low, options.clip_high);
      const double sign = static_cast<double>((a > 0.0) - (a < 0.0));
      sum_m += sign * std::min(sign * r, sign * clamped);
      sum_advantage += a;
      if (in.weights != nullptr) sum_log_weight += std::log(static_cast<double>(in.weights[i]) + 1e-10);
      tokens += 1.0;
      total.clipped += r != clamped && a > 0.0 ? 1.0 : 0.0;
      total.dual_clipped += r != clamped && a < 0.0 ? 1.0 : 0.0;
      total.kl -= r;
    }
    const double divisor = tokens + options.count_epsilon;
    const auto mean = [&](double sum) { return tokens > 0.0 ? sum / divisor : 0.0; };
    const double ratio = std::exp(mean(sum_m));
    const double advantage = mean(sum_advantage);
    const double weight = in.weights != nullptr ? std::exp(mean(sum_log_weight)) : 1.0;
    const double pg = -advantage * ratio * weight;
    total.loss += pg;
    total.tokens += tokens;
    total.nonempty_rows += tokens > 0.0 ? 1 : 0;
    if (raw_grad == nullptr) continue;
    for (int64_t col = 0; col < in.cols; ++col) {
      const int64_t i = offset + col;
      double grad = 0.0;
      if (static_cast<double>(in.mask[i]) != 0.0) {
        const double a = in.advantage_at(i);
        const double r = static_cast<double>(in.logp[i]) - static_cast<double>(in.old_logp[i]);
        // min(r, clamp) for A > 0 follows r unless r > clip_high; max for A < 0 unless r < -clip_low; A = 0: flat.
        const bool passes = (a > 0.0 && r <= options.clip_high) || (a < 0.0 && r >= -options.clip_low);
        grad = passes ? pg / divisor : 0.0;
      }
      raw_grad[i] = static_cast<G>(grad);
    }
  }
  return scaled_result(total, scale, options);
}

}  // namespace DAPO_KERNEL_ABI
}  // namespace dapo::core
