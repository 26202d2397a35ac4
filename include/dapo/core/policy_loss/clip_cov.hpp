// verl's "clip_cov" policy loss (Clip-Cov, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617; verl
// core_algos.compute_policy_loss_clip_cov). Per token, with r = logp - old_logp (not clamped), ratio = exp(r):
//   pg = max(-A ratio, -A clamp(ratio, 1 - clip_low, 1 + clip_high)), except on chosen tokens, whose loss (and
//   gradient) is 0. The candidates are the masked tokens the clip did not bind whose
//   cov = (A - mean A) * (logp - mean logp) (masked means over the call, each count + count_epsilon) lies strictly
//   inside (clip_cov_lb, clip_cov_ub); max(1, floor(clip_cov_ratio * tokens)) of them (or all, if fewer) are chosen
//   at random by the caller's `choose`, as verl takes torch.randperm over the candidates in row-major order.
// pg_clipfrac is the share of chosen tokens; ppo_kl the masked mean of -r. The choice is among the call's own tokens:
// micro_batch_options refuses the loss (a split would choose among other tokens).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "dapo/core/policy_loss/kernel.hpp"

namespace dapo {

// choose(candidates, count): `count` distinct indices in [0, candidates), the random part of clip_cov. verl's is
// torch.randperm(candidates)[:count]; the tensor front end draws the same from a torch generator.
using ClipCovChoice = std::function<std::vector<int64_t>(int64_t candidates, int64_t count)>;

// A choice drawn from any standard random generator (a partial Fisher-Yates shuffle); `generator` must outlive it.
template <class Generator>
ClipCovChoice clip_cov_choice(Generator& generator) {
  return [&generator](int64_t candidates, int64_t count) {
    std::vector<int64_t> order(static_cast<std::size_t>(candidates));
    for (int64_t i = 0; i < candidates; ++i) order[static_cast<std::size_t>(i)] = i;
    for (int64_t i = 0; i < count; ++i) {
      std::uniform_int_distribution<int64_t> pick(i, candidates - 1);
      std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(pick(generator))]);
    }
    order.resize(static_cast<std::size_t>(count));
    return order;
  };
}

namespace core {
inline namespace DAPO_KERNEL_ABI {  // see kernel_abi.hpp

template <class T, class A, class M, class G>
PolicyLossKernelResult clip_cov_kernel(const PolicyLossInputs<T, A, M>& in, const PolicyLossOptions& options,
                                       G* raw_grad, const char* where, const ClipCovChoice& choose) {
  DAPO_REQUIRE(static_cast<bool>(choose), where, "the clip_cov loss draws tokens at random: pass a choice");
  const int64_t size = in.rows * in.cols;
  double tokens = 0.0, advantage_sum = 0.0, logp_sum = 0.0;
  for (int64_t i = 0; i < size; ++i) {
    const auto m = static_cast<double>(in.mask[i]);
    DAPO_REQUIRE(m == 0.0 || m == 1.0, where, "mask[", i / in.cols, ", ", i % in.cols, "] is ", m, ", expected 0 or 1");
    if (m == 0.0) continue;
    tokens += 1.0;
    advantage_sum += in.advantage_at(i);
    logp_sum += static_cast<double>(in.logp[i]);
  }
  const double mean_advantage = advantage_sum / (tokens + options.count_epsilon);
  const double mean_logp = logp_sum / (tokens + options.count_epsilon);
  const double low = 1.0 - options.clip_low, high = 1.0 + options.clip_high;
  const auto losses = [&](int64_t i) {  // {max of the two terms, whether the clip bound it}
    const double ratio = std::exp(static_cast<double>(in.logp[i]) - static_cast<double>(in.old_logp[i]));
    const double unclipped = -in.advantage_at(i) * ratio, clipped = -in.advantage_at(i) * std::clamp(ratio, low, high);
    return std::pair<double, bool>{std::max(unclipped, clipped), clipped > unclipped};
  };
  std::vector<int64_t> candidates;
  for (int64_t i = 0; i < size; ++i) {
    if (static_cast<double>(in.mask[i]) == 0.0 || losses(i).second) continue;
    const double cov = (in.advantage_at(i) - mean_advantage) * (static_cast<double>(in.logp[i]) - mean_logp);
    if (cov > options.clip_cov_lb && cov < options.clip_cov_ub) candidates.push_back(i);
  }
  std::vector<char> chosen(static_cast<std::size_t>(size), 0);
  if (!candidates.empty()) {
    const auto count = std::min<int64_t>(std::max<int64_t>(static_cast<int64_t>(options.clip_cov_ratio * tokens), 1),
                                         static_cast<int64_t>(candidates.size()));
    const std::vector<int64_t> picks = choose(static_cast<int64_t>(candidates.size()), count);
    DAPO_REQUIRE(static_cast<int64_t>(picks.size()) == count, where, "the clip_cov choice gave ", picks.size(),
                 " indices, expected ", count);
    for (const int64_t pick : picks) {
      DAPO_REQUIRE(pick >= 0 && pick < static_cast<int64_t>(candidates.size()), where, "the clip_cov choice gave ",
                   pick, ", expected an index below ", candidates.size());
      chosen[static_cast<std::size_t>(candidates[static_cast<std::size_t>(pick)])] = 1;
    }
  }
  const auto terms = [&](int64_t row, int64_t col) {
    const int64_t i = row * in.cols + col;
    const double r = static_cast<double>(in.logp[i]) - static_cast<double>(in.old_logp[i]);
    const double weight = in.weights != nullptr ? static_cast<double>(in.weights[i]) : 1.0;
    if (chosen[static_cast<std::size_t>(i)] != 0) return dapo::detail::TokenTerms<double>{0.0, 0.0, 1.0, 0.0, -r};
    const auto [loss, clipped] = losses(i);
    // Where the clipped term wins the ratio lies outside [low, high], where clamp passes no gradient.
    const double grad = clipped ? 0.0 : -in.advantage_at(i) * std::exp(r);
    return dapo::detail::TokenTerms<double>{loss * weight, grad * weight, 0.0, 0.0, -r};
  };
  return aggregate_token_terms(in.mask, in.rows, in.cols, options, terms, raw_grad, where);
}

}  // namespace DAPO_KERNEL_ABI
}  // namespace core
}  // namespace dapo
