// Uses only the framework-free core: a GSM8K reward, group advantages and the token-mean loss on plain vectors.
#include <dapo/core/advantage.hpp>
#include <dapo/core/loss.hpp>
#include <dapo/rewards/gsm8k.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  const double reward = dapo::gsm8k::score("<think>\n24+48\n</think>\n<answer>\n72\n</answer>\n", "72").total();
  const std::vector<double> rewards{reward, 0.0};
  std::vector<double> advantages(2);
  dapo::core::group_advantages<double>(rewards, 2, advantages);
  const std::vector<double> logp{-1.0, -2.0}, mask{1.0, 1.0};
  const auto result = dapo::core::policy_loss<double>(logp, logp, advantages, mask, 2, 1);
  std::printf("core consumer: reward %.3f, advantages %.4f %.4f, loss %.6f\n", reward, advantages[0], advantages[1],
              result.loss);
  // Opposite advantages of equal size and ratio 1: the token-mean loss is exactly 0.
  return reward == 3.5 && std::abs(result.loss) < 1e-12 && advantages[0] > 0.7 ? 0 : 1;
}
