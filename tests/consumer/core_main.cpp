// Uses only the framework-free core: a GSM8K reward, group advantages, the token-mean loss on plain vectors, and the
// same loss accumulated over two micro-batches.
#include <dapo/core/accumulation.hpp>
#include <dapo/core/advantage.hpp>
#include <dapo/core/loss.hpp>
#include <dapo/rewards/gsm8k.hpp>

#include <cmath>
#include <cstdio>
#include <span>
#include <vector>

int main() {
  const double reward = dapo::gsm8k::score("<think>\n24+48\n</think>\n<answer>\n72\n</answer>\n", "72").total();
  const std::vector<double> rewards{reward, 0.0};
  std::vector<double> advantages(2);
  dapo::core::group_advantages<double>(rewards, 2, advantages);
  const std::vector<double> logp{-1.0, -2.0}, mask{1.0, 1.0};
  const auto result = dapo::core::policy_loss<double>(logp, logp, advantages, mask, 2, 1);

  // Each row as its own micro-batch: with micro_batch_options the two shares add up to the one-shot loss.
  const dapo::PolicyLossOptions options =
      dapo::micro_batch_options({}, dapo::core::count_mini_batch<double>(mask, 2, 1));
  double accumulated = 0.0;
  for (std::size_t row = 0; row < 2; ++row) {
    const auto one = [&](const std::vector<double>& values) { return std::span(values).subspan(row, 1); };
    accumulated +=
        dapo::core::policy_loss<double>(one(logp), one(logp), one(advantages), one(mask), 1, 1, options).loss;
  }
  std::printf("core consumer: reward %.3f, advantages %.4f %.4f, loss %.6f, accumulated %.6f\n", reward, advantages[0],
              advantages[1], result.loss, accumulated);
  // Opposite advantages of equal size and ratio 1: the token-mean loss is exactly 0.
  return reward == 3.5 && std::abs(result.loss) < 1e-12 && std::abs(accumulated) < 1e-12 && advantages[0] > 0.7 ? 0 : 1;
}
