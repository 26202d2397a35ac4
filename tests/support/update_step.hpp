// One PolicyUpdate::run seen as a gradient: AdamW with betas (0, 0), no weight decay and eps = lr = 1e4 moves each
// weight by -lr g / (|g| + eps) = -g (1 - |g| / 1e4 + ...), so the change of the weights is the update's gradient (to
// 1e-4 of itself, the same function of g for every run), seen through the real update path. For tests that compare
// two ways of computing the same update (micro-batch cuts, the shared-prompt forward).
#pragma once

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <vector>

#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/update.hpp"
#include "support/tiny_model.hpp"

namespace dapo::test {

struct UpdateResult {
  qwen::UpdateMetrics metrics;
  std::vector<torch::Tensor> step;     // each parameter's change, -gradient
  std::vector<double> largest_weight;  // each parameter's largest magnitude before the step
  int64_t updates = 0;                 // optimizer updates the run made
};

// The update of `batch` (copied: the run fills its log-probs) under `options`, on the tiny model of seed 5 (vocabulary
// 48, hidden 32, 4 / 2 heads, 2 layers).
inline UpdateResult run_update_step(const qwen::TrainOptions& options, qwen::TrainBatch batch,
                                    qwen::Qwen2ForCausalLM* reference = nullptr) {
  options.validate();
  torch::manual_seed(5);
  qwen::Qwen2ForCausalLM model(tiny_qwen_config(48, 32, 4, 2, 2));
  qwen::initialize_weights(model, 0.2);
  std::vector<torch::Tensor> before;
  for (const auto& parameter : model->parameters()) before.push_back(parameter.detach().clone());
  qwen::ClippedAdamW optimizer(model->parameters(),
                               torch::optim::AdamWOptions(1e4).betas({0.0, 0.0}).eps(1e4).weight_decay(0.0));
  const auto communicator = qwen::Communicator::create({}, torch::kCPU);
  qwen::PolicyUpdate update{model, optimizer, *communicator, options, reference};
  UpdateResult result;
  result.metrics = update.run(batch, result.updates);
  const auto after = model->parameters();
  for (std::size_t i = 0; i < after.size(); ++i) {
    result.step.push_back(after[i].detach() - before[i]);
    result.largest_weight.push_back(before[i].abs().max().item<double>());
  }
  return result;
}

// The two runs' gradients agree: float32 sums in another order, to 1e-4 of each tensor's largest element, plus the
// rounding of the weights the step was added to (2 ulp).
inline void check_same_step(const UpdateResult& other, const UpdateResult& expected) {
  REQUIRE(other.step.size() == expected.step.size());
  for (std::size_t i = 0; i < expected.step.size(); ++i) {
    CAPTURE(i);
    const double scale = expected.step[i].abs().max().item<double>();
    const double rounding = 2.0 * 1.2e-7 * expected.largest_weight[i];
    CHECK((other.step[i] - expected.step[i]).abs().max().item<double>() <= 1e-4 * scale + rounding);
  }
}

}  // namespace dapo::test
