// Every policy_loss case of verl_zoo.json through the tensor API: the fused CPU kernel and the composite reference,
// in float64 (1e-10 relative) and float32 (1e-5), loss, verl's metrics and the autograd gradient of log_prob, with
// rollout IS weights where the case has them; every agg_loss case through dapo::agg_loss on tensors.
#include <ATen/CPUGeneratorImpl.h>
#include <dapo/aggregation.hpp>
#include <dapo/loss.hpp>
#include <dapo/reference/loss.hpp>

#include <map>
#include <string>

#include "support/tensors.hpp"
#include "support/zoo_loss_case.hpp"

namespace {

using dapo::test::ZooLossCase;

struct Run {
  dapo::PolicyLossOutput output;
  std::vector<double> grad;
};

Run run(const ZooLossCase& c, torch::ScalarType dtype, bool fused) {
  using dapo::test::tensor;
  auto logp = tensor(c.logp, {c.rows, c.cols}, dtype).requires_grad_(true);
  const auto old_logp = tensor(c.old_logp, {c.rows, c.cols}, dtype);
  const bool per_token = c.advantages.size() == c.logp.size();
  const auto advantages =
      per_token ? tensor(c.advantages, {c.rows, c.cols}, dtype) : tensor(c.advantages, {c.rows}, dtype);
  const auto mask = tensor(c.mask, {c.rows, c.cols}, dtype);
  const torch::Tensor weights = c.weights.empty() ? torch::Tensor() : tensor(c.weights, {c.rows, c.cols}, dtype);
  Run out{fused ? dapo::policy_loss(logp, old_logp, advantages, mask, c.options, weights)
                : dapo::reference::policy_loss(logp, old_logp, advantages, mask, c.options, weights),
          {}};
  out.output.loss.backward();
  out.grad = dapo::test::values(logp.grad());
  return out;
}

double metric(const dapo::PolicyLossOutput& output, const std::string& name) {
  struct Values {
    double clip_fraction, dual_clip_fraction, approx_kl;
  };
  const Values values{output.clip_fraction.item<double>(), output.dual_clip_fraction.item<double>(),
                      output.approx_kl.item<double>()};
  return dapo::test::zoo_metric(values, name);
}

}  // namespace

TEST_CASE("torch policy_loss, fused and reference, matches every policy_loss case of verl_zoo.json") {
  const auto cases = dapo::test::zoo_loss_cases();
  if (!cases) return;
  std::map<std::string, int> checked;
  for (const ZooLossCase& c : *cases) {
    for (const bool fused : {true, false}) {
      for (const auto dtype : {torch::kFloat64, torch::kFloat32}) {
        CAPTURE(c.name);
        CAPTURE(fused);
        CAPTURE(dtype);
        const double relative = dtype == torch::kFloat64 ? 1e-10 : 1e-5;
        const double absolute = dtype == torch::kFloat64 ? 1e-14 : 1e-5;
        const Run r = run(c, dtype, fused);
        CHECK(dapo::test::close(r.output.loss.item<double>(), c.loss, relative, absolute));
        for (const auto& [name, expected] : c.metrics) {
          CAPTURE(name);
          CHECK(dapo::test::close(metric(r.output, name), expected, relative, absolute));
        }
        for (std::size_t i = 0; i < c.grad_logp.size(); ++i) {
          CAPTURE(i);
          CHECK(dapo::test::close(r.grad[i], c.grad_logp[i], relative, absolute));
        }
      }
    }
    ++checked[c.loss_mode];
  }
  MESSAGE("checked (fused and reference, float64 and float32): " << dapo::test::count_message(checked));
}

TEST_CASE("torch agg_loss matches every agg_loss case of verl_zoo.json, its gradient zero off the mask") {
  const auto cases = dapo::test::zoo_agg_cases();
  if (!cases) return;
  for (const auto& c : *cases) {
    for (const auto dtype : {torch::kFloat64, torch::kFloat32}) {
      CAPTURE(c.name);
      CAPTURE(dtype);
      const double relative = dtype == torch::kFloat64 ? 1e-10 : 1e-5;
      const double absolute = dtype == torch::kFloat64 ? 1e-14 : 1e-6;
      const auto loss_mat = dapo::test::tensor(c.loss_mat, {c.rows, c.cols}, dtype).requires_grad_(true);
      const auto mask = dapo::test::tensor(c.loss_mask, {c.rows, c.cols}, dtype);
      const dapo::AggLossOptions options{.dp_size = c.dp_size,
                                         .batch_num_tokens = c.batch_num_tokens,
                                         .global_batch_size = c.global_batch_size,
                                         .loss_scale_factor = c.loss_scale_factor};
      const auto loss = dapo::agg_loss(loss_mat, mask, dapo::aggregation_from_name(c.loss_agg_mode), options);
      CHECK((loss.scalar_type() == dtype));
      CHECK(dapo::test::close(loss.item<double>(), c.loss, relative, absolute));
      loss.backward();
      // Linear in loss_mat: the gradient reproduces the loss.
      CHECK(dapo::test::close((loss_mat.grad() * loss_mat).sum().item<double>(), c.loss, relative, absolute));
      CHECK(loss_mat.grad().masked_select(mask == 0).abs().sum().item<double>() == 0.0);
    }
  }
}

TEST_CASE("torch agg_loss names a mask of another shape or dtype") {
  const auto loss_mat = torch::zeros({2, 3});
  CHECK_THROWS_WITH_AS(dapo::agg_loss(loss_mat, torch::ones({2, 2}), dapo::LossAggregation::kTokenMean),
                       doctest::Contains("dapo::agg_loss: loss_mask has shape [2, 2] but loss_mat has [2, 3]"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::agg_loss(loss_mat, torch::ones({2, 3}, torch::kInt64), dapo::LossAggregation::kTokenMean),
                       doctest::Contains("loss_mask has dtype Long, expected bool or floating"), std::invalid_argument);
}

TEST_CASE("torch policy_loss refuses weights of another shape, naming them") {
  const auto logp = torch::zeros({2, 3}, torch::kFloat64), advantages = torch::ones({2}, torch::kFloat64);
  const auto mask = torch::ones({2, 3}, torch::kFloat64);
  CHECK_THROWS_WITH_AS(dapo::policy_loss(logp, logp, advantages, mask, {}, torch::ones({2, 2}, torch::kFloat64)),
                       doctest::Contains("weights has shape [2, 2] but logp has [2, 3]"), std::invalid_argument);
}

TEST_CASE("torch policy_loss with TRL's delta: fused equals the composite, float64 and float32") {
  torch::manual_seed(3);
  const auto old_logp = -torch::rand({8, 33}, torch::kFloat64) * 3.0;
  const auto logp0 = old_logp + torch::randn({8, 33}, torch::kFloat64) * 0.6;
  const auto advantages = torch::randn({8}, torch::kFloat64);
  const auto mask = torch::rand({8, 33}, torch::kFloat64) < 0.8;
  for (const auto dtype : {torch::kFloat64, torch::kFloat32}) {
    for (const double dual_clip : {0.0, 3.0}) {
      CAPTURE(dtype);
      CAPTURE(dual_clip);
      const dapo::PolicyLossOptions options{.dual_clip = dual_clip, .delta = 1.6};
      std::vector<double> losses, grads[2];
      for (const bool fused : {true, false}) {
        auto logp = logp0.to(dtype).detach().requires_grad_(true);
        const auto out =
            fused ? dapo::policy_loss(logp, old_logp.to(dtype), advantages.to(dtype), mask, options)
                  : dapo::reference::policy_loss(logp, old_logp.to(dtype), advantages.to(dtype), mask, options);
        out.loss.backward();
        losses.push_back(out.loss.item<double>());
        grads[fused ? 0 : 1] = dapo::test::values(logp.grad());
      }
      const double relative = dtype == torch::kFloat64 ? 1e-12 : 1e-5;
      CHECK(dapo::test::close(losses[0], losses[1], relative, 1e-7));
      for (std::size_t i = 0; i < grads[0].size(); ++i)
        CHECK(dapo::test::close(grads[0][i], grads[1][i], relative, 1e-7));
    }
  }
}

TEST_CASE("torch clip_cov: fused and composite draw the same tokens from generators in the same state") {
  torch::manual_seed(11);
  const auto old_logp = -torch::rand({6, 40}, torch::kFloat64) * 3.0;
  const auto logp0 = old_logp + torch::randn({6, 40}, torch::kFloat64) * 0.1;
  const auto advantages = torch::randn({6, 40}, torch::kFloat64) * 3.0;
  const auto mask = torch::rand({6, 40}, torch::kFloat64) < 0.9;
  const dapo::PolicyLossOptions options{.mode = dapo::PolicyLossMode::kClipCov,
                                        .clip_cov_ratio = 0.05,
                                        .clip_cov_lb = 0.2,
                                        .clip_cov_ub = 5.0,
                                        .count_epsilon = dapo::kVerlCountEpsilon};
  std::vector<double> losses, fractions, grads[2];
  for (const bool fused : {true, false}) {
    auto generator = at::detail::createCPUGenerator(1234);
    auto logp = logp0.detach().requires_grad_(true);
    const auto out = fused ? dapo::policy_loss(logp, old_logp, advantages, mask, options, {}, generator)
                           : dapo::reference::policy_loss(logp, old_logp, advantages, mask, options, {}, generator);
    out.loss.backward();
    losses.push_back(out.loss.item<double>());
    fractions.push_back(out.clip_fraction.item<double>());
    grads[fused ? 0 : 1] = dapo::test::values(logp.grad());
  }
  CHECK(fractions[0] > 0.0);  // some tokens were chosen
  CHECK(fractions[0] == doctest::Approx(fractions[1]).epsilon(1e-12));
  CHECK(dapo::test::close(losses[0], losses[1], 1e-12, 1e-14));
  for (std::size_t i = 0; i < grads[0].size(); ++i) CHECK(dapo::test::close(grads[0][i], grads[1][i], 1e-12, 1e-14));
}
