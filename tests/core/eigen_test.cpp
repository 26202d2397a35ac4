// The Eigen adapters give the core's numbers and refuse storage the core cannot read.
#include <dapo/eigen.hpp>

#include <random>

#include "support/loss_case.hpp"

TEST_CASE("eigen::policy_loss equals core::policy_loss on a random batch") {
  std::mt19937_64 rng(3);
  const auto c = dapo::test::random_loss_case(rng, 4, 6, false, {.dual_clip = 3.0});
  using Array = dapo::eigen::RowMajorArray<double>;
  const Array logp = Eigen::Map<const Array>(c.logp.data(), 4, 6);
  const Array old_logp = Eigen::Map<const Array>(c.old_logp.data(), 4, 6);
  const Array mask = Eigen::Map<const Array>(c.mask.data(), 4, 6);
  const dapo::eigen::Vector<double> advantages = Eigen::Map<const dapo::eigen::Vector<double>>(c.advantages.data(), 4);
  Array grad;
  const auto from_eigen = dapo::eigen::policy_loss(logp, old_logp, advantages, mask, c.options, &grad);
  std::vector<double> core_grad(24);
  const auto from_core =
      dapo::core::policy_loss<double>(c.logp, c.old_logp, c.advantages, c.mask, 4, 6, c.options, core_grad);
  CHECK(from_eigen.loss == from_core.loss);
  CHECK(from_eigen.clip_fraction == from_core.clip_fraction);
  for (int i = 0; i < 24; ++i) CHECK(grad.data()[i] == core_grad[i]);
}

TEST_CASE("eigen::group_advantages centres each group; non-contiguous input is refused") {
  Eigen::ArrayXd rewards(4);
  rewards << 1.0, 0.0, 2.0, 2.0;
  const auto advantages = dapo::eigen::group_advantages(rewards, 2, {false, 0.0});
  CHECK(advantages(0) == 0.5);
  CHECK(advantages(2) == 0.0);
  const Eigen::ArrayXXd column_major = Eigen::ArrayXXd::Ones(2, 3);
  const Eigen::VectorXd strided_source = Eigen::VectorXd::Ones(8);
  const auto every_other = Eigen::Map<const Eigen::VectorXd, 0, Eigen::InnerStride<2>>(strided_source.data(), 4);
  CHECK_THROWS_WITH_AS(dapo::eigen::group_advantages(every_other, 2), doctest::Contains("not a contiguous"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::eigen::group_advantages(column_major, 2), doctest::Contains("rewards is not a contiguous"),
                       std::invalid_argument);
}
