// The optimizer update: the gradients clipped to a total 2-norm, then one AdamW step, computed as
// torch::nn::utils::clip_grad_norm_ and torch::optim::AdamW compute them, with AdamW's own state (so checkpoints and
// resume are unchanged).
// - LibTorch 2.4 and later (CUDA and CPU): ATen's multi-tensor kernels, queued with no host read. The gradients' norms
//   in one _foreach_norm, their scaling in one _foreach_mul_, AdamW in one _fused_adamw_ for every parameter. That
//   kernel skips itself when the norm is not finite (verl's actor skips such an update), so the host learns of a skip
//   only when it reads the norm with the step's metrics, and tells the optimizer then (applied()).
// - LibTorch 1.13: the same clipping, parameter by parameter; the norm read on the host (through the counted door),
//   and torch::optim::AdamW's step, parameter by parameter, when it is finite.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace qwen {

class ClippedAdamW : public torch::optim::AdamW {
 public:
  ClippedAdamW(const std::vector<torch::Tensor>& parameters, const torch::optim::AdamWOptions& options);

  // Whether this LibTorch steps through ATen's fused kernel (2.4 and later) or parameter by parameter (1.13).
  static bool fused();

  // Clips the gradients of the parameters that have one to total 2-norm `max_norm` and takes one AdamW step at the
  // options' learning rate, unless that norm is not finite: then the weights, the moments and the step counts stay
  // as they were. Returns the norm before clipping (a float32 scalar on the parameters' device; 0 with no gradient).
  torch::Tensor clip_and_step(double max_norm);
  // Once the norm has been read: whether the step applied (a finite norm). The step counts a checkpoint saves are
  // settled here; call it before the next clip_and_step.
  void applied(bool finite);
  // clip_and_step and applied() around the step's one read: the norm (float64) and `values` (float64 [n] on the
  // parameters' device, e.g. the step's metrics) come back together, as a host tensor [1 + n], the norm first. On
  // LibTorch 1.13 the read comes before AdamW's step (the host decides whether to take it), on 2.4 and later after the
  // fused step is queued: one read either way.
  torch::Tensor step_and_read(double max_norm, const torch::Tensor& values);

  void load(torch::serialize::InputArchive& archive) override;

 private:
  // clip_and_step; on 1.13, where the norm is read before the step, `values` (when defined) ride in that read.
  struct Stepped {
    torch::Tensor norm;
    torch::Tensor read;  // [1 + n] on the host when the step read the norm and values; undefined otherwise
  };
  Stepped clip_step(double max_norm, const torch::Tensor& values);
  void fused_step(const std::vector<torch::Tensor>& parameters, const std::vector<torch::Tensor>& gradients,
                  const torch::Tensor& norm);

  // The optimizer state's key of a parameter: its TensorImpl (LibTorch 2.x), or that address as text (1.13).
  using StateKey = decltype(state_)::key_type;
  static StateKey key_of(const torch::Tensor& parameter);

  // Per parameter: its step count on its device, float32, as the fused kernel reads it; made from the state's count
  // when missing, and dropped when a checkpoint is loaded.
  std::unordered_map<StateKey, torch::Tensor> device_steps_;
  std::vector<StateKey> stepped_, created_;  // by the last fused step: its parameters, and those whose state it made
};

}  // namespace qwen
