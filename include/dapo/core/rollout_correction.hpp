// Rollout correction on plain buffers, by verl's names (verl trainer/ppo/rollout_corr_helper.py): importance-sampling
// weights for the mismatch between the policy that sampled the rollout (an inference engine's log-probs) and the one
// being trained, and rejection masks that drop tokens or whole responses whose mismatch is too large. No LibTorch here;
// the weights go to dapo::policy_loss as its per-token weights, the mask replaces the response mask.
//
// Shapes: B = rows, T = cols; log_ratio = logp_train - logp_rollout, response_mask, outputs [B, T] row-major.
// With SAFETY_BOUND = 20 (exp of at most e^20):
//   IS weights, rollout_is = token:    w = exp(clamp(log_ratio, -20, 20)) * mask
//               rollout_is = sequence: w = exp(clamp(sum_t mask * log_ratio, -20, 20)) * mask, the row's value
//   threshold "U" (TIS, truncated IS): min(w, U);   "L_U" (IcePop): w where L <= w <= U, else 0
//   batch_normalize: w / mean(w) (token: the masked mean; sequence: the mean over rows with a token of each row's
//                    masked mean), unless that mean is <= 1e-8
//   Rejection (rollout_rs, one or more of, comma separated): with l = clamp(log_ratio, -20, 20), per token
//   k1 = -l, k2 = l^2 / 2, k3 = e^l - 1 - l; token_kN keeps a token by its own statistic, seq_sum_kN, seq_mean_kN,
//   seq_max_kN keep or drop a whole row by the masked sum, mean or max of it. kN <= U keeps; k1 keeps where
//   log(L) <= k1 <= log(U) (threshold "L_U", or "U" meaning L = 1/U). The kept mask is the product over the options.
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "dapo/core/error.hpp"
#include "dapo/core/policy_loss_options.hpp"

namespace dapo {

inline constexpr double kRolloutSafetyBound = 20.0;  // verl's SAFETY_BOUND on log-ratios

enum class RolloutIsLevel { kToken, kSequence };

struct RolloutIsOptions {
  RolloutIsLevel level = RolloutIsLevel::kToken;  // verl's rollout_is
  double upper = 2.0;            // rollout_is_threshold: the truncation (TIS) or the band's top (IcePop)
  double lower = 0.0;            // 0: truncate at upper (TIS); > 0: zero outside [lower, upper] (IcePop)
  bool batch_normalize = false;  // rollout_is_batch_normalize
};

namespace detail {

// A threshold's number, the whole of `text` as std::stod reads it; nullopt when it is not one.
inline std::optional<double> threshold_number(std::string_view text) {
  const std::string s(text);
  std::size_t used = 0;
  double value = 0.0;
  try {
    value = std::stod(s, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (s.empty() || used != s.size()) return std::nullopt;
  return value;
}

}  // namespace detail

// verl's (rollout_is, rollout_is_threshold): "token" or "sequence", and "U" or "L_U".
inline RolloutIsOptions parse_rollout_is(std::string_view level, std::string_view threshold) {
  constexpr const char* kWhere = "dapo::parse_rollout_is";
  RolloutIsOptions options;
  DAPO_REQUIRE(level == "token" || level == "sequence", kWhere, "rollout_is is '", level,
               "', expected token or sequence");
  options.level = level == "token" ? RolloutIsLevel::kToken : RolloutIsLevel::kSequence;
  const auto number = [&](std::string_view text) {
    const std::optional<double> value = detail::threshold_number(text);
    DAPO_REQUIRE(value.has_value(), kWhere, "rollout_is_threshold is '", threshold,
                 "', expected a number U or L_U (e.g. 2.0 or 0.5_2.0)");
    return *value;
  };
  const auto split = threshold.find('_');
  if (split == std::string_view::npos) {
    options.upper = number(threshold);
  } else {
    options.lower = number(threshold.substr(0, split));
    options.upper = number(threshold.substr(split + 1));
    DAPO_REQUIRE(options.lower > 0.0 && options.lower <= options.upper, kWhere, "rollout_is_threshold is '", threshold,
                 "', expected 0 < L <= U");
  }
  DAPO_REQUIRE(options.upper > 0.0, kWhere, "rollout_is_threshold is '", threshold, "', expected U > 0");
  return options;
}

// One rejection option: verl's name and its bounds on the statistic (lower only for k1; the logs of L and U).
struct RolloutRsOption {
  std::string name;  // token_k1, token_k2, token_k3, seq_sum_k1..k3, seq_mean_k1..k3, seq_max_k2, seq_max_k3
  double lower = 0.0, upper = 0.0;
};

// verl's (rollout_rs, rollout_rs_threshold): options comma separated; one threshold for all or one per option.
inline std::vector<RolloutRsOption> parse_rollout_rs(std::string_view names, std::string_view thresholds) {
  constexpr const char* kWhere = "dapo::parse_rollout_rs";
  const auto split_commas = [](std::string_view text) {
    std::vector<std::string> parts;
    std::string current;
    for (const char c : text) {
      if (c == ',') {
        if (!current.empty()) parts.push_back(current);
        current.clear();
      } else if (c != ' ') {
        current += c;
      }
    }
    if (!current.empty()) parts.push_back(current);
    return parts;
  };
  static constexpr std::string_view kKnown[] = {"token_k1",    "token_k2",   "token_k3",    "seq_sum_k1",
                                                "seq_sum_k2",  "seq_sum_k3", "seq_mean_k1", "seq_mean_k2",
                                                "seq_mean_k3", "seq_max_k2", "seq_max_k3"};
  std::vector<std::string> option_names;
  for (const std::string& name : split_commas(names)) {
    bool known = false;
    for (const std::string_view k : kKnown) known = known || k == name;
    DAPO_REQUIRE(known, kWhere, "rollout_rs option '", name,
                 "' is not one of token_k1..3, seq_sum_k1..3, seq_mean_k1..3, seq_max_k2, seq_max_k3");
    bool seen = false;
    for (const std::string& earlier : option_names) seen = seen || earlier == name;
    if (!seen) option_names.push_back(name);
  }
  DAPO_REQUIRE(!option_names.empty(), kWhere, "rollout_rs is '", names, "', expected at least one option");
  std::vector<std::string> specs = split_commas(thresholds);
  DAPO_REQUIRE(specs.size() == 1 || specs.size() == option_names.size(), kWhere, "rollout_rs_threshold is '",
               thresholds, "': expected one threshold for all options or one per option (", option_names.size(), ")");
  if (specs.size() == 1) specs.assign(option_names.size(), specs.front());
  std::vector<RolloutRsOption> options;
  for (std::size_t i = 0; i < option_names.size(); ++i) {
    const std::string& name = option_names[i];
    const std::string& spec = specs[i];
    const auto number = [&](const std::string& text) {
      const std::optional<double> value = detail::threshold_number(text);
      DAPO_REQUIRE(value.has_value() && *value > 0.0, kWhere, "threshold '", spec, "' of ", name,
                   " is not a positive number");
      return *value;
    };
    RolloutRsOption option{name, 0.0, 0.0};
    const auto underscore = spec.find('_');
    if (name.ends_with("k1")) {
      const double upper = number(underscore == std::string::npos ? spec : spec.substr(underscore + 1));
      const double lower = underscore == std::string::npos ? 1.0 / upper : number(spec.substr(0, underscore));
      DAPO_REQUIRE(lower <= upper, kWhere, "threshold '", spec, "' of ", name, ": expected lower <= upper");
      option.lower = std::log(lower);
      option.upper = std::log(upper);
    } else {
      DAPO_REQUIRE(underscore == std::string::npos, kWhere, "threshold '", spec, "' of ", name,
                   " must be a single upper bound (no '_')");
      option.upper = number(spec);
    }
    options.push_back(option);
  }
  return options;
}

namespace detail {

template <std::floating_point T>
std::vector<double> checked_mask(std::span<const T> log_ratio, std::span<const T> mask, int64_t rows, int64_t cols,
                                 const char* where) {
  DAPO_REQUIRE(rows >= 0 && cols >= 0, where, "shape [", rows, ", ", cols, "] has a negative extent");
  const auto size = static_cast<std::size_t>(rows * cols);
  DAPO_REQUIRE(log_ratio.size() == size, where, "log_ratio has ", log_ratio.size(),
               " elements, expected B * T = ", rows, " * ", cols);
  DAPO_REQUIRE(mask.size() == size, where, "response_mask has ", mask.size(), " elements but log_ratio has ", size);
  std::vector<double> values(size);
  for (std::size_t i = 0; i < size; ++i) {
    const auto m = static_cast<double>(mask[i]);
    DAPO_REQUIRE(m == 0.0 || m == 1.0, where, "response_mask[", static_cast<int64_t>(i) / std::max<int64_t>(cols, 1),
                 ", ", static_cast<int64_t>(i) % std::max<int64_t>(cols, 1), "] is ", m, ", expected 0 or 1");
    values[i] = m;
  }
  return values;
}

inline double bounded_log_ratio(double x) {
  return x < -kRolloutSafetyBound ? -kRolloutSafetyBound : (x > kRolloutSafetyBound ? kRolloutSafetyBound : x);
}

}  // namespace detail

namespace core {

// The IS weights into `weights` [B, T]; returns verl's metrics that these weights alone define
// (rollout_is_oob_ratio for IcePop, rollout_is_batch_norm_factor when normalising).
template <std::floating_point T>
std::map<std::string, double> rollout_is_weights(std::span<const T> log_ratio, std::span<const T> response_mask,
                                                 int64_t rows, int64_t cols, const RolloutIsOptions& options,
                                                 std::span<T> weights) {
  constexpr const char* kWhere = "dapo::core::rollout_is_weights";
  const std::vector<double> mask = detail::checked_mask(log_ratio, response_mask, rows, cols, kWhere);
  DAPO_REQUIRE(weights.size() == mask.size(), kWhere, "weights has ", weights.size(), " elements, expected ",
               mask.size());
  DAPO_REQUIRE(options.upper > 0.0 && options.lower >= 0.0 && options.lower <= options.upper, kWhere,
               "thresholds lower ", options.lower, " and upper ", options.upper,
               ", expected 0 <= lower <= upper, upper > 0");
  const bool icepop = options.lower > 0.0;
  std::vector<double> w(mask.size());
  double tokens = 0.0, out_of_band = 0.0;
  for (int64_t b = 0; b < rows; ++b) {
    double row_log_ratio = 0.0;
    if (options.level == RolloutIsLevel::kSequence) {
      for (int64_t t = 0; t < cols; ++t) {
        const auto i = static_cast<std::size_t>(b * cols + t);
        if (mask[i] != 0.0) row_log_ratio += static_cast<double>(log_ratio[i]);
      }
    }
    for (int64_t t = 0; t < cols; ++t) {
      const auto i = static_cast<std::size_t>(b * cols + t);
      const double l = options.level == RolloutIsLevel::kToken ? static_cast<double>(log_ratio[i]) : row_log_ratio;
      const double raw = std::exp(detail::bounded_log_ratio(l)) * mask[i];
      const bool outside = raw < options.lower || raw > options.upper;
      if (icepop) {
        w[i] = outside ? 0.0 : raw;
      } else {
        w[i] = raw > options.upper ? options.upper : raw;
      }
      tokens += mask[i];
      out_of_band += outside ? mask[i] : 0.0;
    }
  }
  std::map<std::string, double> metrics;
  if (icepop) metrics["rollout_is_oob_ratio"] = out_of_band / (tokens + kVerlCountEpsilon);
  if (options.batch_normalize) {
    double mean = 0.0;
    if (options.level == RolloutIsLevel::kToken) {
      double sum = 0.0;
      for (std::size_t i = 0; i < w.size(); ++i) sum += mask[i] != 0.0 ? w[i] : 0.0;
      mean = sum / (tokens + kVerlCountEpsilon);
    } else {
      double sum = 0.0, nonempty = 0.0;
      for (int64_t b = 0; b < rows; ++b) {
        double row_sum = 0.0, row_tokens = 0.0;
        for (int64_t t = 0; t < cols; ++t) {
          const auto i = static_cast<std::size_t>(b * cols + t);
          row_sum += mask[i] != 0.0 ? w[i] : 0.0;
          row_tokens += mask[i];
        }
        if (row_tokens > 0.0) {
          sum += row_sum / (row_tokens + kVerlCountEpsilon);
          nonempty += 1.0;
        }
      }
      mean = sum / std::max(nonempty, 1e-8);
    }
    if (mean > 1e-8) {
      for (double& value : w) value /= mean;
      metrics["rollout_is_batch_norm_factor"] = mean;
    } else {
      metrics["rollout_is_batch_norm_factor"] = 1.0;
    }
  }
  for (std::size_t i = 0; i < w.size(); ++i) weights[i] = static_cast<T>(w[i]);
  return metrics;
}

// The response mask after rejection into `kept` [B, T] (mask * the product of the options' keep flags); returns
// verl's fractions: rollout_rs_<option>_masked_fraction, rollout_rs_<option>_seq_masked_fraction,
// rollout_rs_masked_fraction, rollout_rs_seq_masked_fraction.
template <std::floating_point T>
std::map<std::string, double> rollout_rejection_mask(std::span<const T> log_ratio, std::span<const T> response_mask,
                                                     int64_t rows, int64_t cols,
                                                     const std::vector<RolloutRsOption>& options, std::span<T> kept) {
  constexpr const char* kWhere = "dapo::core::rollout_rejection_mask";
  const std::vector<double> mask = detail::checked_mask(log_ratio, response_mask, rows, cols, kWhere);
  DAPO_REQUIRE(kept.size() == mask.size(), kWhere, "kept has ", kept.size(), " elements, expected ", mask.size());
  DAPO_REQUIRE(!options.empty(), kWhere, "no rejection option given");
  const auto size = mask.size();
  std::vector<double> k1(size), k2(size), k3(size);
  for (std::size_t i = 0; i < size; ++i) {
    const double l = detail::bounded_log_ratio(static_cast<double>(log_ratio[i]));
    k1[i] = -l;
    k2[i] = 0.5 * (l * l);
    k3[i] = std::exp(l) - 1.0 - l;
  }
  double tokens = 0.0, nonempty_rows = 0.0;
  std::vector<double> row_tokens(static_cast<std::size_t>(rows), 0.0);
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t t = 0; t < cols; ++t)
      row_tokens[static_cast<std::size_t>(b)] += mask[static_cast<std::size_t>(b * cols + t)];
    tokens += row_tokens[static_cast<std::size_t>(b)];
    nonempty_rows += row_tokens[static_cast<std::size_t>(b)] > 0.0 ? 1.0 : 0.0;
  }
  std::map<std::string, double> metrics;
  std::vector<double> combined(size, 1.0);
  for (const RolloutRsOption& option : options) {
    const std::vector<double>& statistic = option.name.ends_with("k1") ? k1 : option.name.ends_with("k2") ? k2 : k3;
    const bool two_sided = option.name.ends_with("k1");
    const auto keeps = [&](double value) {
      return two_sided ? value >= option.lower && value <= option.upper : value <= option.upper;
    };
    std::vector<double> keep(size, 1.0);
    for (int64_t b = 0; b < rows; ++b) {
      const auto row = static_cast<std::size_t>(b * cols);
      if (option.name.starts_with("token_")) {
        for (int64_t t = 0; t < cols; ++t) keep[row + t] = keeps(statistic[row + t]) ? 1.0 : 0.0;
        continue;
      }
      double value = 0.0;
      if (option.name.starts_with("seq_max")) {
        value = -INFINITY;
        for (int64_t t = 0; t < cols; ++t) {
          if (mask[row + t] != 0.0) value = std::max(value, statistic[row + t]);
        }
        if (value == -INFINITY) value = 0.0;
      } else {
        for (int64_t t = 0; t < cols; ++t) value += mask[row + t] != 0.0 ? statistic[row + t] * mask[row + t] : 0.0;
        if (option.name.starts_with("seq_mean")) value /= row_tokens[static_cast<std::size_t>(b)] + kVerlCountEpsilon;
      }
      const double row_keep = keeps(value) ? 1.0 : 0.0;
      for (int64_t t = 0; t < cols; ++t) keep[row + t] = row_keep;
    }
    double dropped_tokens = 0.0, dropped_rows = 0.0;
    for (int64_t b = 0; b < rows; ++b) {
      bool row_dropped = false;
      for (int64_t t = 0; t < cols; ++t) {
        const auto i = static_cast<std::size_t>(b * cols + t);
        dropped_tokens += (1.0 - keep[i]) * mask[i];
        row_dropped = row_dropped || (keep[i] == 0.0 && mask[i] != 0.0);
        combined[i] *= keep[i];
      }
      dropped_rows += row_dropped && row_tokens[static_cast<std::size_t>(b)] > 0.0 ? 1.0 : 0.0;
    }
    metrics["rollout_rs_" + option.name + "_masked_fraction"] = dropped_tokens / (tokens + kVerlCountEpsilon);
    metrics["rollout_rs_" + option.name + "_seq_masked_fraction"] =
        nonempty_rows > 0.0 ? dropped_rows / nonempty_rows : 0.0;
  }
  double dropped_tokens = 0.0, dropped_rows = 0.0;
  for (int64_t b = 0; b < rows; ++b) {
    bool row_dropped = false;
    for (int64_t t = 0; t < cols; ++t) {
      const auto i = static_cast<std::size_t>(b * cols + t);
      dropped_tokens += (1.0 - combined[i]) * mask[i];
      row_dropped = row_dropped || (combined[i] <= 0.5 && mask[i] != 0.0);
      kept[i] = static_cast<T>(mask[i] * combined[i]);
    }
    dropped_rows += row_dropped ? 1.0 : 0.0;
  }
  metrics["rollout_rs_masked_fraction"] = dropped_tokens / (tokens + kVerlCountEpsilon);
  metrics["rollout_rs_seq_masked_fraction"] = rows > 0 ? dropped_rows / static_cast<double>(rows) : 0.0;
  return metrics;
}

}  // namespace core
}  // namespace dapo
