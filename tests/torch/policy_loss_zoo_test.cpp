// Every policy_loss case of verl_zoo.json through the tensor API: the fused CPU kernel and the composite reference,
// in float64 (1e-10 relative) and float32 (1e-5), loss, verl's metrics and the autograd gradient of log_prob, with
// rollout IS weights where the case has them.
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

TEST_CASE("torch policy_loss refuses weights of another shape and clip_cov, naming them") {
  const auto logp = torch::zeros({2, 3}, torch::kFloat64), advantages = torch::ones({2}, torch::kFloat64);
  const auto mask = torch::ones({2, 3}, torch::kFloat64);
  CHECK_THROWS_WITH_AS(dapo::policy_loss(logp, logp, advantages, mask, {}, torch::ones({2, 2}, torch::kFloat64)),
                       doctest::Contains("weights has shape [2, 2] but logp has [2, 3]"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::policy_loss(logp, logp, advantages, mask, {.mode = dapo::PolicyLossMode::kClipCov}),
                       doctest::Contains("clip_cov loss draws tokens at random"), std::invalid_argument);
}
