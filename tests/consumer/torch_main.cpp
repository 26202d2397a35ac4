// Uses the LibTorch front end: one policy-loss step with autograd.
#include <dapo/loss.hpp>

#include <cstdio>

int main() {
  const auto old_logp = torch::full({2, 3}, -1.0);
  const auto logp = old_logp.clone().requires_grad_(true);
  const auto advantages = torch::tensor({1.0f, -1.0f});
  const auto mask = torch::tensor({1, 1, 1, 1, 0, 0}, torch::kBool).reshape({2, 3});
  const auto out = dapo::policy_loss(logp, old_logp, advantages, mask);
  out.loss.backward();
  const double loss = out.loss.item<double>();
  std::printf("torch consumer: loss %.6f, d loss / d logp[0][0] %.6f\n", loss, logp.grad()[0][0].item<double>());
  return std::abs(loss - (-(3.0 - 1.0) / 4.0)) < 1e-6 ? 0 : 1;
}
