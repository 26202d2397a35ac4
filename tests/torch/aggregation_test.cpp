// The tensor front end of the aggregation weights: the core's numbers for a bool or a floating mask, returned in the
// asked dtype; a KL term weighted by them splits over micro-batches as the loss does; bad masks named. The micro-batch
// shares (micro_batch_shares, micro_batch_weights): micro-batches that split groups add up to the mini-batch in one
// call.
#include <dapo/aggregation.hpp>
#include <dapo/kl_penalty.hpp>
#include <dapo/loss.hpp>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <algorithm>
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

namespace {

// The micro-batch's rows of a [B, T] tensor, trimmed to `cols` columns.
torch::Tensor take_rows(const torch::Tensor& tensor, const std::vector<int64_t>& rows, int64_t cols) {
  return tensor.index_select(0, torch::tensor(rows, torch::kInt64)).narrow(1, 0, cols);
}

// The columns up to the last masked token of any of the rows (at least 1): a micro-batch trimmed to its longest row.
int64_t trimmed_cols(const torch::Tensor& mask, const std::vector<int64_t>& rows) {
  int64_t cols = 1;
  for (const int64_t row : rows) {
    const torch::Tensor masked = mask[row].nonzero();
    if (masked.numel() > 0) cols = std::max(cols, masked.max().item<int64_t>() + 1);
  }
  return cols;
}

}  // namespace

TEST_CASE("micro-batch shares: micro-batches that split groups add up to the mini-batch's loss, gradient and terms") {
  // Six rows in two groups of three, cut as a token budget may cut them ({0, 1}, {2, 3, 4}, {5}: the first and last
  // hold part of a group) and as whole groups; each micro-batch trimmed to its longest row. float64 throughout.
  torch::manual_seed(8);
  const int64_t rows = 6, cols = 9;
  torch::Tensor mask = torch::zeros({rows, cols}, torch::kBool);
  const std::vector<int64_t> lengths{9, 4, 7, 2, 6, 5};
  for (int64_t r = 0; r < rows; ++r) mask[r].narrow(0, 0, lengths[static_cast<std::size_t>(r)]).fill_(true);
  const torch::Tensor old_logp = -torch::rand({rows, cols}, torch::kFloat64) * 2;
  const torch::Tensor logp_values = old_logp + 0.3 * torch::randn({rows, cols}, torch::kFloat64);
  const torch::Tensor advantages = torch::randn({rows}, torch::kFloat64);
  const torch::Tensor ref = -torch::rand({rows, cols}, torch::kFloat64) * 2;
  const torch::Tensor term = dapo::kl_penalty(logp_values, ref, "low_var_kl");
  const std::vector<std::vector<std::vector<int64_t>>> cuts{{{0, 1}, {2, 3, 4}, {5}}, {{0, 1, 2}, {3, 4, 5}}};
  for (const auto& [aggregation, name] : dapo::kAggregationNames) {
    for (const auto mode :
         {dapo::PolicyLossMode::kVanilla, dapo::PolicyLossMode::kGspo, dapo::PolicyLossMode::kGeoMean}) {
      CAPTURE(name);
      CAPTURE(dapo::policy_loss_name(mode));
      dapo::PolicyLossOptions options;
      options.aggregation = aggregation;
      options.mode = mode;
      options.group_size = 3;
      const torch::Tensor whole_logp = logp_values.clone().requires_grad_(true);
      const torch::Tensor whole = dapo::policy_loss(whole_logp, old_logp, advantages, mask, options).loss;
      whole.backward();
      dapo::PolicyLossOptions vanilla = options;
      vanilla.mode = dapo::PolicyLossMode::kVanilla;
      const double whole_term = (dapo::aggregation_weights(mask, vanilla, torch::kFloat64) * term).sum().item<double>();
      for (const auto& cut : cuts) {
        bool splits = false;
        for (const auto& micro : cut) splits = splits || !dapo::holds_whole_groups(micro, options.group_size);
        CAPTURE(splits);
        const dapo::MicroBatchShares shares =
            dapo::micro_batch_shares(options, dapo::count_mini_batch(mask), mask, splits, torch::kFloat64);
        CHECK(shares.token_weights.defined() == (splits && aggregation == dapo::LossAggregation::kGroupTokenMean));
        const torch::Tensor logp = logp_values.clone().requires_grad_(true);
        double loss = 0.0, terms = 0.0;
        for (const auto& micro : cut) {
          const int64_t width = trimmed_cols(mask, micro);
          const torch::Tensor micro_mask = take_rows(mask, micro, width);
          const dapo::MicroBatchWeights weights =
              dapo::micro_batch_weights(shares, micro, micro_mask, /*with_terms=*/true, torch::kFloat64);
          const torch::Tensor out = dapo::policy_loss(take_rows(logp, micro, width), take_rows(old_logp, micro, width),
                                                      advantages.index_select(0, torch::tensor(micro, torch::kInt64)),
                                                      micro_mask, shares.loss, weights.loss)
                                        .loss;
          out.backward();
          loss += out.item<double>();
          terms += (weights.terms * take_rows(term, micro, width)).sum().item<double>();
        }
        CHECK(loss == doctest::Approx(whole.item<double>()).epsilon(1e-12));
        CHECK(terms == doctest::Approx(whole_term).epsilon(1e-12));
        CHECK(torch::allclose(logp.grad(), whole_logp.grad(), 1e-10, 1e-12));
      }
    }
  }
}

TEST_CASE("micro-batch shares: whole groups, and the inputs a split needs, named when wrong") {
  const std::vector<int64_t> aligned{3, 4, 5}, misaligned{2, 3, 4}, partial{0, 1};
  CHECK(dapo::holds_whole_groups(aligned, 3));
  CHECK_FALSE(dapo::holds_whole_groups(misaligned, 3));
  CHECK_FALSE(dapo::holds_whole_groups(partial, 3));
  CHECK(dapo::holds_whole_groups(std::vector<int64_t>{}, 3));
  CHECK_THROWS_WITH_AS(dapo::holds_whole_groups(aligned, 0), doctest::Contains("group_size is 0"),
                       std::invalid_argument);
  dapo::PolicyLossOptions options;
  options.aggregation = dapo::LossAggregation::kGroupTokenMean;
  options.group_size = 3;
  const torch::Tensor mask = torch::ones({6, 4}, torch::kBool);
  const dapo::MiniBatchCounts counts = dapo::count_mini_batch(mask);
  CHECK_THROWS_WITH_AS(dapo::micro_batch_shares(options, counts, torch::Tensor(), true),
                       doctest::Contains("mini_mask has shape (undefined)"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::micro_batch_shares(options, counts, mask.narrow(0, 0, 3), true),
                       doctest::Contains("expected [6, T]"), std::invalid_argument);
  const dapo::MicroBatchShares shares = dapo::micro_batch_shares(options, counts, mask, true);
  CHECK(shares.loss.aggregation == dapo::LossAggregation::kTokenSum);
  CHECK(shares.terms.aggregation == dapo::LossAggregation::kGroupTokenMean);
  const std::vector<int64_t> two{0, 1}, outside{5, 6};
  CHECK_THROWS_WITH_AS(dapo::micro_batch_weights(shares, two, torch::ones({3, 4}, torch::kBool), true),
                       doctest::Contains("mask has 3 rows but 2 row indices"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::micro_batch_weights(shares, outside, torch::ones({2, 4}, torch::kBool), true),
                       doctest::Contains("row index 6 is outside"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::micro_batch_weights(shares, two, torch::ones({2, 5}, torch::kBool), true),
                       doctest::Contains("mask has 5 columns"), std::invalid_argument);
  const dapo::MicroBatchWeights weights =
      dapo::micro_batch_weights(shares, two, torch::ones({2, 3}, torch::kBool), false);
  CHECK(weights.loss.sizes() == torch::IntArrayRef({2, 3}));
  CHECK_FALSE(weights.terms.defined());
}
