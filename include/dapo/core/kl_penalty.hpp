// KL-penalty estimators of log pi_theta against a reference policy (a KL loss, verl's actor.kl_loss_type, TRL's beta)
// on plain buffers: value and d value / d logprob per token. No LibTorch here; <dapo/kl_penalty.hpp> is the tensor
// front end with autograd. Names as verl's kl_penalty: with d = logprob - ref_logprob,
//   k1 ("kl"):         d
//   abs:               |d|
//   k2 ("mse"):        d^2 / 2
//   k3 ("low_var_kl"): clamp(exp(k) - k - 1, -10, 10) with k = clamp(-d, -20, 20) (Schulman's unbiased, low variance)
// and a "+" suffix ("k1+", "k3+"): the value of the estimator, the gradient of k2 (straight through: k2's gradient is
// the one whose on-policy expectation is the KL's gradient).
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "dapo/core/error.hpp"

namespace dapo {

enum class KlEstimator { kK1, kAbs, kK2, kK3 };

struct KlPenalty {
  KlEstimator estimator = KlEstimator::kK3;
  bool straight_through = false;  // the estimator's value, k2's gradient ("k3+")
};

// verl's names: "kl" or "k1", "abs", "mse" or "k2", "low_var_kl" or "k3", each optionally followed by "+". Throws
// std::invalid_argument naming the name and the accepted ones ("full" needs the whole vocabulary: not a token
// estimator).
inline KlPenalty parse_kl_penalty(std::string_view name) {
  KlPenalty penalty;
  std::string_view base = name;
  if (base.ends_with('+')) {
    penalty.straight_through = true;
    base.remove_suffix(1);
  }
  if (base == "kl" || base == "k1") {
    penalty.estimator = KlEstimator::kK1;
  } else if (base == "abs") {
    penalty.estimator = KlEstimator::kAbs;
  } else if (base == "mse" || base == "k2") {
    penalty.estimator = KlEstimator::kK2;
  } else if (base == "low_var_kl" || base == "k3") {
    penalty.estimator = KlEstimator::kK3;
  } else {
    DAPO_REQUIRE(false, "dapo::parse_kl_penalty", "kl_penalty is '", std::string(name),
                 "', expected kl/k1, abs, mse/k2 or low_var_kl/k3, optionally followed by + (straight through)");
  }
  return penalty;
}

// The short name: "k1", "abs", "k2", "k3", with "+" when straight through.
inline std::string kl_penalty_name(const KlPenalty& penalty) {
  const char* names[] = {"k1", "abs", "k2", "k3"};
  return std::string(names[static_cast<int>(penalty.estimator)]) + (penalty.straight_through ? "+" : "");
}

namespace core {

// One token: the estimate, and its derivative with respect to logprob (the reference is fixed). Where a clamp of k3
// holds its bound the derivative is 0, as autograd's clamp gives; |d| at d = 0 has derivative 0, as autograd's abs.
struct KlTerm {
  double value = 0.0;
  double grad_logprob = 0.0;
};

inline KlTerm kl_term(double logprob, double ref_logprob, const KlPenalty& penalty) {
  const double d = logprob - ref_logprob;
  KlTerm term;
  switch (penalty.estimator) {
    case KlEstimator::kK1:
      term = {d, 1.0};
      break;
    case KlEstimator::kAbs:
      term = {std::abs(d), d > 0.0 ? 1.0 : (d < 0.0 ? -1.0 : 0.0)};
      break;
    case KlEstimator::kK2:
      term = {0.5 * d * d, d};
      break;
    case KlEstimator::kK3: {
      const double k = std::clamp(-d, -20.0, 20.0);
      const double ratio = std::exp(k);
      const double raw = ratio - k - 1.0;
      const bool k_free = -d >= -20.0 && -d <= 20.0;
      const bool value_free = raw >= -10.0 && raw <= 10.0;
      term = {std::clamp(raw, -10.0, 10.0), k_free && value_free ? 1.0 - ratio : 0.0};
      break;
    }
  }
  if (penalty.straight_through) term.grad_logprob = d;
  return term;
}

// logprob, ref_logprob -> value (same length); grad_logprob: d value[i] / d logprob[i], or empty for none. Sums in
// double. Throws std::invalid_argument naming a length that differs.
template <std::floating_point T>
void kl_penalty(std::span<const T> logprob, std::span<const T> ref_logprob, const KlPenalty& penalty,
                std::span<T> value, std::span<T> grad_logprob = {}) {
  constexpr const char* kWhere = "dapo::core::kl_penalty";
  DAPO_REQUIRE(ref_logprob.size() == logprob.size(), kWhere, "ref_logprob has ", ref_logprob.size(),
               " elements but logprob has ", logprob.size());
  DAPO_REQUIRE(value.size() == logprob.size(), kWhere, "value has ", value.size(), " elements but logprob has ",
               logprob.size());
  DAPO_REQUIRE(grad_logprob.empty() || grad_logprob.size() == logprob.size(), kWhere, "grad_logprob has ",
               grad_logprob.size(), " elements but logprob has ", logprob.size(), " (pass an empty span for none)");
  for (std::size_t i = 0; i < logprob.size(); ++i) {
    const KlTerm term = kl_term(static_cast<double>(logprob[i]), static_cast<double>(ref_logprob[i]), penalty);
    value[i] = static_cast<T>(term.value);
    if (!grad_logprob.empty()) grad_logprob[i] = static_cast<T>(term.grad_logprob);
  }
}

}  // namespace core
}  // namespace dapo
