// Token-budget micro-batches (use_dynamic_bsz): how rows are packed, the refused budget, and that the mini-batch's loss
// and gradient equal those of whole-group micro-batches for every aggregation and the sequence-level losses.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <dapo/loss.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/batch.hpp"
#include "qwen_gsm8k/train/update.hpp"
#include "support/tiny_model.hpp"
#include "support/update_step.hpp"

namespace {

// Eight rows of 13 to 22 tokens, groups of two responses: longest first packs rows of different groups together.
qwen::TrainBatch budget_batch() {
  std::vector<qwen::BatchRow> rows;
  for (int64_t r = 0; r < 8; ++r) {
    std::vector<int64_t> tokens;
    for (int64_t t = 0; t < 13 + (r * 5) % 10; ++t) tokens.push_back((r * 13 + t * 7) % 47 + 1);
    rows.push_back({tokens, 4 + r % 3, true});
  }
  return qwen::TrainBatch{
      qwen::pad_rows(rows, 0), torch::tensor({1.0f, -1.0f, 0.5f, -0.25f, 2.0f, -2.0f, 1.5f, -1.0f}), {}, 4, 2};
}

std::vector<int64_t> lengths_of(const qwen::TrainBatch& batch) {
  const torch::Tensor sums = batch.padded.attention_mask.sum(1).to(torch::kInt64).contiguous();
  return {sums.data_ptr<int64_t>(), sums.data_ptr<int64_t>() + sums.numel()};
}

using dapo::test::check_same_step;
using dapo::test::UpdateResult;

// One mini-batch, one epoch: the update's gradient (support/update_step.hpp).
UpdateResult run_once(const qwen::TrainOptions& options, qwen::Qwen2ForCausalLM* reference = nullptr) {
  UpdateResult result = dapo::test::run_update_step(options, budget_batch(), reference);
  REQUIRE(result.updates == 1);
  return result;
}

qwen::TrainOptions base_options() {
  qwen::TrainOptions options;
  options.train_batch_size = 4;
  options.rollout_n = 2;
  options.ppo_mini_batch_size = 4;  // one mini-batch of the four groups
  options.ppo_micro_batch_size = 1;
  options.grad_clip = 1e9;  // no clipping: the raw gradients are compared
  options.loss.group_size = 2;
  return options;
}

}  // namespace

TEST_CASE("token budget: rows longest first, each micro-batch within the budget, every row once") {
  const qwen::TrainBatch batch = budget_batch();
  const std::vector<int64_t> lengths = lengths_of(batch);
  for (const int64_t budget : {22, 40, 45, 64, 100, 1000}) {
    CAPTURE(budget);
    const auto plan = qwen::plan_mini_batches(
        batch, {.mini_groups = 4, .micro_groups = 1, .max_tokens = budget, .logprob_max_tokens = 2 * budget}, 0, 4);
    REQUIRE(plan.size() == 1);
    for (const auto* cut : {&plan[0].micro_batches, &plan[0].logprob_micro_batches}) {
      const int64_t limit = cut == &plan[0].micro_batches ? budget : 2 * budget;
      std::vector<int64_t> seen;
      int64_t previous_longest = 1 << 30;
      for (const auto& micro : *cut) {
        REQUIRE(!micro.rows.empty());
        CHECK(std::is_sorted(micro.rows.begin(), micro.rows.end()));
        int64_t longest = 0;
        for (const int64_t row : micro.rows) longest = std::max(longest, lengths[static_cast<std::size_t>(row)]);
        CHECK(micro.length == longest);
        CHECK(micro.padded_tokens() <= limit);
        CHECK(longest <= previous_longest);  // longest first
        previous_longest = longest;
        seen.insert(seen.end(), micro.rows.begin(), micro.rows.end());
      }
      std::sort(seen.begin(), seen.end());
      CHECK(seen == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
    }
  }
  // A large budget takes all rows in one micro-batch; one row's length takes one row each.
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  CHECK(qwen::plan_mini_batches(batch, {.mini_groups = 4, .max_tokens = 8 * longest}, 0, 4)[0].micro_batches.size() ==
        1);
  CHECK(qwen::plan_mini_batches(batch, {.mini_groups = 4, .max_tokens = longest}, 0, 4)[0].micro_batches.size() == 8);
  // A rank's share: only its groups' rows.
  const auto share = qwen::plan_mini_batches(batch, {.mini_groups = 4, .max_tokens = 40}, 2, 4);
  int64_t share_rows = 0;
  for (const auto& micro : share[0].micro_batches) {
    for (const int64_t row : micro.rows) CHECK((row >= 4 && row < 8));
    share_rows += static_cast<int64_t>(micro.rows.size());
  }
  CHECK(share_rows == 4);
}

TEST_CASE("token budget: a budget below a row's length is refused, naming the row and its length") {
  const qwen::TrainBatch batch = budget_batch();
  const std::vector<int64_t> lengths = lengths_of(batch);
  const auto longest = std::max_element(lengths.begin(), lengths.end());
  const int64_t row = longest - lengths.begin();
  const std::string expected = "ppo_max_token_len_per_gpu is " + std::to_string(*longest - 1) + " tokens, but row " +
                               std::to_string(row) + " holds " + std::to_string(*longest) +
                               " (prompt + response): a micro-batch holds at least one whole row, so raise the budget "
                               "to at least " +
                               std::to_string(*longest);
  CHECK_THROWS_WITH_AS(qwen::plan_mini_batches(batch, {.mini_groups = 4, .max_tokens = *longest - 1}, 0, 4),
                       expected.c_str(), std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      qwen::plan_mini_batches(batch, {.mini_groups = 4, .max_tokens = 100, .logprob_max_tokens = *longest - 1}, 0, 4),
      doctest::Contains("log_prob_max_token_len_per_gpu is"), std::invalid_argument);
  // Through the update too, before any forward.
  qwen::TrainOptions options = base_options();
  options.use_dynamic_bsz = true;
  options.ppo_max_token_len_per_gpu = 8;
  CHECK_THROWS_WITH_AS(run_once(options), doctest::Contains("raise the budget to at least"), std::invalid_argument);
}

TEST_CASE("token budget: the mini-batch's loss and gradient equal whole-group micro-batches' for every aggregation") {
  // Budget 45 cuts the eight rows into micro-batches of two or three rows of different groups (checked below), the
  // no-grad passes' 70 into others.
  const qwen::TrainBatch batch = budget_batch();
  const auto plan =
      qwen::plan_mini_batches(batch, {.mini_groups = 4, .max_tokens = 45, .logprob_max_tokens = 70}, 0, 4);
  bool split_group = false;
  for (const auto& micro : plan[0].micro_batches) {
    for (const int64_t row : micro.rows) {
      split_group |= std::find(micro.rows.begin(), micro.rows.end(), row ^ 1) == micro.rows.end();
    }
  }
  REQUIRE(split_group);
  REQUIRE(plan[0].micro_batches.size() > 2);

  for (const auto& [aggregation, name] : dapo::kAggregationNames) {
    for (const auto mode :
         {dapo::PolicyLossMode::kVanilla, dapo::PolicyLossMode::kGspo, dapo::PolicyLossMode::kGeoMean}) {
      CAPTURE(name);
      CAPTURE(dapo::policy_loss_name(mode));
      qwen::TrainOptions options = base_options();
      options.loss.aggregation = aggregation;
      options.loss.mode = mode;
      // The entropy term rides on the same aggregation weights as the loss.
      options.extras.entropy_coeff = 0.01;
      const UpdateResult whole = run_once(options);
      options.use_dynamic_bsz = true;
      options.ppo_max_token_len_per_gpu = 45;
      options.log_prob_max_token_len_per_gpu = 70;
      const UpdateResult budget = run_once(options);
      // float32 sums in another order: the loss to 1e-5 of its size, the gradients to 1e-4 of the largest element.
      CHECK(budget.metrics.loss == doctest::Approx(whole.metrics.loss).epsilon(1e-5));
      CHECK(budget.metrics.grad_norm == doctest::Approx(whole.metrics.grad_norm).epsilon(1e-4));
      CHECK(budget.metrics.entropy == doctest::Approx(whole.metrics.entropy).epsilon(1e-5));
      CHECK(whole.metrics.grad_norm > 0.0);
      check_same_step(budget, whole);
    }
  }
}

TEST_CASE("token budget: a KL loss's term is aggregated over the whole mini-batch, as with whole groups") {
  torch::manual_seed(9);
  qwen::Qwen2ForCausalLM reference(dapo::test::tiny_qwen_config(48, 32, 4, 2, 2));
  qwen::initialize_weights(reference, 0.2);
  for (const auto aggregation : {dapo::LossAggregation::kGroupTokenMean, dapo::LossAggregation::kSeqMeanTokenMean}) {
    CAPTURE(dapo::aggregation_name(aggregation));
    qwen::TrainOptions options = base_options();
    options.loss.aggregation = aggregation;
    options.extras.kl_loss_coef = 0.5;
    const UpdateResult whole = run_once(options, &reference);
    options.use_dynamic_bsz = true;
    options.ppo_max_token_len_per_gpu = 45;
    const UpdateResult budget = run_once(options, &reference);
    REQUIRE(whole.metrics.kl_loss.has_value());
    REQUIRE(budget.metrics.kl_loss.has_value());
    CHECK(*whole.metrics.kl_loss > 0.0);
    CHECK(*budget.metrics.kl_loss == doctest::Approx(*whole.metrics.kl_loss).epsilon(1e-5));
    CHECK(budget.metrics.loss == doctest::Approx(whole.metrics.loss).epsilon(1e-5));
    check_same_step(budget, whole);
  }
}
