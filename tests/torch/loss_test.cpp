// policy_loss on tensors: goldens (loss, metrics, autograd gradient), agreement with the core on random batches,
// dtypes and mask kinds, boundary errors; on CUDA (when a GPU is present) against the reference and the CPU.
#include <torch/cuda.h>
#include <dapo/loss.hpp>
#include <dapo/reference/loss.hpp>

#include <random>

#include "support/loss_case.hpp"
#include "support/loss_fns.hpp"
#include "support/tensors.hpp"

namespace {

struct TorchRun {
  dapo::PolicyLossOutput output;
  std::vector<double> grad;
};

using dapo::test::kFused;
using dapo::test::kReference;
using dapo::test::LossFn;

// The case's tensors in `dtype` on `device` (rounded to dtype first, so every device sees the same values).
TorchRun run_torch(const dapo::test::LossCase& c, torch::ScalarType dtype, bool bool_mask = false,
                   LossFn loss_fn = kFused, torch::Device device = torch::kCPU) {
  using dapo::test::tensor;
  auto logp = tensor(c.logp, {c.rows, c.cols}, dtype).to(device).requires_grad_(true);
  const auto old_logp = tensor(c.old_logp, {c.rows, c.cols}, dtype).to(device);
  const auto advantages =
      (c.per_token_advantages ? tensor(c.advantages, {c.rows, c.cols}, dtype) : tensor(c.advantages, {c.rows}, dtype))
          .to(device);
  auto mask = tensor(c.mask, {c.rows, c.cols}, dtype).to(device);
  if (bool_mask) mask = mask.to(torch::kBool);
  TorchRun run{loss_fn(logp, old_logp, advantages, mask, c.options), {}};
  run.output.loss.backward();
  run.grad = dapo::test::values(logp.grad().cpu());
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

// `run` against `expected`: the metrics within (relative, absolute), d loss / d logp within (grad_relative, absolute)
// (a gradient in bfloat16 may round to either neighbour of a float32 value that differs in its last bits).
void check_runs_agree(const TorchRun& run, const TorchRun& expected, double relative, double absolute,
                      double grad_relative) {
  using dapo::test::close;
  CHECK(close(run.output.loss.item<double>(), expected.output.loss.item<double>(), relative, absolute));
  CHECK(
      close(run.output.clip_fraction.item<double>(), expected.output.clip_fraction.item<double>(), relative, absolute));
  CHECK(close(run.output.dual_clip_fraction.item<double>(), expected.output.dual_clip_fraction.item<double>(), relative,
              absolute));
  CHECK(close(run.output.approx_kl.item<double>(), expected.output.approx_kl.item<double>(), relative, absolute));
  REQUIRE(run.grad.size() == expected.grad.size());
  for (std::size_t i = 0; i < run.grad.size(); ++i) {
    CHECK(close(run.grad[i], expected.grad[i], grad_relative, absolute));
  }
}

}  // namespace

TEST_CASE("fused and reference policy_loss match every golden case: loss, metrics, d loss / d logp") {
  const auto cases = dapo::test::golden_loss_cases();
  if (cases.empty()) return;
  for (const LossFn loss_fn : {kFused, kReference}) {
    for (const auto& c : cases) {
      CAPTURE(c.name);
      CAPTURE(loss_fn == kFused);
      const auto in_double = run_torch(c, torch::kFloat64, false, loss_fn);
      CHECK(in_double.output.loss.dim() == 0);
      check_against(in_double, c.loss, c.clip_fraction, c.dual_clip_fraction, c.approx_kl, c.grad_logp, 1e-9, 1e-15);
      check_against(run_torch(c, torch::kFloat32, false, loss_fn), c.loss, c.clip_fraction, c.dual_clip_fraction,
                    c.approx_kl, c.grad_logp, 1e-5, 1e-6);
      check_against(run_torch(c, torch::kFloat64, /*bool_mask=*/true, loss_fn), c.loss, c.clip_fraction,
                    c.dual_clip_fraction, c.approx_kl, c.grad_logp, 1e-9, 1e-15);
    }
  }
}

TEST_CASE("fused, reference and core agree on random batches (all aggregations, dual clip, [B] and [B, T])") {
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
        const auto core =
            dapo::core::policy_loss<double>(c.logp, c.old_logp, c.advantages, c.mask, c.rows, c.cols, c.options, grad);
        CHECK(core.clip_fraction > 0.0);  // the random log-ratios do reach past the clip range
        for (const LossFn loss_fn : {kFused, kReference}) {
          check_against(run_torch(c, torch::kFloat64, false, loss_fn), core.loss, core.clip_fraction,
                        core.dual_clip_fraction, core.approx_kl, grad, 1e-12, 1e-15);
          // token-sum is a sum, not a mean: float32 rounding grows with the token count (core.token_count).
          const double float_absolute =
              aggregation == dapo::LossAggregation::kTokenSum ? 1e-6 * core.token_count : 1e-6;
          check_against(run_torch(c, torch::kFloat32, true, loss_fn), core.loss, core.clip_fraction,
                        core.dual_clip_fraction, core.approx_kl, grad, 1e-5, float_absolute);
        }
      }
    }
  }
}

TEST_CASE("bfloat16 inputs are computed in float32: fused equals reference, and both stay close to double") {
  std::mt19937_64 rng(5);
  const auto c = dapo::test::random_loss_case(rng, 16, 64, false, {});
  const auto fused = run_torch(c, torch::kBFloat16);
  const auto reference = run_torch(c, torch::kBFloat16, false, kReference);
  CHECK(dapo::test::dtype_name(fused.output.loss) == "Float");
  check_against(fused, reference.output.loss.item<double>(), reference.output.clip_fraction.item<double>(),
                reference.output.dual_clip_fraction.item<double>(), reference.output.approx_kl.item<double>(),
                reference.grad, 1e-5, 1e-6);
  const auto in_double = run_torch(c, torch::kFloat64);
  CHECK(dapo::test::close(fused.output.loss.item<double>(), in_double.output.loss.item<double>(), 3e-2, 1e-3));
}

TEST_CASE(
    "CUDA: policy_loss on CUDA tensors equals the reference and the CPU (aggregations, dual clip, masks, dtypes)") {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: the CUDA policy_loss checks are skipped");
    return;
  }
  const torch::Device cuda(torch::kCUDA, 0);
  MESSAGE("policy_loss on CUDA runs " << (dapo::detail::cuda_policy_loss_kernel() != nullptr
                                              ? "the fused kernel (dapo::cuda)"
                                              : "the composite ops (no dapo::cuda registered)"));
  std::mt19937_64 rng(2026);
  bool clipped = false, dual_clipped = false;
  for (const auto& [aggregation, name] : dapo::kAggregationNames) {
    for (const double dual_clip : {0.0, 3.0}) {
      for (const bool per_token : {false, true}) {
        const dapo::PolicyLossOptions options{
            .dual_clip = dual_clip, .aggregation = aggregation, .group_size = 4, .norm_length = 32};
        const auto c = dapo::test::random_loss_case(rng, 8, 33, per_token, options);
        for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
          for (const bool bool_mask : {false, true}) {
            CAPTURE(name);
            CAPTURE(dual_clip);
            CAPTURE(per_token);
            CAPTURE(c10::toString(dtype));
            CAPTURE(bool_mask);
            const auto on_cuda = run_torch(c, dtype, bool_mask, kFused, cuda);
            CHECK(on_cuda.output.loss.is_cuda());
            CHECK(dapo::test::dtype_name(on_cuda.output.loss) == "Float");  // bfloat16 is computed in float32
            // Both paths compute in float32 from the same (rounded) inputs: only the order of the sums differs. The
            // gradient comes back in logp's dtype: a bfloat16 one may round the other way (one step: <= 2^-7 relative).
            const double grad_relative = dtype == torch::kBFloat16 ? 1e-2 : 1e-5;
            check_runs_agree(on_cuda, run_torch(c, dtype, bool_mask, kReference, cuda), 1e-5, 1e-6, grad_relative);
            check_runs_agree(on_cuda, run_torch(c, dtype, bool_mask, kFused, torch::kCPU), 1e-5, 1e-6, grad_relative);
            clipped = clipped || on_cuda.output.clip_fraction.item<double>() > 0.0;
            dual_clipped = dual_clipped || on_cuda.output.dual_clip_fraction.item<double>() > 0.0;
          }
        }
      }
    }
  }
  CHECK(clipped);       // the random log-ratios reach past the clip range: the clipped branch was compared too
  CHECK(dual_clipped);  // and past the dual clip's bound
}

TEST_CASE("policy_loss with defer_data_checks: on the CPU the data is checked at once and no data_check comes back") {
  std::mt19937_64 rng(31);
  auto c = dapo::test::random_loss_case(rng, 6, 9, false, {});
  c.options.defer_data_checks = true;
  const auto deferred = run_torch(c, torch::kFloat32);
  c.options.defer_data_checks = false;
  const auto immediate = run_torch(c, torch::kFloat32);
  CHECK_FALSE(deferred.output.data_check.defined());
  CHECK(deferred.output.loss.item<float>() == immediate.output.loss.item<float>());
  CHECK(deferred.grad == immediate.grad);
  using dapo::test::tensor;
  auto mask = tensor(c.mask, {c.rows, c.cols});
  mask[2][3] = 0.5;
  c.options.defer_data_checks = true;
  const auto logp = tensor(c.logp, {c.rows, c.cols});
  CHECK_THROWS_WITH_AS(
      dapo::policy_loss(logp, tensor(c.old_logp, {c.rows, c.cols}), tensor(c.advantages, {c.rows}), mask, c.options),
      doctest::Contains("mask[2, 3] is 0.5, expected 0 or 1"), std::invalid_argument);
  CHECK_NOTHROW(dapo::check_deferred_policy_loss(0.0, mask, c.options));  // 0: the call checked, or passed
  CHECK_THROWS_WITH_AS(dapo::check_deferred_policy_loss(1.0, mask, c.options),
                       doctest::Contains("mask[2, 3] is 0.5, expected 0 or 1"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::check_deferred_policy_loss(1.0, tensor(c.mask, {c.rows, c.cols}), c.options),
                       doctest::Contains("pass the call's own mask and options"), std::invalid_argument);
}

TEST_CASE(
    "CUDA: policy_loss with defer_data_checks waits for nothing, equals the immediate call, raises once checked") {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: the deferred CUDA policy_loss checks are skipped");
    return;
  }
  const torch::Device cuda(torch::kCUDA, 0);
  const bool registered = dapo::detail::cuda_policy_loss_deferred() != nullptr;
  MESSAGE("deferred policy_loss on CUDA: " << (registered ? "the kernel finishes on the device (dapo::cuda)"
                                                          : "no dapo::cuda registered: checked at once"));
  std::mt19937_64 rng(37);
  for (const auto& [aggregation, name] : dapo::kAggregationNames) {
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      CAPTURE(name);
      CAPTURE(c10::toString(dtype));
      dapo::PolicyLossOptions options{.dual_clip = 3.0, .aggregation = aggregation, .group_size = 4, .norm_length = 32};
      auto c = dapo::test::random_loss_case(rng, 8, 33, false, options);
      const auto immediate = run_torch(c, dtype, false, kFused, cuda);
      c.options.defer_data_checks = true;
      const auto deferred = run_torch(c, dtype, false, kFused, cuda);
      CHECK(deferred.output.data_check.defined() == registered);
      if (registered) CHECK(deferred.output.data_check.item<double>() == 0.0);
      // The partials are added in the same order on the device: the same bits. The gradient's factor is rounded once.
      CHECK(deferred.output.loss.item<double>() == immediate.output.loss.item<double>());
      CHECK(deferred.output.clip_fraction.item<double>() == immediate.output.clip_fraction.item<double>());
      CHECK(deferred.output.approx_kl.item<double>() == immediate.output.approx_kl.item<double>());
      check_runs_agree(deferred, immediate, 0.0, 0.0, dtype == torch::kBFloat16 ? 1e-2 : 1e-6);
    }
  }
  if (!registered) return;
  // Bad data: the immediate call raises; the deferred one flags it, and check_deferred_policy_loss raises the same.
  std::mt19937_64 bad_rng(41);
  const auto c = dapo::test::random_loss_case(bad_rng, 8, 12, false, {});
  using dapo::test::tensor;
  auto mask = tensor(c.mask, {c.rows, c.cols});
  mask[5][7] = 2.0;
  const auto logp = tensor(c.logp, {c.rows, c.cols}).to(cuda), old_logp = tensor(c.old_logp, {c.rows, c.cols}).to(cuda);
  const auto advantages = tensor(c.advantages, {c.rows}).to(cuda);
  dapo::PolicyLossOptions options = c.options;
  options.defer_data_checks = true;
  const auto out = dapo::policy_loss(logp, old_logp, advantages, mask.to(cuda), options);
  CHECK(out.data_check.item<double>() != 0.0);
  CHECK_THROWS_WITH_AS(dapo::check_deferred_policy_loss(out.data_check.item<double>(), mask, options),
                       doctest::Contains("mask[5, 7] is 2, expected 0 or 1"), std::invalid_argument);
  options.global_token_count = 3.0;  // fewer than the call's own tokens
  options.defer_data_checks = true;
  const auto fixed_mask = tensor(c.mask, {c.rows, c.cols});
  const auto counted = dapo::policy_loss(logp, old_logp, advantages, fixed_mask.to(cuda), options);
  CHECK_THROWS_WITH_AS(dapo::check_deferred_policy_loss(counted.data_check.item<double>(), fixed_mask, options),
                       doctest::Contains("global_token_count is 3 but this batch alone holds"), std::invalid_argument);
}

TEST_CASE("fused policy_loss: same bits for any thread count; masked padding may hold NaN; grad_output scales") {
  std::mt19937_64 rng(9);
  const auto c = dapo::test::random_loss_case(rng, 64, 1000, true, {.dual_clip = 3.0});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = run_torch(c, torch::kFloat32);
  at::set_num_threads(2);
  const auto two = run_torch(c, torch::kFloat32);
  at::set_num_threads(threads);
  CHECK(one.output.loss.item<float>() == two.output.loss.item<float>());
  CHECK(one.grad == two.grad);

  using dapo::test::tensor;
  auto logp = tensor(c.logp, {c.rows, c.cols}).requires_grad_(true);
  auto mask = tensor(c.mask, {c.rows, c.cols}).to(torch::kBool);
  const auto padded_old_logp = tensor(c.old_logp, {c.rows, c.cols}).masked_fill(~mask, std::nan(""));
  const auto advantages = tensor(c.advantages, {c.rows, c.cols});
  const auto out = dapo::policy_loss(logp, padded_old_logp, advantages, mask, c.options);
  (3.0 * out.loss).backward();
  const auto reference = run_torch(c, torch::kFloat64);
  CHECK(dapo::test::close(out.loss.item<double>(), reference.output.loss.item<double>(), 1e-12));
  const auto grad = dapo::test::values(logp.grad());
  for (std::size_t i = 0; i < grad.size(); ++i)
    CHECK(dapo::test::close(grad[i], 3.0 * reference.grad[i], 1e-12, 1e-15));
}

TEST_CASE("fused policy_loss without requires_grad computes the same loss and no gradient") {
  std::mt19937_64 rng(4);
  const auto c = dapo::test::random_loss_case(rng, 4, 9, false, {});
  using dapo::test::tensor;
  const auto out = dapo::policy_loss(tensor(c.logp, {4, 9}), tensor(c.old_logp, {4, 9}), tensor(c.advantages, {4}),
                                     tensor(c.mask, {4, 9}), c.options);
  CHECK_FALSE(out.loss.requires_grad());
  CHECK(dapo::test::close(out.loss.item<double>(), run_torch(c, torch::kFloat64).output.loss.item<double>(), 1e-14));
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

TEST_CASE("fused and reference policy_loss reject bad tensors with messages naming them") {
  for (const LossFn loss_fn : {kFused, kReference}) {
    CAPTURE(loss_fn == kFused);
    const auto logp = torch::zeros({4, 10});
    const auto advantages = torch::zeros({4});
    const auto mask = torch::ones({4, 10});
    CHECK_THROWS_WITH_AS(loss_fn(logp, logp, advantages, torch::ones({4, 9}), {}),
                         doctest::Contains("policy_loss: mask has shape [4, 9] but logp has [4, 10]"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(loss_fn(logp, torch::zeros({4, 11}), advantages, mask, {}),
                         doctest::Contains("old_logp has shape [4, 11] but logp has [4, 10]"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(loss_fn(logp, logp.to(torch::kFloat64), advantages, mask, {}),
                         doctest::Contains("old_logp has dtype Double but logp has Float"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(loss_fn(logp, logp, torch::zeros({5}), mask, {}),
                         doctest::Contains("advantages has shape [5], expected [4] or [4, 10]"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(loss_fn(torch::zeros({40}), torch::zeros({40}), advantages, mask, {}),
                         doctest::Contains("logp has shape [40], expected 2 dimensions"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(loss_fn(logp, logp, advantages, torch::ones({4, 10}, torch::kLong), {}),
                         doctest::Contains("mask has dtype Long, expected bool or a floating dtype"),
                         std::invalid_argument);
    auto half_mask = mask.clone();
    half_mask[2][7] = 0.5;
    CHECK_THROWS_WITH_AS(loss_fn(logp, logp, advantages, half_mask, {}),
                         doctest::Contains("mask[2, 7] is 0.5, expected 0 or 1"), std::invalid_argument);
    auto empty_group = mask.clone();
    empty_group.slice(0, 2, 4).zero_();
    CHECK_THROWS_WITH_AS(loss_fn(logp, logp, advantages, empty_group,
                                 {.aggregation = dapo::LossAggregation::kGroupTokenMean, .group_size = 2}),
                         doctest::Contains("group 1 (rows 2..3) has no masked token"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(loss_fn(logp, logp, advantages, mask, {.clip_high = -0.1}),
                         doctest::Contains("clip_high is -0.10000000000000001"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(loss_fn(logp, logp, advantages, mask, {.global_token_count = 39}),
                         doctest::Contains("global_token_count is 39 but this batch alone holds 40 masked tokens"),
                         std::invalid_argument);
  }
}
