// The policy_loss and agg_loss cases of ../shared/fixtures/algo/verl_zoo.json (verl's own functions), read by their
// fields into dapo's options: every case the file holds, whatever their number and order.
#pragma once

#include <dapo/core/policy_loss_options.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "support/shared.hpp"

namespace dapo::test {

struct ZooLossCase {
  std::string loss_mode, loss_agg_mode;  // as verl names them
  int64_t rows = 0, cols = 0;
  std::vector<double> old_logp, logp, advantages, mask, weights;  // [B, T] flat; weights empty when null
  PolicyLossOptions options;                                      // verl's config in dapo's terms
  double loss = 0;
  std::map<std::string, double> metrics;  // verl's names ("actor/pg_clipfrac", ...): only those verl reported
  std::vector<double> grad_logp;
  std::string name;  // "<loss_mode> <loss_agg_mode> #<index>" for messages
};

// The metric of ours that verl reports under `name`.
template <class Result>
double zoo_metric(const Result& result, const std::string& name) {
  if (name == "actor/pg_clipfrac") return static_cast<double>(result.clip_fraction);
  if (name == "actor/pg_clipfrac_lower") return static_cast<double>(result.dual_clip_fraction);
  if (name == "actor/ppo_kl") return static_cast<double>(result.approx_kl);
  FAIL("verl_zoo.json names a metric this test does not know: " << name);
  return 0.0;
}

// verl's actor config in dapo's options, with verl's defaults where a key is absent (verl core_algos.py and
// trainer/config/actor/actor.yaml): clip_ratio_low/high default to clip_ratio; clip_ratio_c is vanilla's dual clip
// (3.0) and dppo's ratio cap (20.0); counts carry verl's 1e-8; gspo and sapo aggregate as verl makes them.
inline PolicyLossOptions options_from_verl(const std::string& loss_mode, const std::string& loss_agg_mode,
                                           const nlohmann::json& config) {
  PolicyLossOptions o;
  o.mode = policy_loss_from_name(loss_mode);
  const double clip_ratio = config.value("clip_ratio", 0.2);
  const auto or_clip_ratio = [&](const char* key) {
    return config.contains(key) && !config.at(key).is_null() ? config.at(key).get<double>() : clip_ratio;
  };
  o.clip_low = or_clip_ratio("clip_ratio_low");
  o.clip_high = or_clip_ratio("clip_ratio_high");
  if (o.mode == PolicyLossMode::kVanilla) o.dual_clip = config.value("clip_ratio_c", 3.0);
  if (o.mode == PolicyLossMode::kDppoTv || o.mode == PolicyLossMode::kDppoKl) {
    o.ratio_cap = config.value("clip_ratio_c", 20.0);
  }
  o.tau_pos = config.value("tau_pos", o.tau_pos);
  o.tau_neg = config.value("tau_neg", o.tau_neg);
  if (config.contains("policy_loss")) {
    const auto& policy_loss = config.at("policy_loss");
    const auto number = [&](const char* key, double fallback) {
      return policy_loss.contains(key) && !policy_loss.at(key).is_null() ? policy_loss.at(key).get<double>() : fallback;
    };
    o.dro_beta = number("dro_beta", o.dro_beta);
    o.kl_cov_ratio = number("kl_cov_ratio", o.kl_cov_ratio);
    o.ppo_kl_coef = number("ppo_kl_coef", 1.0);  // core_algos.py's default when the key is null
    o.clip_cov_ratio = number("clip_cov_ratio", o.clip_cov_ratio);
    o.clip_cov_lb = number("clip_cov_lb", o.clip_cov_lb);
    o.clip_cov_ub = number("clip_cov_ub", o.clip_cov_ub);
  }
  o.aggregation = verl_aggregation(o.mode, aggregation_from_name(loss_agg_mode));
  o.count_epsilon = kVerlCountEpsilon;
  return o;
}

// Every policy_loss case, or nothing when the data is missing (the caller skips; see require_shared). Prints the
// count per loss and fails when a loss of verl's ten fixed ones has none.
inline std::optional<std::vector<ZooLossCase>> zoo_loss_cases() {
  const auto cases = verl_zoo("policy_loss");
  if (!cases) return std::nullopt;
  std::vector<ZooLossCase> all;
  std::map<std::string, int> per_loss;
  for (const auto& item : *cases) {
    ZooLossCase c;
    c.loss_mode = item.at("loss_mode").get<std::string>();
    c.loss_agg_mode = item.at("loss_agg_mode").get<std::string>();
    c.rows = static_cast<int64_t>(item.at("log_prob").size());
    c.cols = c.rows > 0 ? static_cast<int64_t>(item.at("log_prob").at(0).size()) : 0;
    c.old_logp = flatten(item.at("old_log_prob"));
    c.logp = flatten(item.at("log_prob"));
    c.advantages = flatten(item.at("advantages"));
    c.mask = flatten(item.at("response_mask"));
    if (!item.at("rollout_is_weights").is_null()) c.weights = flatten(item.at("rollout_is_weights"));
    c.options = options_from_verl(c.loss_mode, c.loss_agg_mode, item.at("config"));
    if (c.options.aggregation == LossAggregation::kSeqMeanTokenSumNorm) {
      // verl divides by the rows with a token when global_batch_size is not given; dapo by all rows unless told.
      int64_t nonempty = 0;
      for (int64_t b = 0; b < c.rows; ++b) {
        double tokens = 0;
        for (int64_t t = 0; t < c.cols; ++t) tokens += c.mask[static_cast<std::size_t>(b * c.cols + t)];
        nonempty += tokens > 0 ? 1 : 0;
      }
      c.options.global_row_count = static_cast<double>(nonempty);
    }
    c.loss = item.at("loss").get<double>();
    for (const auto& [name, value] : item.at("metrics").items()) c.metrics[name] = value.get<double>();
    c.grad_logp = flatten(item.at("grad_log_prob"));
    const auto size = static_cast<std::size_t>(c.rows * c.cols);
    REQUIRE(c.logp.size() == size);
    REQUIRE(c.old_logp.size() == size);
    REQUIRE(c.mask.size() == size);
    REQUIRE(c.grad_logp.size() == size);
    REQUIRE((c.advantages.size() == size || c.advantages.size() == static_cast<std::size_t>(c.rows)));
    REQUIRE((c.weights.empty() || c.weights.size() == size));
    c.name = c.loss_mode + " " + c.loss_agg_mode + " #" + std::to_string(all.size());
    ++per_loss[c.loss_mode + (c.weights.empty() ? "" : "+is")];
    all.push_back(std::move(c));
  }
  MESSAGE("verl_zoo.json policy_loss: " << all.size() << " cases (" << count_message(per_loss) << ")");
  for (const char* mode :
       {"vanilla", "gspo", "sapo", "cispo", "geo_mean", "dppo_tv", "dppo_kl", "dro", "kl_cov", "gpg"}) {
    CAPTURE(mode);
    CHECK((per_loss[mode] + per_loss[std::string(mode) + "+is"]) > 0);
  }
  return all;
}

struct ZooAggCase {
  std::string loss_agg_mode;
  int64_t rows = 0, cols = 0;
  std::vector<double> loss_mat, loss_mask;
  // verl's agg_loss keyword arguments; 0 where absent.
  double batch_num_tokens = 0, global_batch_size = 0, loss_scale_factor = 0;
  int64_t dp_size = 1;
  double loss = 0;
  std::string name;
};

// Every agg_loss case, counted per mode; fails when a mode of verl's five has none.
inline std::optional<std::vector<ZooAggCase>> zoo_agg_cases() {
  const auto cases = verl_zoo("agg_loss");
  if (!cases) return std::nullopt;
  std::vector<ZooAggCase> all;
  std::map<std::string, int> per_mode;
  for (const auto& item : *cases) {
    ZooAggCase c;
    c.loss_agg_mode = item.at("loss_agg_mode").get<std::string>();
    c.rows = static_cast<int64_t>(item.at("loss_mat").size());
    c.cols = c.rows > 0 ? static_cast<int64_t>(item.at("loss_mat").at(0).size()) : 0;
    c.loss_mat = flatten(item.at("loss_mat"));
    c.loss_mask = flatten(item.at("loss_mask"));
    REQUIRE(c.loss_mask.size() == c.loss_mat.size());
    const auto& kwargs = item.at("kwargs");
    c.batch_num_tokens = kwargs.value("batch_num_tokens", 0.0);
    c.global_batch_size = kwargs.value("global_batch_size", 0.0);
    c.loss_scale_factor = kwargs.value("loss_scale_factor", 0.0);
    c.dp_size = kwargs.value("dp_size", int64_t{1});
    c.loss = item.at("loss").get<double>();
    c.name = c.loss_agg_mode + " #" + std::to_string(all.size());
    ++per_mode[c.loss_agg_mode];
    all.push_back(std::move(c));
  }
  MESSAGE("verl_zoo.json agg_loss: " << all.size() << " cases (" << count_message(per_mode) << ")");
  for (const char* mode :
       {"token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"}) {
    CAPTURE(mode);
    CHECK(per_mode[mode] > 0);
  }
  return all;
}

}  // namespace dapo::test
