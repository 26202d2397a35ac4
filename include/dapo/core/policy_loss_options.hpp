// What a policy loss computes, apart from how: the loss by verl's name (policy_loss.loss_mode), the aggregation
// (verl's loss_agg_mode), their options and the checks every front end makes first. No arithmetic on data here; the
// per-token math of each loss is in <dapo/core/policy_loss/>, the kernels in <dapo/core/loss.hpp>.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "dapo/core/error.hpp"

namespace dapo {

// How per-token losses become the scalar loss. Explicit, never implied (verl: loss_agg_mode; TRL: loss_type).
enum class LossAggregation {
  kTokenMean,            // DAPO Eq. 8/12: sum over all tokens of the batch / token count ("token-mean", TRL "dapo")
  kGroupTokenMean,       // per group of group_size rows: token sum / token count, then mean over groups (seed, Eq. 8)
  kSeqMeanTokenMean,     // GRPO: mean over responses of the response's token mean ("seq-mean-token-mean", TRL "grpo")
  kSeqMeanTokenSum,      // mean over responses of the response's token sum ("seq-mean-token-sum")
  kSeqMeanTokenSumNorm,  // Dr. GRPO: token sum / (norm_length * rows) ("seq-mean-token-sum-norm", TRL "dr_grpo")
  kTokenSum              // the plain masked token sum, no divisor ("token-sum")
};

// The policy-gradient losses by verl's registry names (verl core_algos.py, @register_policy_loss). Per token, with
// r = logp - old_logp, ratio = exp(clamp(r, -20, 20)), A the advantage (see docs/algorithm.md for the table):
//   vanilla   PPO/DAPO: max(-A ratio, -A clamp(ratio, 1 - clip_low, 1 + clip_high)), capped at -A dual_clip for A < 0;
//             with delta > 0 (TRL's two-sided clip) the first term's ratio is min(ratio, delta)
//   gspo      vanilla's clip on the row's ratio exp(min(mean_t r, 10)) (GSPO, sequence-level importance ratio)
//   sapo      -A * sigmoid(tau (ratio - 1)) * 4 / tau, tau = tau_pos where A > 0 else tau_neg (soft gate, SAPO)
//   cispo     -sg[clamp(ratio, 1 - clip_low, 1 + clip_high)] * A * logp (clipped IS weight, REINFORCE, MiniMax-M1)
//   geo_mean  GMPO: per row -mean_t(A) * exp(mean_t clip(r)), the log-ratio clipped to [-clip_low, clip_high] on the
//             side the advantage's sign makes pessimistic; the rows' plain mean (no token aggregation)
//   dppo_tv   -A * sg[min(ratio, ratio_cap)] * logp where the probability moved less than clip_low/high (else 0)
//   dppo_kl   the same with the binary KL divergence of the token's probability as the trust region
//   dro       -(A * logp - dro_beta / 2 * r^2) (DRO's quadratic log-ratio penalty, r unclamped)
//   kl_cov    -A exp(r), plus ppo_kl_coef * |r| on the kl_cov_ratio share of tokens of largest cov(A, logp)
//   clip_cov  vanilla's clip (ratio unclamped), with a random clip_cov_ratio share of the tokens whose cov(A, logp)
//             lies in (clip_cov_lb, clip_cov_ub) detached (loss 0); the choice is drawn from the caller's generator
//   gpg       -A * logp (GPG: the plain policy gradient)
enum class PolicyLossMode { kVanilla, kGspo, kSapo, kCispo, kGeoMean, kDppoTv, kDppoKl, kDro, kKlCov, kClipCov, kGpg };

// verl adds 1e-8 to each count it divides a mean by (masked_mean, seq-mean-token-mean's per-row token count,
// geo_mean's row lengths). count_epsilon = kVerlCountEpsilon reproduces verl to the last bits; 0 divides by the count.
inline constexpr double kVerlCountEpsilon = 1e-8;

struct PolicyLossOptions {
  double clip_low = 0.2, clip_high = 0.28;  // decoupled clip (Clip-Higher): epsilon_low, epsilon_high of Eq. 10
  double dual_clip = 0.0;                   // c > 1 bounds the loss of A < 0 tokens at -A*c; 0 disables (vanilla)
  LossAggregation aggregation = LossAggregation::kTokenMean;
  int64_t group_size = 0;    // required by kGroupTokenMean
  double norm_length = 0.0;  // kSeqMeanTokenSumNorm divisor per row; 0 means this call's T
  // The whole mini-batch's count that the aggregation divides by, when this call is one micro-batch (on one rank) of
  // it; 0 means this call's own count. Each applies to its modes only and must be at least this call's own count.
  // dapo::micro_batch_options sets the right one from the mini-batch's counts.
  double global_token_count = 0.0;  // kTokenMean: masked tokens
  double global_group_count = 0.0;  // kGroupTokenMean: groups of group_size rows
  double global_row_count = 0.0;    // kSeqMeanTokenMean, kSeqMeanTokenSum: rows with a masked token;
                                    // kSeqMeanTokenSumNorm and geo_mean: rows
  // The loss (verl's policy_loss.loss_mode) and the options of the modes other than vanilla, with verl's defaults.
  PolicyLossMode mode = PolicyLossMode::kVanilla;
  double tau_pos = 1.0, tau_neg = 1.05;  // sapo: the gate's temperature for A > 0 and A <= 0 (actor.tau_pos/_neg)
  double ratio_cap = 20.0;               // dppo_tv, dppo_kl: the detached ratio is truncated above it (clip_ratio_c)
  double dro_beta = 0.0;                 // dro: the penalty's weight, > 0 (policy_loss.dro_beta, no default)
  double kl_cov_ratio = 0.0002;          // kl_cov: share of the tokens that get the penalty
  double ppo_kl_coef = 0.1;              // kl_cov: the penalty's weight
  double clip_cov_ratio = 0.0002;        // clip_cov: share of the tokens detached
  double clip_cov_lb = 1.0, clip_cov_ub = 5.0;  // clip_cov: the covariance band a detached token comes from
  double count_epsilon = 0.0;                   // added to every count a mean divides by (kVerlCountEpsilon: verl's)
  double delta = 0.0;  // vanilla: TRL's two-sided clip, the unclipped ratio capped at delta (> 1 + clip_high); 0: off
  // dapo::policy_loss on CUDA with the dapo::cuda kernel: the host does not wait for the device. The loss and metrics
  // stay there, and the data checks (mask values, empty groups, the global counts) come back as the output's
  // data_check, for dapo::check_deferred_policy_loss once the caller reads it. Elsewhere the data is checked at once.
  bool defer_data_checks = false;
};

// verl's loss_agg_mode names.
constexpr std::array<std::pair<LossAggregation, std::string_view>, 6> kAggregationNames{{
    {LossAggregation::kTokenMean, "token-mean"},
    {LossAggregation::kGroupTokenMean, "group-token-mean"},
    {LossAggregation::kSeqMeanTokenMean, "seq-mean-token-mean"},
    {LossAggregation::kSeqMeanTokenSum, "seq-mean-token-sum"},
    {LossAggregation::kSeqMeanTokenSumNorm, "seq-mean-token-sum-norm"},
    {LossAggregation::kTokenSum, "token-sum"},
}};

// verl's policy_loss.loss_mode names.
constexpr std::array<std::pair<PolicyLossMode, std::string_view>, 11> kPolicyLossNames{{
    {PolicyLossMode::kVanilla, "vanilla"},
    {PolicyLossMode::kGspo, "gspo"},
    {PolicyLossMode::kSapo, "sapo"},
    {PolicyLossMode::kCispo, "cispo"},
    {PolicyLossMode::kGeoMean, "geo_mean"},
    {PolicyLossMode::kDppoTv, "dppo_tv"},
    {PolicyLossMode::kDppoKl, "dppo_kl"},
    {PolicyLossMode::kDro, "dro"},
    {PolicyLossMode::kKlCov, "kl_cov"},
    {PolicyLossMode::kClipCov, "clip_cov"},
    {PolicyLossMode::kGpg, "gpg"},
}};

namespace detail {

template <class Enum, std::size_t kSize>
std::string_view name_of(const std::array<std::pair<Enum, std::string_view>, kSize>& names, Enum value,
                         const char* where) {
  for (const auto& [known, name] : names) {
    if (known == value) return name;
  }
  DAPO_REQUIRE(false, where, "unknown value ", static_cast<int>(value));
  return {};
}

template <class Enum, std::size_t kSize>
Enum value_of(const std::array<std::pair<Enum, std::string_view>, kSize>& names, std::string_view name,
              const char* what, const char* where) {
  std::string known;
  for (const auto& [value, known_name] : names) {
    if (known_name == name) return value;
    known += (known.empty() ? "" : ", ") + std::string(known_name);
  }
  DAPO_REQUIRE(false, where, "unknown ", what, " '", name, "', expected one of ", known);
  return {};
}

}  // namespace detail

inline std::string_view aggregation_name(LossAggregation aggregation) {
  return detail::name_of(kAggregationNames, aggregation, "dapo::aggregation_name");
}

inline LossAggregation aggregation_from_name(std::string_view name) {
  return detail::value_of(kAggregationNames, name, "loss aggregation", "dapo::aggregation_from_name");
}

inline std::string_view policy_loss_name(PolicyLossMode mode) {
  return detail::name_of(kPolicyLossNames, mode, "dapo::policy_loss_name");
}

inline PolicyLossMode policy_loss_from_name(std::string_view name) {
  return detail::value_of(kPolicyLossNames, name, "policy loss", "dapo::policy_loss_from_name");
}

// The aggregation verl applies for loss_mode when asked for `requested`: gspo and sapo always aggregate with
// seq-mean-token-mean in verl, whatever loss_agg_mode says. dapo's own call honours options.aggregation for every
// mode; a caller reproducing verl sets it with this.
inline LossAggregation verl_aggregation(PolicyLossMode mode, LossAggregation requested) {
  return mode == PolicyLossMode::kGspo || mode == PolicyLossMode::kSapo ? LossAggregation::kSeqMeanTokenMean
                                                                        : requested;
}

// The losses whose per-token value depends on that token alone (and, for gspo, on its row): one fused pass computes
// them. geo_mean, kl_cov and clip_cov need the row or the whole call first.
constexpr bool is_token_level(PolicyLossMode mode) {
  return mode != PolicyLossMode::kGeoMean && mode != PolicyLossMode::kKlCov && mode != PolicyLossMode::kClipCov;
}

namespace detail {

// A global_* count: finite, >= 0, and set only for the aggregations it applies to.
inline void check_global_count(double count, const char* name, bool applies, std::string_view aggregation,
                               const char* description, const char* where) {
  DAPO_REQUIRE(std::isfinite(count) && count >= 0.0, where, name, " is ", count,
               ", expected a finite value >= 0 (0 = this call's own count)");
  DAPO_REQUIRE(count == 0.0 || applies, where, name, " is ", count, " but aggregation is ", aggregation, "; ",
               description);
}

inline void check_finite_at_least(double value, double low, bool strict, const char* name, const char* where) {
  DAPO_REQUIRE(std::isfinite(value) && (strict ? value > low : value >= low), where, name, " is ", value,
               ", expected a finite value ", strict ? "> " : ">= ", low);
}

}  // namespace detail

// The checks of PolicyLossOptions that need only the options and the height of the batch (rows) they will be used
// with; every front end calls them first. `where` names the caller in the message ("dapo::policy_loss").
inline void check_policy_loss_options(const PolicyLossOptions& options, int64_t rows, const char* where) {
  const PolicyLossMode loss = options.mode;
  const std::string_view loss_name = policy_loss_name(loss);
  // The clip options bound a ratio for vanilla, gspo, cispo and clip_cov (1 - clip_low must stay >= 0); for
  // geo_mean a log-ratio and for dppo a divergence, where any value >= 0 means something.
  const bool ratio_bound = loss == PolicyLossMode::kVanilla || loss == PolicyLossMode::kGspo ||
                           loss == PolicyLossMode::kCispo || loss == PolicyLossMode::kClipCov;
  DAPO_REQUIRE(std::isfinite(options.clip_low) && options.clip_low >= 0.0 && (!ratio_bound || options.clip_low <= 1.0),
               where, "clip_low is ", options.clip_low,
               ratio_bound ? ", expected a value in [0, 1] (the ratio's lower bound is 1 - clip_low)"
                           : ", expected a finite value >= 0");
  detail::check_finite_at_least(options.clip_high, 0.0, false, "clip_high", where);
  DAPO_REQUIRE(options.dual_clip == 0.0 || (std::isfinite(options.dual_clip) && options.dual_clip > 1.0), where,
               "dual_clip is ", options.dual_clip, ", expected 0 (disabled) or a finite value > 1");
  DAPO_REQUIRE(options.dual_clip == 0.0 || loss == PolicyLossMode::kVanilla, where, "dual_clip is ", options.dual_clip,
               " but the loss is ", loss_name, "; the dual clip is vanilla's (set 0)");
  detail::check_finite_at_least(options.norm_length, 0.0, false, "norm_length (0 means T)", where);
  detail::check_finite_at_least(options.tau_pos, 0.0, true, "tau_pos", where);
  detail::check_finite_at_least(options.tau_neg, 0.0, true, "tau_neg", where);
  detail::check_finite_at_least(options.ratio_cap, 0.0, true, "ratio_cap", where);
  DAPO_REQUIRE(loss != PolicyLossMode::kDro || (std::isfinite(options.dro_beta) && options.dro_beta > 0.0), where,
               "dro_beta is ", options.dro_beta, ", expected a finite value > 0 for the dro loss");
  DAPO_REQUIRE(std::isfinite(options.kl_cov_ratio) && options.kl_cov_ratio > 0.0 && options.kl_cov_ratio <= 1.0, where,
               "kl_cov_ratio is ", options.kl_cov_ratio, ", expected a value in (0, 1]");
  DAPO_REQUIRE(std::isfinite(options.ppo_kl_coef), where, "ppo_kl_coef is ", options.ppo_kl_coef,
               ", expected a finite value");
  DAPO_REQUIRE(std::isfinite(options.clip_cov_ratio) && options.clip_cov_ratio > 0.0 && options.clip_cov_ratio <= 1.0,
               where, "clip_cov_ratio is ", options.clip_cov_ratio, ", expected a value in (0, 1]");
  DAPO_REQUIRE(std::isfinite(options.clip_cov_lb) && std::isfinite(options.clip_cov_ub), where, "clip_cov_lb is ",
               options.clip_cov_lb, " and clip_cov_ub ", options.clip_cov_ub, ", expected finite values");
  DAPO_REQUIRE(options.delta == 0.0 || (std::isfinite(options.delta) && options.delta > 1.0 + options.clip_high), where,
               "delta is ", options.delta,
               ", expected 0 (off) or a finite value > 1 + clip_high = ", 1.0 + options.clip_high);
  DAPO_REQUIRE(options.delta == 0.0 || loss == PolicyLossMode::kVanilla, where, "delta is ", options.delta,
               " but the loss is ", loss_name, "; the two-sided clip is vanilla's (set 0)");
  DAPO_REQUIRE(options.count_epsilon >= 0.0 && options.count_epsilon < 1.0, where, "count_epsilon is ",
               options.count_epsilon, ", expected a value in [0, 1) (verl's is 1e-8)");

  const LossAggregation mode = options.aggregation;
  const bool geo_mean = loss == PolicyLossMode::kGeoMean;
  // geo_mean has no token aggregation (the plain mean of its rows' losses); its one count is the rows.
  const std::string_view agg_name = geo_mean ? std::string_view("geo_mean's mean over rows") : aggregation_name(mode);
  detail::check_global_count(options.global_token_count, "global_token_count",
                             !geo_mean && mode == LossAggregation::kTokenMean, agg_name,
                             "a global token count only applies to token-mean", where);
  detail::check_global_count(options.global_group_count, "global_group_count",
                             !geo_mean && mode == LossAggregation::kGroupTokenMean, agg_name,
                             "a global group count only applies to group-token-mean", where);
  detail::check_global_count(options.global_row_count, "global_row_count",
                             geo_mean || mode == LossAggregation::kSeqMeanTokenMean ||
                                 mode == LossAggregation::kSeqMeanTokenSum ||
                                 mode == LossAggregation::kSeqMeanTokenSumNorm,
                             agg_name,
                             "a global row count only applies to seq-mean-token-mean, seq-mean-token-sum, "
                             "seq-mean-token-sum-norm and the geo_mean loss",
                             where);
  if (mode == LossAggregation::kGroupTokenMean && !geo_mean) {
    DAPO_REQUIRE(options.group_size >= 1, where, "aggregation group-token-mean needs group_size >= 1, got ",
                 options.group_size);
    DAPO_REQUIRE(rows % options.group_size == 0, where, "batch has ", rows,
                 " rows, which group_size = ", options.group_size, " does not divide (group-token-mean)");
    const int64_t groups = rows / options.group_size;
    DAPO_REQUIRE(options.global_group_count == 0.0 || options.global_group_count >= static_cast<double>(groups), where,
                 "global_group_count is ", options.global_group_count, " but this batch alone holds ", groups,
                 " groups (", rows, " rows / group_size ", options.group_size, ")");
  }
  // The seq-mean modes count rows with a masked token, which only the data pass knows (finish_policy_loss);
  // seq-mean-token-sum-norm divides by all rows unless told otherwise (TRL's dr_grpo), and a global_row_count as low
  // as the rows with a token reproduces verl's agg_loss, which divides by those when global_batch_size is not given.
  if (geo_mean) {
    DAPO_REQUIRE(options.global_row_count == 0.0 || options.global_row_count >= static_cast<double>(rows), where,
                 "global_row_count is ", options.global_row_count, " but this batch alone holds ", rows, " rows");
  }
}

}  // namespace dapo
