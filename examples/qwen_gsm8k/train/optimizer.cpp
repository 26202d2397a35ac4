// The optimizer update: see optimizer.hpp.
#include "qwen_gsm8k/train/optimizer.hpp"

#include <torch/version.h>

#include <cmath>
#include <dapo/core/error.hpp>
#include <memory>
#include <string>
#include <tuple>

#include "qwen_gsm8k/model/host_door.hpp"

// ATen's fused AdamW has had a CPU kernel since LibTorch 2.4 (a CUDA one since 2.0).
#define QWEN_FUSED_ADAMW (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4))

namespace qwen {
namespace {

// The total 2-norm of the gradients as clip_grad_norm_ computes it: each gradient's norm, then the norm of those.
torch::Tensor total_norm(const std::vector<torch::Tensor>& gradients) {
#if QWEN_FUSED_ADAMW
  const std::vector<torch::Tensor> norms = at::_foreach_norm(gradients, 2);
#else
  std::vector<torch::Tensor> norms;
  for (const auto& gradient : gradients) norms.push_back(gradient.norm(2));
#endif
  return norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2);
}

// Scales the gradients by max_norm / (norm + 1e-6) where that is below 1, as clip_grad_norm_ does.
void clip(const std::vector<torch::Tensor>& gradients, const torch::Tensor& norm, double max_norm) {
  const torch::Tensor coefficient = torch::clamp(max_norm / (norm + 1e-6), c10::nullopt, 1.0);
#if QWEN_FUSED_ADAMW
  at::_foreach_mul_(gradients, coefficient);
#else
  for (const auto& gradient : gradients) gradient.mul_(coefficient);
#endif
}

// [norm, values...] float64 on the values' device.
torch::Tensor with_values(const torch::Tensor& norm, const torch::Tensor& values) {
  return torch::cat({norm.to(values.options()).reshape(1), values.reshape(-1)});
}

}  // namespace

ClippedAdamW::ClippedAdamW(const std::vector<torch::Tensor>& parameters, const torch::optim::AdamWOptions& options)
    : torch::optim::AdamW(parameters, options) {
  DAPO_REQUIRE(!options.amsgrad(), "qwen::ClippedAdamW", "AMSGrad is not supported (the trainer never asks for it)");
}

ClippedAdamW::StateKey ClippedAdamW::key_of(const torch::Tensor& parameter) {
#if TORCH_VERSION_MAJOR < 2
  return c10::guts::to_string(parameter.unsafeGetTensorImpl());
#else
  return parameter.unsafeGetTensorImpl();
#endif
}

bool ClippedAdamW::fused() {
  return QWEN_FUSED_ADAMW;
}

torch::Tensor ClippedAdamW::clip_and_step(double max_norm) {
  return clip_step(max_norm, torch::Tensor()).norm;
}

torch::Tensor ClippedAdamW::step_and_read(double max_norm, const torch::Tensor& values) {
  const Stepped stepped = clip_step(max_norm, values);
  const torch::Tensor read = stepped.read.defined() ? stepped.read : host_door::read(with_values(stepped.norm, values));
  applied(std::isfinite(read.data_ptr<double>()[0]));
  return read;
}

ClippedAdamW::Stepped ClippedAdamW::clip_step(double max_norm, const torch::Tensor& values) {
  DAPO_REQUIRE(stepped_.empty(), "qwen::ClippedAdamW::clip_and_step",
               "the last step was not settled: call applied() once its norm is read");
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> parameters, gradients;
  for (const auto& group : param_groups()) {
    for (const auto& parameter : group.params()) {
      if (!parameter.grad().defined()) continue;
      parameters.push_back(parameter);
      gradients.push_back(parameter.grad());
    }
  }
  if (parameters.empty()) return {torch::zeros({}, torch::kFloat32), {}};
  const torch::Tensor norm = total_norm(gradients);
  clip(gradients, norm, max_norm);
  if (fused()) {
    fused_step(parameters, gradients, norm);
    return {norm, {}};
  }
  const torch::Tensor read = host_door::read(values.defined() ? with_values(norm, values) : norm);
  if (std::isfinite(read.to(torch::kFloat64).data_ptr<double>()[0])) torch::optim::AdamW::step();
  return {norm, values.defined() ? read : torch::Tensor()};
}

void ClippedAdamW::fused_step(const std::vector<torch::Tensor>& parameters, const std::vector<torch::Tensor>& gradients,
                              const torch::Tensor& norm) {
#if QWEN_FUSED_ADAMW
  DAPO_REQUIRE(param_groups().size() == 1, "qwen::ClippedAdamW", "one parameter group expected (the trainer's), got ",
               param_groups().size());
  // 1 where the norm is not finite: the kernel then leaves weights and moments, and the counts do not advance.
  const torch::Tensor skip = torch::logical_not(torch::isfinite(norm)).to(torch::kFloat32);
  const torch::Tensor advance = 1.0 - skip;
  std::vector<torch::Tensor> exp_avgs, exp_avg_sqs, steps;
  for (const auto& parameter : parameters) {
    const StateKey key = key_of(parameter);
    auto found = state_.find(key);
    if (found == state_.end()) {  // as torch::optim::AdamW makes it at a parameter's first step
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->step(0);
      state->exp_avg(torch::zeros_like(parameter, torch::MemoryFormat::Preserve));
      state->exp_avg_sq(torch::zeros_like(parameter, torch::MemoryFormat::Preserve));
      found = state_.emplace(key, std::move(state)).first;
      created_.push_back(key);
    }
    const auto& state = static_cast<const torch::optim::AdamWParamState&>(*found->second);
    torch::Tensor& step = device_steps_[key];
    if (!step.defined()) {
      step = torch::full({}, static_cast<double>(state.step()), parameter.options().dtype(torch::kFloat32));
    }
    exp_avgs.push_back(state.exp_avg());
    exp_avg_sqs.push_back(state.exp_avg_sq());
    steps.push_back(step);
    stepped_.push_back(key);
  }
  at::_foreach_add_(steps, advance);
  const auto& options = static_cast<const torch::optim::AdamWOptions&>(param_groups().front().options());
  at::_fused_adamw_(parameters, gradients, exp_avgs, exp_avg_sqs, {}, steps, options.lr(), std::get<0>(options.betas()),
                    std::get<1>(options.betas()), options.weight_decay(), options.eps(),
                    /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt, /*found_inf=*/skip);
#else
  (void)parameters, (void)gradients, (void)norm;
#endif
}

void ClippedAdamW::applied(bool finite) {
  if (finite) {
    for (const StateKey& key : stepped_) {
      auto& state = static_cast<torch::optim::AdamWParamState&>(*state_.find(key)->second);
      state.step(state.step() + 1);
    }
  } else {  // a skipped first step leaves no state, as torch::optim::AdamW's would
    for (const StateKey& key : created_) {
      state_.erase(key);
      device_steps_.erase(key);
    }
  }
  stepped_.clear();
  created_.clear();
}

void ClippedAdamW::load(torch::serialize::InputArchive& archive) {
  device_steps_.clear();
  stepped_.clear();
  created_.clear();
  torch::optim::AdamW::load(archive);
}

}  // namespace qwen
