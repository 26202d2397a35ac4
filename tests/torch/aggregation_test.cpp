// The tensor front end of the aggregation weights: the core's numbers for a bool or a floating mask, returned in the
// asked dtype; a KL term weighted by them splits over micro-batches as the loss does; bad masks named.
#include <dapo/aggregation.hpp>
#include <dapo/kl_penalty.hpp>
#include <dapo/loss.hpp>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <vector>

TEST_CASE("aggregation_weights on tensors: the core's weights, any mask dtype, and exact micro-batch shares") {
  torch::manual_seed(5);
  const torch::Tensor mask = torch::rand({6, 9}, torch::kFloat64) < 0.7;
  const torch::Tensor logp = -torch::rand({6, 9}, torch::kFloat64) * 3, ref = -torch::rand({6, 9}, torch::kFloat64) * 3;
  const torch::Tensor kl = dapo::kl_penalty(logp, ref, "low_var_kl");
  for (const auto aggregation :
       {dapo::LossAggregation::kTokenMean, dapo::LossAggregation::kGroupTokenMean,
        dapo::LossAggregation::kSeqMeanTokenMean, dapo::LossAggregation::kSeqMeanTokenSumNorm}) {
    CAPTURE(dapo::aggregation_name(aggregation));
    dapo::PolicyLossOptions options;
    options.aggregation = aggregation;
    options.group_size = 3;
    const torch::Tensor weights = dapo::aggregation_weights(mask, options, torch::kFloat64);
    CHECK((weights.scalar_type() == torch::kFloat64));
    std::vector<double> core(static_cast<std::size_t>(mask.numel()));
    const torch::Tensor m = mask.to(torch::kFloat64).contiguous();
    dapo::core::aggregation_weights<double, double>(std::span<const double>(m.data_ptr<double>(), m.numel()), 6, 9,
                                                    options, core);
    CHECK(torch::equal(weights, torch::tensor(core, torch::kFloat64).view({6, 9})));
    CHECK(torch::equal(dapo::aggregation_weights(m, options, torch::kFloat64), weights));
    CHECK((dapo::aggregation_weights(mask, options).scalar_type() == torch::kFloat32));
    // Two micro-batches of one group each, with the mini-batch's counts: the KL term's shares add up.
    const dapo::PolicyLossOptions share = dapo::micro_batch_options(options, dapo::count_mini_batch(mask));
    double shares = 0.0;
    for (const int64_t first : {0, 3}) {
      shares += (dapo::aggregation_weights(mask.narrow(0, first, 3), share, torch::kFloat64) * kl.narrow(0, first, 3))
                    .sum()
                    .item<double>();
    }
    CHECK(shares == doctest::Approx((weights * kl).sum().item<double>()).epsilon(1e-12));
  }
}

TEST_CASE("aggregation_weights on tensors: a mask that is not [B, T], or not bool or floating, is named") {
  CHECK_THROWS_WITH_AS(dapo::aggregation_weights(torch::ones({4}, torch::kBool), {}), doctest::Contains("mask"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::aggregation_weights(torch::ones({2, 4}, torch::kInt64), {}),
                       doctest::Contains("mask has dtype"), std::invalid_argument);
}
