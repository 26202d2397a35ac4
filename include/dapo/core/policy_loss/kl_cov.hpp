// verl's "kl_cov" policy loss (KL-Cov, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617; verl
// core_algos.compute_policy_loss_kl_cov). Per token, with r = logp - old_logp (not clamped):
//   pg = -A * exp(r), plus ppo_kl_coef * |r| on the max(1, floor(kl_cov_ratio * n)) masked tokens of largest
//   cov = (A - mean A) * (logp - mean logp) (means over the call's n masked tokens; ties: the earlier token first);
//   d pg / d logp = -A * exp(r) (+ ppo_kl_coef * sign(r) on the chosen tokens).
// ppo_kl is the masked mean of |r|. The choice is among the call's own tokens, as verl makes it per micro-batch: a
// micro-batch split changes it, so this loss runs on the whole mini-batch (micro_batch_options refuses it).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "dapo/core/policy_loss/kernel.hpp"

namespace dapo::core {
inline namespace DAPO_KERNEL_ABI {  // see kernel_abi.hpp

// The masked tokens that get the penalty, as flags over [B, T]: the top share by covariance. Exposed for tests.
template <class T, class A, class M>
std::vector<char> kl_cov_choice(const PolicyLossInputs<T, A, M>& in, const PolicyLossOptions& options) {
  std::vector<int64_t> valid;
  for (int64_t i = 0; i < in.rows * in.cols; ++i) {
    if (static_cast<double>(in.mask[i]) != 0.0) valid.push_back(i);
  }
  std::vector<char> chosen(static_cast<std::size_t>(in.rows * in.cols), 0);
  if (valid.empty()) return chosen;
  double mean_advantage = 0.0, mean_logp = 0.0;
  for (const int64_t i : valid) {
    mean_advantage += in.advantage_at(i);
    mean_logp += static_cast<double>(in.logp[i]);
  }
  mean_advantage /= static_cast<double>(valid.size());
  mean_logp /= static_cast<double>(valid.size());
  std::vector<double> cov(valid.size());
  for (std::size_t j = 0; j < valid.size(); ++j) {
    cov[j] = (in.advantage_at(valid[j]) - mean_advantage) * (static_cast<double>(in.logp[valid[j]]) - mean_logp);
  }
  const auto count =
      std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(valid.size()) * options.kl_cov_ratio));
  std::vector<std::size_t> order(valid.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::partial_sort(order.begin(), order.begin() + count, order.end(),
                    [&](std::size_t a, std::size_t b) { return cov[a] > cov[b] || (cov[a] == cov[b] && a < b); });
  for (int64_t j = 0; j < count; ++j) chosen[static_cast<std::size_t>(valid[order[static_cast<std::size_t>(j)]])] = 1;
  return chosen;
}

// kl_cov's loss, metrics and raw gradient (as policy_loss_kernel's), in double.
template <class T, class A, class M, class G>
PolicyLossKernelResult kl_cov_kernel(const PolicyLossInputs<T, A, M>& in, const PolicyLossOptions& options, G* raw_grad,
                                     const char* where) {
  const std::vector<char> chosen = kl_cov_choice(in, options);
  const auto terms = [&](int64_t row, int64_t col) {
    const int64_t i = row * in.cols + col;
    const double a = in.advantage_at(i);
    const double r = static_cast<double>(in.logp[i]) - static_cast<double>(in.old_logp[i]);
    const double ratio = std::exp(r);
    double loss = -a * ratio, grad = -a * ratio;
    if (chosen[static_cast<std::size_t>(i)] != 0) {
      loss += options.ppo_kl_coef * std::abs(r);
      grad += options.ppo_kl_coef * static_cast<double>((r > 0.0) - (r < 0.0));
    }
    const double weight = in.weights != nullptr ? static_cast<double>(in.weights[i]) : 1.0;
    return dapo::detail::TokenTerms<double>{loss * weight, grad * weight, 0.0, 0.0, std::abs(r)};
  };
  return aggregate_token_terms(in.mask, in.rows, in.cols, options, terms, raw_grad, where);
}

}  // namespace DAPO_KERNEL_ABI
}  // namespace dapo::core
