// KL-penalty estimators on tensors: every kl_penalty case of verl_zoo.json through autograd (value and d sum / d
// logprob) in float64 and float32, agreement with the plain-buffer core, and shape errors that name the arguments.
#include <dapo/core/kl_penalty.hpp>
#include <dapo/kl_penalty.hpp>

#include <string>
#include <vector>

#include "support/kl_case.hpp"
#include "support/shared.hpp"

namespace {

torch::Tensor tensor_of(const std::vector<double>& values, torch::ScalarType dtype) {
  return torch::tensor(values, torch::dtype(torch::kFloat64)).to(dtype);
}

}  // namespace

TEST_CASE("kl_penalty on tensors matches every kl_penalty case of verl_zoo.json through autograd") {
  const auto cases = dapo::test::kl_cases();
  if (!cases) return;
  for (std::size_t c = 0; c < cases->size(); ++c) {
    const dapo::test::KlCase& kc = (*cases)[c];
    CAPTURE(c);
    CAPTURE(kc.name);
    const auto& expected = kc.value;
    const auto& expected_grad = kc.grad_logprob;
    for (const auto dtype : {torch::kFloat64, torch::kFloat32}) {
      CAPTURE(dtype);
      const double tolerance = dtype == torch::kFloat64 ? 1e-10 : 1e-5;
      const double floor = dtype == torch::kFloat64 ? 1e-14 : 1e-5;
      const torch::Tensor logprob = tensor_of(kc.logprob, dtype).requires_grad_(true);
      const torch::Tensor ref = tensor_of(kc.ref_logprob, dtype);
      const torch::Tensor value = dapo::kl_penalty(logprob, ref, kc.name);
      value.sum().backward();
      const torch::Tensor got = value.detach().to(torch::kFloat64).contiguous();
      const torch::Tensor grad = logprob.grad().to(torch::kFloat64).contiguous();
      REQUIRE(got.numel() == static_cast<int64_t>(expected.size()));
      for (int64_t i = 0; i < got.numel(); ++i) {
        CAPTURE(i);
        CHECK(dapo::test::close(got[i].item<double>(), expected[static_cast<std::size_t>(i)], tolerance, floor));
        CHECK(dapo::test::close(grad[i].item<double>(), expected_grad[static_cast<std::size_t>(i)], tolerance, floor));
      }
    }
  }
}

TEST_CASE("kl_penalty keeps the shape, agrees with the core, and refuses mismatched shapes and non-floating input") {
  const torch::Tensor logprob = -torch::rand({3, 5}, torch::kFloat64) * 4.0;
  const torch::Tensor ref = -torch::rand({3, 5}, torch::kFloat64) * 4.0;
  for (const char* name : {"k1", "abs", "k2", "k3", "k1+", "k3+"}) {
    CAPTURE(name);
    const torch::Tensor value = dapo::kl_penalty(logprob, ref, name);
    CHECK(value.sizes() == logprob.sizes());
    const auto lp = std::vector<double>(logprob.data_ptr<double>(), logprob.data_ptr<double>() + 15);
    const auto rp = std::vector<double>(ref.data_ptr<double>(), ref.data_ptr<double>() + 15);
    std::vector<double> core(15);
    dapo::core::kl_penalty<double>(lp, rp, dapo::parse_kl_penalty(name), core);
    const torch::Tensor flat = value.reshape(-1).contiguous();
    for (int64_t i = 0; i < 15; ++i) CHECK(dapo::test::close(flat[i].item<double>(), core[i], 1e-12, 1e-15));
  }
  CHECK_THROWS_WITH_AS(dapo::kl_penalty(logprob, ref.narrow(1, 0, 4), "k3"),
                       doctest::Contains("ref_logprob has shape [3, 4] but logprob has [3, 5]"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::kl_penalty(logprob.to(torch::kLong), ref, "k3"), doctest::Contains("logprob has dtype"),
                       std::invalid_argument);
}
