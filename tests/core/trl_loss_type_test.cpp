// TRL's loss_type names: each one's options and loss_scale give, through dapo's loss, the loss TRL's compute_loss
// computes for one call. TRL's formulas are written out here as grpo_trainer.py has them (per-token losses, then each
// name's divisor), on a batch with an empty row, ratios on both sides of every clip and gradient accumulation over two
// processes; and the names TRL has but dapo does not are refused.
#include <dapo/core/loss.hpp>
#include <dapo/core/trl_loss_type.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "support/shared.hpp"

namespace {

constexpr int64_t kTrlRows = 6, kTrlCols = 5;

struct TrlBatch {
  std::vector<double> logp, old_logp, mask, advantages;  // [B, T] x 3, [B]
};

TrlBatch trl_batch() {
  std::mt19937 rng(29);
  std::uniform_real_distribution<double> logp(-3.0, -0.1), log_ratio(-1.0, 2.0), advantage(-1.5, 1.5);
  TrlBatch batch;
  for (int64_t row = 0; row < kTrlRows; ++row) {
    const int64_t length = row == 3 ? 0 : 1 + row % kTrlCols;  // row 3 empty, the others ragged
    for (int64_t col = 0; col < kTrlCols; ++col) {
      const double lp = logp(rng);
      batch.logp.push_back(lp);
      batch.old_logp.push_back(lp - log_ratio(rng));
      batch.mask.push_back(col < length ? 1.0 : 0.0);
    }
    batch.advantages.push_back(advantage(rng));
  }
  return batch;
}

// TRL's compute_loss for one call, as grpo_trainer.py writes it.
double trl_loss(const std::string& type, const TrlBatch& b, const dapo::TrlLossTypeArgs& args) {
  const double eps_high = args.epsilon_high > 0.0 ? args.epsilon_high : args.epsilon;
  std::vector<double> row_sum(kTrlRows, 0.0), row_tokens(kTrlRows, 0.0);
  for (int64_t row = 0; row < kTrlRows; ++row) {
    const double a = b.advantages[static_cast<std::size_t>(row)];
    for (int64_t col = 0; col < kTrlCols; ++col) {
      const auto i = static_cast<std::size_t>(row * kTrlCols + col);
      double coef_1 = std::exp(b.logp[i] - b.old_logp[i]), loss = 0.0;
      if (type == "cispo") {
        loss = -std::min(coef_1, args.epsilon_high) * a * b.logp[i];
      } else if (type == "sapo") {
        const double tau = a > 0 ? args.sapo_temperature_pos : args.sapo_temperature_neg;
        loss = -(1.0 / (1.0 + std::exp(-tau * (coef_1 - 1.0)))) * 4.0 / tau * a;
      } else {
        const double coef_2 = std::clamp(coef_1, 1.0 - args.epsilon, 1.0 + eps_high);
        if (args.delta > 0.0) coef_1 = std::min(coef_1, args.delta);
        loss = -std::min(coef_1 * a, coef_2 * a);
      }
      row_sum[static_cast<std::size_t>(row)] += loss * b.mask[i];
      row_tokens[static_cast<std::size_t>(row)] += b.mask[i];
    }
  }
  double sum = 0.0, tokens = 0.0, row_means = 0.0;
  for (int64_t row = 0; row < kTrlRows; ++row) {
    sum += row_sum[static_cast<std::size_t>(row)];
    tokens += row_tokens[static_cast<std::size_t>(row)];
    row_means += row_sum[static_cast<std::size_t>(row)] / std::max(row_tokens[static_cast<std::size_t>(row)], 1.0);
  }
  const auto accumulation = static_cast<double>(args.gradient_accumulation_steps);
  if (type == "grpo" || type == "sapo") return row_means / kTrlRows / accumulation;
  if (type == "bnpo") return sum / std::max(tokens, 1.0) / accumulation;
  if (type == "dr_grpo") return sum / (kTrlRows * static_cast<double>(args.max_completion_length)) / accumulation;
  // dapo, cispo (TRL 1.16): num_items_in_batch rescaled to one accumulation window of the generation batch
  const double steps_per_generation =
      args.steps_per_generation > 0 ? static_cast<double>(args.steps_per_generation) : accumulation;
  return sum / (std::max(args.num_items_in_batch, 1.0) / static_cast<double>(args.num_processes) * accumulation /
                steps_per_generation);
}

}  // namespace

TEST_CASE("TRL's loss_type names give TRL's loss of a call through dapo's loss, times loss_scale") {
  const TrlBatch batch = trl_batch();
  double call_tokens = 0.0;
  for (const double m : batch.mask) call_tokens += m;
  int checked = 0;
  for (const std::string type : {"grpo", "sapo", "bnpo", "dr_grpo", "dapo", "cispo"}) {
    for (const auto& [delta, steps_per_generation] : {std::pair{0.0, int64_t{0}}, {1.6, 0}, {0.0, 8}}) {
      const bool two_sided = type == "grpo" || type == "bnpo" || type == "dr_grpo" || type == "dapo";
      if (delta > 0.0 && !two_sided) continue;
      CAPTURE(type);
      CAPTURE(delta);
      CAPTURE(steps_per_generation);
      dapo::TrlLossTypeArgs args;
      args.epsilon = 0.2;
      args.epsilon_high = type == "cispo" ? 5.0 : 0.28;
      args.delta = delta;
      args.max_completion_length = 7;
      args.gradient_accumulation_steps = 4;
      args.steps_per_generation = steps_per_generation;  // 8: two accumulation windows per generation batch
      args.num_processes = 2;
      args.num_items_in_batch = 3.0 * call_tokens;
      args.rows = kTrlRows;
      const dapo::TrlLossType trl = dapo::trl_loss_type(type, args);
      std::vector<double> grad(batch.logp.size());
      const double loss = dapo::core::policy_loss<double>(batch.logp, batch.old_logp, batch.advantages, batch.mask,
                                                          kTrlRows, kTrlCols, trl.options, grad)
                              .loss;
      const double expected = trl_loss(type, batch, args);
      CHECK(expected != 0.0);
      CHECK(dapo::test::close(loss * trl.loss_scale, expected, 1e-12, 1e-15));
      ++checked;
    }
  }
  CHECK(checked == 16);
}

TEST_CASE("TRL's loss_type: the names without a dapo loss, cispo without its cap, and delta off vanilla are refused") {
  CHECK_THROWS_WITH_AS(dapo::trl_loss_type("vespo"), doctest::Contains("loss_type 'vespo' is not one of grpo"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dapo::trl_loss_type("cispo"), doctest::Contains("epsilon_high, which is 0"),
                       std::invalid_argument);
  dapo::TrlLossTypeArgs args;
  args.delta = 2.0;
  CHECK_THROWS_WITH_AS(dapo::trl_loss_type("sapo", args), doctest::Contains("has no two-sided clip"),
                       std::invalid_argument);
  args.delta = 0.0;
  args.gradient_accumulation_steps = 0;
  CHECK_THROWS_WITH_AS(dapo::trl_loss_type("grpo", args), doctest::Contains("gradient_accumulation_steps 0"),
                       std::invalid_argument);
}
