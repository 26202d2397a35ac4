// policy_loss on tensors: goldens (loss, metrics, autograd gradient), agreement with the core on random batches,
// dtypes and mask kinds, boundary errors.
#include <dapo/loss.hpp>

#include <random>

#include "support/loss_case.hpp"
#include "support/tensors.hpp"

namespace {

struct TorchRun {
  dapo::PolicyLossOutput output;
  std::vector<double> grad;
};

TorchRun run_torch(const dapo::test::LossCase& c, torch::ScalarType dtype, bool bool_mask = false) {
  using dapo::test::tensor;
  auto logp = tensor(c.logp, {c.rows, c.cols}, dtype).requires_grad_(true);
  const auto old_logp = tensor(c.old_logp, {c.rows, c.cols}, dtype);
  const auto advantages = c.per_token_advantages ? tensor(c.advantages, {c.rows, c.cols}, dtype)
                                                 : tensor(c.advantages, {c.rows}, dtype);
  auto mask = tensor(c.mask, {c.rows, c.cols}, dtype);
  if (bool_mask) mask = mask.to(torch::kBool);
  TorchRun run{dapo::policy_loss(logp, old_logp, advantages, mask, c.options), {}};
  run.output.loss.backward();
  run.grad = dapo::test::values(logp.grad());
  return run;
}

void check_against(const TorchRun& run, double loss, double clip_fraction, double dual_clip_fraction, double approx_kl,
                   const std::vector<double>& grad, double relative, double absolute) {
  using dapo::test::close;
  CHECK(close(run.output.loss.item<double>(), loss, relative, absolute));
  CHECK(close(run.output.clip_fraction.item<double>(), clip_fraction, relative, absolute));
  CHECK(close(run.output.dual_clip_fraction.item<double>(), dual_clip_fraction, relative, absolute));
  CHECK(close(run.output.approx_kl.item<double>(), approx_kl, relative, absolute));
  REQUIRE(run.grad.size() == grad.size());
  for (std::size_t i = 0; i < grad.size(); ++i) CHECK(close(run.grad[i], grad[i], relative, absolute));
}

}  // namespace

TEST_CASE("torch policy_loss matches every golden case: loss, metrics, d loss / d logp") {
  const auto cases = dapo::test::golden_loss_cases();
  if (cases.empty()) return;
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const auto in_double = run_torch(c, torch::kFloat64);
    CHECK(in_double.output.loss.dim() == 0);
    check_against(in_double, c.loss, c.clip_fraction, c.dual_clip_fraction, c.approx_kl, c.grad_logp, 1e-9, 1e-15);
    check_against(run_torch(c, torch::kFloat32), c.loss, c.clip_fraction, c.dual_clip_fraction, c.approx_kl,
                  c.grad_logp, 1e-5, 1e-6);
    check_against(run_torch(c, torch::kFloat64, /*bool_mask=*/true), c.loss, c.clip_fraction, c.dual_clip_fraction,
                  c.approx_kl, c.grad_logp, 1e-9, 1e-15);
  }
}

TEST_CASE("torch and core front ends agree on random batches (all aggregations, dual clip, [B] and [B, T])") {
  std::mt19937_64 rng(2025);
  for (const auto& [aggregation, name] : dapo::kAggregationNames) {
    for (const double dual_clip : {0.0, 3.0}) {
      for (const bool per_token : {false, true}) {
        const dapo::PolicyLossOptions options{
            .dual_clip = dual_clip, .aggregation = aggregation, .group_size = 4, .norm_length = 32};
        const auto c = dapo::test::random_loss_case(rng, 8, 33, per_token, options);
        CAPTURE(name);
        CAPTURE(dual_clip);
        CAPTURE(per_token);
        std::vector<double> grad(c.logp.size());
        const auto core = dapo::core::policy_loss<double>(c.logp, c.old_logp, c.advantages, c.mask, c.rows, c.cols,
                                                          c.options, grad);
        CHECK(core.clip_fraction > 0.0);  // the random log-ratios do reach past the clip range
        check_against(run_torch(c, torch::kFloat64), core.loss, core.clip_fraction, core.dual_clip_fraction,
                      core.approx_kl, grad, 1e-12, 1e-15);
        check_against(run_torch(c, torch::kFloat32), core.loss, core.clip_fraction, core.dual_clip_fraction,
                      core.approx_kl, grad, 1e-5, 1e-6);
      }
    }
  }
}

TEST_CASE("bfloat16 inputs are computed in float32 and stay close to double") {
  std::mt19937_64 rng(5);
  const auto c = dapo::test::random_loss_case(rng, 16, 64, false, {});
  const auto in_bf16 = run_torch(c, torch::kBFloat16);
  CHECK(dapo::test::dtype_name(in_bf16.output.loss) == "Float");
  const auto in_double = run_torch(c, torch::kFloat64);
  CHECK(dapo::test::close(in_bf16.output.loss.item<double>(), in_double.output.loss.item<double>(), 3e-2, 1e-3));
}

TEST_CASE("ratio 1 gives zero clip fractions and KL; the gradient is -A / tokens") {
  const auto logp = torch::randn({3, 5}, torch::kFloat64).requires_grad_(true);
  const auto advantages = torch::tensor({1.0, -2.0, 0.5}, torch::kFloat64);
  const auto mask = torch::ones({3, 5}, torch::kBool);
  const auto out = dapo::policy_loss(logp, logp.detach(), advantages, mask, {.dual_clip = 3.0});
  CHECK(out.clip_fraction.item<double>() == 0.0);
  CHECK(out.dual_clip_fraction.item<double>() == 0.0);
  CHECK(out.approx_kl.item<double>() == 0.0);
  out.loss.backward();
  CHECK(torch::allclose(logp.grad(), (-advantages / 15.0).unsqueeze(1).expand({3, 5})));
}

TEST_CASE("torch policy_loss rejects bad tensors with messages naming them") {
  const auto logp = torch::zeros({4, 10});
  const auto advantages = torch::zeros({4});
  const auto mask = torch::ones({4, 10});
  CHECK_THROWS_WITH_AS(dapo::policy_loss(logp, logp, advantages, torch::ones({4, 9})),
                       doctest::Contains("dapo::policy_loss: mask has shape [4, 9] but logp has [4, 10]"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::policy_loss(logp, torch::zeros({4, 11}), advantages, mask),
                       doctest::Contains("old_logp has shape [4, 11] but logp has [4, 10]"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::policy_loss(logp, logp.to(torch::kFloat64), advantages, mask),
                       doctest::Contains("old_logp has dtype Double but logp has Float"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::policy_loss(logp, logp, torch::zeros({5}), mask),
                       doctest::Contains("advantages has shape [5], expected [4] or [4, 10]"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::policy_loss(torch::zeros({40}), torch::zeros({40}), advantages, mask),
                       doctest::Contains("logp has shape [40], expected 2 dimensions"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::policy_loss(logp, logp, advantages, torch::ones({4, 10}, torch::kLong)),
                       doctest::Contains("mask has dtype Long, expected bool or a floating dtype"),
                       std::invalid_argument);
  auto half_mask = mask.clone();
  half_mask[2][7] = 0.5;
  CHECK_THROWS_WITH_AS(dapo::policy_loss(logp, logp, advantages, half_mask),
                       doctest::Contains("mask[2, 7] is 0.5, expected 0 or 1"), std::invalid_argument);
  auto empty_group = mask.clone();
  empty_group.slice(0, 2, 4).zero_();
  CHECK_THROWS_WITH_AS(
      dapo::policy_loss(logp, logp, advantages, empty_group,
                        {.aggregation = dapo::LossAggregation::kGroupTokenMean, .group_size = 2}),
      doctest::Contains("group[1] (group_size = 2) has no masked token"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::policy_loss(logp, logp, advantages, mask, {.clip_high = -0.1}),
                       doctest::Contains("clip_high is -0.10000000000000001"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::policy_loss(logp, logp, advantages, mask, {.global_token_count = 39}),
                       doctest::Contains("global_token_count is 39 but this batch alone holds 40 masked tokens"),
                       std::invalid_argument);
}
