// linear_logprobs against the naive log_softmax(hidden @ weight.T / temperature).gather(...): values, entropy and the
// gradients for hidden and weight, in double and float, over chunk sizes that do and do not divide N.
#include <dapo/logprob.hpp>

#include <torch/torch.h>

#include "support/shared.hpp"
#include "support/tensors.hpp"

namespace {

struct Result {
  torch::Tensor logp, entropy, grad_hidden, grad_weight;
};

// kKernels: dapo::linear_logprobs as called (the device's kernels); kAtenOps: the ATen ops devices without them run.
enum class Path { kNaive, kKernels, kAtenOps };

// The same scalar objective for every path: sum(logp * a) + sum(entropy * b), so every output gets a gradient.
Result run(Path path, const torch::Tensor& hidden0, const torch::Tensor& weight0, const torch::Tensor& targets,
           const dapo::LinearLogprobOptions& options, const torch::Tensor& a, const torch::Tensor& b) {
  auto hidden = hidden0.detach().clone().requires_grad_(true);
  auto weight = weight0.detach().clone().requires_grad_(true);
  Result r;
  if (path != Path::kNaive) {
    const auto out = path == Path::kKernels
                         ? dapo::linear_logprobs(hidden, weight, targets, options)
                         : dapo::detail::linear_logprobs_unchecked(hidden, weight, targets, options, /*use_aten=*/true);
    r.logp = out.logp;
    r.entropy = out.entropy;
  } else {
    const auto logits = torch::matmul(hidden, weight.t()).to(torch::kFloat64) / options.temperature;
    const auto log_probs = torch::log_softmax(logits, -1);
    r.logp = log_probs.gather(1, targets.unsqueeze(1)).squeeze(1);
    if (options.with_entropy) r.entropy = -(log_probs.exp() * log_probs).sum(-1);
  }
  auto objective = (r.logp.to(torch::kFloat64) * a).sum();
  if (options.with_entropy) objective = objective + (r.entropy.to(torch::kFloat64) * b).sum();
  objective.backward();
  r.grad_hidden = hidden.grad();
  r.grad_weight = weight.grad();
  return r;
}

double relative_error(const torch::Tensor& actual, const torch::Tensor& expected) {
  const auto difference = (actual.to(torch::kFloat64) - expected.to(torch::kFloat64)).norm().item<double>();
  return difference / std::max(expected.to(torch::kFloat64).norm().item<double>(), 1e-300);
}

}  // namespace

TEST_CASE("linear_logprobs equals the naive path in value and gradients (double 1e-9, float 1e-5)") {
  torch::manual_seed(3);
  const int64_t n = 37, h = 24, v = 301;
  for (const auto dtype : {torch::kFloat64, torch::kFloat32}) {
    const double tolerance = dtype == torch::kFloat64 ? 1e-9 : 1e-5;
    const auto hidden = torch::randn({n, h}, torch::kFloat64).to(dtype);
    const auto weight = (torch::randn({v, h}, torch::kFloat64) * 0.5).to(dtype);
    const auto targets = torch::randint(v, {n}, torch::kLong);
    const auto a = torch::randn({n}, torch::kFloat64), b = torch::randn({n}, torch::kFloat64);
    for (const bool with_entropy : {false, true}) {
      for (const double temperature : {1.0, 0.7}) {
        for (const int64_t chunk_size : {1, 8, 37, 1024}) {
          CAPTURE(dapo::test::dtype_name(hidden));
          CAPTURE(with_entropy);
          CAPTURE(temperature);
          CAPTURE(chunk_size);
          const dapo::LinearLogprobOptions options{chunk_size, temperature, with_entropy};
          const auto naive = run(Path::kNaive, hidden, weight, targets, options, a, b);
          for (const Path path : {Path::kKernels, Path::kAtenOps}) {
            CAPTURE(path == Path::kKernels);
            const auto chunked = run(path, hidden, weight, targets, options, a, b);
            CHECK(dapo::test::dtype_name(chunked.logp) == dapo::test::dtype_name(hidden));
            CHECK(relative_error(chunked.logp, naive.logp) < tolerance);
            CHECK(relative_error(chunked.grad_hidden, naive.grad_hidden) < tolerance);
            CHECK(relative_error(chunked.grad_weight, naive.grad_weight) < tolerance);
            if (with_entropy) {
              CHECK(relative_error(chunked.entropy, naive.entropy) < tolerance);
            } else {
              CHECK_FALSE(chunked.entropy.defined());
            }
          }
        }
      }
    }
  }
}

TEST_CASE("linear_logprobs: a frozen weight gets no gradient; an unused entropy costs no gradient term") {
  torch::manual_seed(5);
  auto hidden = torch::randn({9, 8}, torch::kFloat64).requires_grad_(true);
  const auto weight = torch::randn({40, 8}, torch::kFloat64);
  const auto targets = torch::randint(40, {9}, torch::kLong);
  const auto out = dapo::linear_logprobs(hidden, weight, targets, {.chunk_size = 4, .with_entropy = true});
  out.logp.sum().backward();
  auto reference_hidden = hidden.detach().clone().requires_grad_(true);
  torch::log_softmax(torch::matmul(reference_hidden, weight.t()), -1).gather(1, targets.unsqueeze(1)).sum().backward();
  CHECK(relative_error(hidden.grad(), reference_hidden.grad()) < 1e-12);
}

TEST_CASE("linear_logprobs in bfloat16 computes its statistics in float32, close to double") {
  torch::manual_seed(7);
  const auto hidden = torch::randn({16, 32});
  const auto weight = torch::randn({200, 32}) * 0.2;
  const auto targets = torch::randint(200, {16}, torch::kLong);
  const auto exact = torch::log_softmax(torch::matmul(hidden.to(torch::kFloat64), weight.to(torch::kFloat64).t()), -1)
                         .gather(1, targets.unsqueeze(1))
                         .squeeze(1);
  const dapo::LinearLogprobOptions options{.chunk_size = 5, .with_entropy = true};
  const auto bf16_hidden = hidden.to(torch::kBFloat16), bf16_weight = weight.to(torch::kBFloat16);
  const auto kernel = dapo::linear_logprobs(bf16_hidden, bf16_weight, targets, options);
  const auto aten = dapo::detail::linear_logprobs_unchecked(bf16_hidden, bf16_weight, targets, options, true);
  CHECK(dapo::test::dtype_name(kernel.logp) == "Float");
  CHECK(relative_error(kernel.logp, exact) < 2e-2);
  CHECK(relative_error(kernel.logp, aten.logp) < 1e-5);
  CHECK(relative_error(kernel.entropy, aten.entropy) < 1e-5);
}

TEST_CASE(
    "linear_logprobs in bfloat16: the kernel's and the ATen ops' gradients agree, with and without the entropy's") {
  torch::manual_seed(11);
  const int64_t n = 19, h = 32, v = 257;
  const auto hidden = torch::randn({n, h}, torch::kFloat64);
  const auto weight = torch::randn({v, h}, torch::kFloat64) * 0.3;
  const auto targets = torch::randint(v, {n}, torch::kLong);
  const auto a = torch::randn({n}, torch::kFloat64), b = torch::randn({n}, torch::kFloat64);
  const auto bf16 = [](const torch::Tensor& t) { return t.to(torch::kBFloat16); };
  for (const bool entropy_gradient : {false, true}) {
    CAPTURE(entropy_gradient);
    // The entropy is computed either way; only its gradient is switched (b or zero), so both ATen branches run.
    const dapo::LinearLogprobOptions options{.chunk_size = 8, .temperature = 0.8, .with_entropy = true};
    const auto weights_b = entropy_gradient ? b : torch::zeros_like(b);
    const auto exact = run(Path::kNaive, hidden, weight, targets, options, a, weights_b);
    const auto kernel = run(Path::kKernels, bf16(hidden), bf16(weight), targets, options, a, weights_b);
    const auto aten = run(Path::kAtenOps, bf16(hidden), bf16(weight), targets, options, a, weights_b);
    CHECK(dapo::test::dtype_name(aten.grad_hidden) == "BFloat16");
    // bfloat16 products and gradients: both within bfloat16's rounding of the double path, and of each other.
    for (const auto* r : {&kernel, &aten}) {
      CHECK(relative_error(r->grad_hidden, exact.grad_hidden) < 3e-2);
      CHECK(relative_error(r->grad_weight, exact.grad_weight) < 3e-2);
    }
    CHECK(relative_error(aten.grad_hidden, kernel.grad_hidden) < 2e-2);
    CHECK(relative_error(aten.grad_weight, kernel.grad_weight) < 2e-2);
    CHECK(relative_error(aten.logp, kernel.logp) < 1e-5);
    CHECK(relative_error(aten.entropy, kernel.entropy) < 1e-5);
  }
}

TEST_CASE("CUDA: linear_logprobs on CUDA equals the CPU kernel (float32, bfloat16, entropy, temperature, gradients)") {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: the CUDA linear_logprobs checks are skipped");
    return;
  }
  MESSAGE("linear_logprobs on CUDA runs "
          << (dapo::detail::cuda_logprob_kernels().statistics != nullptr ? "the kernels of dapo::cuda"
                                                                         : "ATen ops (no dapo::cuda registered)"));
  torch::manual_seed(13);
  const torch::Device cuda(torch::kCUDA, 0);
  // A vocabulary that is not a multiple of the block's threads, rows that are not a multiple of the chunk.
  const int64_t n = 45, h = 64, v = 1531;
  const auto hidden = torch::randn({n, h}, torch::kFloat64);
  const auto weight = torch::randn({v, h}, torch::kFloat64) * 0.4;
  const auto targets = torch::randint(v, {n}, torch::kLong);
  const auto a = torch::randn({n}, torch::kFloat64), b = torch::randn({n}, torch::kFloat64);
  const auto on = [&](const torch::Tensor& t) { return t.to(cuda); };
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const bool with_entropy : {false, true}) {
      CAPTURE(c10::toString(dtype));
      CAPTURE(with_entropy);
      const dapo::LinearLogprobOptions options{.chunk_size = 16, .temperature = 0.7, .with_entropy = with_entropy};
      const auto cpu = run(Path::kKernels, hidden.to(dtype), weight.to(dtype), targets, options, a, b);
      const auto gpu =
          run(Path::kKernels, on(hidden.to(dtype)), on(weight.to(dtype)), on(targets), options, on(a), on(b));
      const auto gpu_aten =
          run(Path::kAtenOps, on(hidden.to(dtype)), on(weight.to(dtype)), on(targets), options, on(a), on(b));
      const double values = dtype == torch::kFloat32 ? 1e-5 : 1e-2, grads = dtype == torch::kFloat32 ? 1e-5 : 2e-2;
      for (const auto* r : {&gpu, &gpu_aten}) {
        CHECK(r->logp.is_cuda());
        CHECK(relative_error(r->logp.cpu(), cpu.logp) < values);
        if (with_entropy) CHECK(relative_error(r->entropy.cpu(), cpu.entropy) < values);
        CHECK(relative_error(r->grad_hidden.cpu(), cpu.grad_hidden) < grads);
        CHECK(relative_error(r->grad_weight.cpu(), cpu.grad_weight) < grads);
      }
    }
  }
}

TEST_CASE("linear_logprobs with check_targets = false: the same values; the shape and dtype checks still made") {
  torch::manual_seed(9);
  const auto hidden = torch::randn({12, 8});
  const auto weight = torch::randn({30, 8});
  const auto targets = torch::randint(30, {12}, torch::kLong);
  const auto checked = dapo::linear_logprobs(hidden, weight, targets, {.chunk_size = 5, .with_entropy = true});
  const auto trusted =
      dapo::linear_logprobs(hidden, weight, targets, {.chunk_size = 5, .with_entropy = true, .check_targets = false});
  CHECK(torch::equal(checked.logp, trusted.logp));
  CHECK(torch::equal(checked.entropy, trusted.entropy));
  CHECK_THROWS_WITH_AS(dapo::linear_logprobs(hidden, weight, torch::zeros({12}, torch::kInt), {.check_targets = false}),
                       doctest::Contains("targets has dtype Int, expected int64"), std::invalid_argument);
}

TEST_CASE("linear_logprobs rejects bad arguments naming them") {
  const auto hidden = torch::zeros({4, 8});
  const auto weight = torch::zeros({10, 8});
  const auto targets = torch::zeros({4}, torch::kLong);
  CHECK_THROWS_WITH_AS(dapo::linear_logprobs(hidden, torch::zeros({10, 7}), targets),
                       doctest::Contains("weight has shape [10, 7] but hidden has [4, 8]"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::linear_logprobs(hidden, weight, torch::zeros({4}, torch::kInt)),
                       doctest::Contains("targets has dtype Int, expected int64"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::linear_logprobs(hidden, weight, torch::zeros({5}, torch::kLong)),
                       doctest::Contains("targets has shape [5], expected [4]"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::linear_logprobs(hidden, weight, torch::tensor({0, 3, 10, 1}, torch::kLong)),
                       doctest::Contains("targets[2] is 10, expected a token id in [0, 10)"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::linear_logprobs(hidden, weight, targets, {.chunk_size = 0}),
                       doctest::Contains("chunk_size is 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::linear_logprobs(hidden, weight, targets, {.temperature = 0.0}),
                       doctest::Contains("temperature is 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::linear_logprobs(hidden, weight.to(torch::kFloat64), targets),
                       doctest::Contains("weight has dtype Double but hidden has Float"), std::invalid_argument);
}
