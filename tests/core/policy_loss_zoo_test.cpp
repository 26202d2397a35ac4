// Every policy_loss and agg_loss case of verl_zoo.json (verl's own functions, float64) through the public plain-buffer
// API: the loss family by verl's names, with verl's metrics, d loss / d log_prob and rollout IS weights, in double
// (1e-10 relative) and float (1e-5); and micro-batch splits that add up to the one-shot loss for every loss that
// can be split.
#include <dapo/core/accumulation.hpp>
#include <dapo/core/agg_loss.hpp>
#include <dapo/core/loss.hpp>

#include <map>
#include <string>
#include <vector>

#include "support/vectors.hpp"
#include "support/zoo_loss_case.hpp"

namespace {

using dapo::test::ZooLossCase;

using dapo::test::as;

template <class T>
struct Computed {
  dapo::core::PolicyLossResult result;
  std::vector<T> grad;
};

template <class T>
Computed<T> compute(const ZooLossCase& c, const dapo::PolicyLossOptions& options) {
  const auto logp = as<T>(c.logp), old_logp = as<T>(c.old_logp), advantages = as<T>(c.advantages), mask = as<T>(c.mask),
             weights = as<T>(c.weights);
  Computed<T> out;
  out.grad.assign(logp.size(), T(0));
  out.result = dapo::core::policy_loss<T>(logp, old_logp, advantages, mask, c.rows, c.cols, options, out.grad, weights);
  return out;
}

}  // namespace

TEST_CASE("core policy_loss matches every policy_loss case of verl_zoo.json: loss, metrics, gradient") {
  const auto cases = dapo::test::zoo_loss_cases();
  if (!cases) return;
  std::map<std::string, int> checked;
  for (const ZooLossCase& c : *cases) {
    CAPTURE(c.name);
    const auto exact = compute<double>(c, c.options);
    const auto single = compute<float>(c, c.options);
    CHECK(dapo::test::close(exact.result.loss, c.loss, 1e-10, 1e-14));
    // float inputs: the log-ratio and the ratio lose ~1e-7 relative each; summed over a few tokens.
    CHECK(dapo::test::close(single.result.loss, c.loss, 1e-5, 1e-5));
    for (const auto& [name, expected] : c.metrics) {
      CAPTURE(name);
      CHECK(dapo::test::close(dapo::test::zoo_metric(exact.result, name), expected, 1e-10, 1e-14));
      CHECK(dapo::test::close(dapo::test::zoo_metric(single.result, name), expected, 1e-5, 1e-5));
    }
    for (std::size_t i = 0; i < c.grad_logp.size(); ++i) {
      CAPTURE(i);
      CHECK(dapo::test::close(exact.grad[i], c.grad_logp[i], 1e-10, 1e-14));
      CHECK(dapo::test::close(single.grad[i], c.grad_logp[i], 1e-5, 1e-5));
    }
    ++checked[c.loss_mode];
  }
  MESSAGE("checked: " << dapo::test::count_message(checked));
}

TEST_CASE("micro-batches of every verl_zoo.json case add up to the one-shot loss and gradient (kl_cov refused)") {
  const auto cases = dapo::test::zoo_loss_cases();
  if (!cases) return;
  std::map<std::string, int> split;
  for (const ZooLossCase& c : *cases) {
    CAPTURE(c.name);
    if (c.rows < 2) continue;
    dapo::PolicyLossOptions options = c.options;
    options.global_row_count = 0.0;  // the micro-batch options set the counts
    const auto whole = compute<double>(c, options);
    const auto mask = as<double>(c.mask);
    const dapo::MiniBatchCounts counts = dapo::core::count_mini_batch<double>(mask, c.rows, c.cols);
    if (options.mode == dapo::PolicyLossMode::kKlCov) {
      CHECK_THROWS_WITH_AS(dapo::micro_batch_options(options, counts),
                           doctest::Contains("the kl_cov loss chooses its tokens by a covariance"),
                           std::invalid_argument);
      continue;
    }
    const dapo::PolicyLossOptions micro = dapo::micro_batch_options(options, counts);
    // Two micro-batches: the first row alone, then the rest (rows are whole; gspo's and geo_mean's ratios need them).
    double loss = 0.0;
    std::vector<double> grad;
    for (const auto& [first, last] : {std::pair<int64_t, int64_t>{0, 1}, {1, c.rows}}) {
      ZooLossCase part = c;
      part.rows = last - first;
      const auto slice = [&](const std::vector<double>& values, int64_t width) {
        return std::vector<double>(values.begin() + first * width, values.begin() + last * width);
      };
      part.logp = slice(c.logp, c.cols);
      part.old_logp = slice(c.old_logp, c.cols);
      part.mask = slice(c.mask, c.cols);
      part.advantages = slice(c.advantages, c.advantages.size() == c.logp.size() ? c.cols : 1);
      if (!c.weights.empty()) part.weights = slice(c.weights, c.cols);
      const auto out = compute<double>(part, micro);
      loss += out.result.loss;
      grad.insert(grad.end(), out.grad.begin(), out.grad.end());
    }
    CHECK(dapo::test::close(loss, whole.result.loss, 1e-12, 1e-15));
    for (std::size_t i = 0; i < grad.size(); ++i) CHECK(dapo::test::close(grad[i], whole.grad[i], 1e-12, 1e-15));
    ++split[c.loss_mode];
  }
  MESSAGE("split in two micro-batches: " << dapo::test::count_message(split));
}

TEST_CASE("core agg_loss matches every agg_loss case of verl_zoo.json, with its gradient") {
  const auto cases = dapo::test::zoo_agg_cases();
  if (!cases) return;
  for (const auto& c : *cases) {
    CAPTURE(c.name);
    const dapo::AggLossOptions options{.dp_size = c.dp_size,
                                       .batch_num_tokens = c.batch_num_tokens,
                                       .global_batch_size = c.global_batch_size,
                                       .loss_scale_factor = c.loss_scale_factor};
    const auto mode = dapo::aggregation_from_name(c.loss_agg_mode);
    std::vector<double> grad(c.loss_mat.size());
    const double loss = dapo::core::agg_loss<double>(c.loss_mat, c.loss_mask, c.rows, c.cols, mode, options, grad);
    CHECK(dapo::test::close(loss, c.loss, 1e-10, 1e-14));
    // The loss is linear in loss_mat: its gradient reproduces it.
    double again = 0.0;
    for (std::size_t i = 0; i < grad.size(); ++i) again += grad[i] * (c.loss_mask[i] != 0.0 ? c.loss_mat[i] : 0.0);
    CHECK(dapo::test::close(again, c.loss, 1e-10, 1e-14));
    const auto loss_mat = as<float>(c.loss_mat), mask = as<float>(c.loss_mask);
    CHECK(dapo::test::close(dapo::core::agg_loss<float>(loss_mat, mask, c.rows, c.cols, mode, options), c.loss, 1e-5,
                            1e-6));
  }
}

TEST_CASE("agg_loss refuses what verl refuses, naming it") {
  const std::vector<double> loss_mat{1.0, 2.0}, mask{1.0, 1.0};
  using A = dapo::LossAggregation;
  CHECK_THROWS_WITH_AS(dapo::core::agg_loss<double>(loss_mat, mask, 1, 2, A::kTokenMean, {.dp_size = 2}),
                       doctest::Contains("dp_size is 2: token-mean needs the global batch_num_tokens"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::core::agg_loss<double>(loss_mat, mask, 1, 2, A::kSeqMeanTokenSum, {.dp_size = 2}),
                       doctest::Contains("seq-mean-token-sum needs the global global_batch_size"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::core::agg_loss<double>(loss_mat, mask, 1, 2, A::kGroupTokenMean),
                       doctest::Contains("group-token-mean is not one of verl's agg_loss modes"),
                       std::invalid_argument);
  const std::vector<double> half{1.0, 0.5};
  CHECK_THROWS_WITH_AS(dapo::core::agg_loss<double>(loss_mat, half, 1, 2, A::kTokenSum),
                       doctest::Contains("mask[0, 1] is 0.5, expected 0 or 1"), std::invalid_argument);
}
