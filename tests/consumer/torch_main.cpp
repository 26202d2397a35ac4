// Uses the LibTorch front end: one policy-loss step with autograd, then the same batch as two micro-batches whose
// losses add up to it (from <dapo/loss.hpp> alone); and chunked lm-head log-probs with their backward against
// LibTorch's own log_softmax (<dapo/logprob.hpp>). Both headers make autograd nodes of their own.
#include <dapo/logprob.hpp>
#include <dapo/loss.hpp>

#include <cmath>
#include <cstdio>

int main() {
  const auto old_logp = torch::full({2, 3}, -1.0);
  const auto logp = old_logp.clone().requires_grad_(true);
  const auto advantages = torch::tensor({1.0f, -1.0f});
  const auto mask = torch::tensor({1, 1, 1, 1, 0, 0}, torch::kBool).reshape({2, 3});
  const auto out = dapo::policy_loss(logp, old_logp, advantages, mask);
  out.loss.backward();
  const double loss = out.loss.item<double>();

  const dapo::PolicyLossOptions options = dapo::micro_batch_options({}, dapo::count_mini_batch(mask));
  double accumulated = 0.0;
  for (int64_t row = 0; row < 2; ++row) {
    accumulated += dapo::policy_loss(logp.narrow(0, row, 1), old_logp.narrow(0, row, 1), advantages.narrow(0, row, 1),
                                     mask.narrow(0, row, 1), options)
                       .loss.item<double>();
  }
  std::printf("torch consumer: loss %.6f, accumulated %.6f, d loss / d logp[0][0] %.6f\n", loss, accumulated,
              logp.grad()[0][0].item<double>());
  const double expected = -(3.0 - 1.0) / 4.0;

  torch::manual_seed(0);
  const auto hidden = torch::randn({5, 4}, torch::kFloat64).requires_grad_(true);
  const auto weight = torch::randn({7, 4}, torch::kFloat64);
  const auto targets = torch::tensor({0, 6, 3, 3, 1}, torch::kInt64);
  dapo::LinearLogprobOptions logprob_options;
  logprob_options.chunk_size = 2;
  dapo::linear_logprobs(hidden, weight, targets, logprob_options).logp.sum().backward();
  const auto ours = hidden.grad().clone();
  hidden.grad().zero_();
  torch::matmul(hidden, weight.t()).log_softmax(-1).gather(1, targets.unsqueeze(1)).sum().backward();
  const double gradient_error = (ours - hidden.grad()).abs().max().item<double>();
  std::printf("torch consumer: linear_logprobs' gradient within %.3g of log_softmax's\n", gradient_error);
  return std::abs(loss - expected) < 1e-6 && std::abs(accumulated - expected) < 1e-6 && gradient_error < 1e-12 ? 0 : 1;
}
