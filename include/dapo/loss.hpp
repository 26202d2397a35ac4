// The DAPO policy-gradient loss on LibTorch tensors: decoupled clip (Clip-Higher, Eq. 10), optional dual clip, and the
// token-level aggregation of Eq. 8/12 or one of the others for comparison. Differentiable in logp.
//
// It runs fused: one pass over the inputs computes the loss, the metrics and d loss / d logp (kept for the backward,
// which is one more pass), instead of ~10 elementwise ops each way. On CPU the pass is dapo::core::policy_loss_kernel
// (SIMD, multi-threaded); on CUDA it is <dapo/cuda/policy_loss.cuh> when registered (the dapo::cuda target, built when
// LibTorch has CUDA). Anything else runs the composite <dapo/reference/loss.hpp>.
//
// A mini-batch split into micro-batches (and over ranks) adds up to the one-shot loss when every micro-batch runs
// with dapo::micro_batch_options(options, dapo::count_mini_batch(mini_batch_mask)) (<dapo/core/accumulation.hpp>).
//
// Shapes: B = responses in the batch, T = response tokens (right-padded).
//   logp, old_logp, mask [B, T]; advantages [B] (one per response) or [B, T]. Outputs are 0-dim.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/types.h>

#include "dapo/core/accumulation.hpp"
#include "dapo/core/kernel_abi.hpp"
#include "dapo/detail/aten_kernels.hpp"
#include "dapo/detail/autograd_node.hpp"
#include "dapo/detail/loss_tensors.hpp"
#include "dapo/reference/loss.hpp"

namespace dapo {
namespace detail {

// The fused kernel for CUDA tensors, set by <dapo/cuda/register.cuh> (the dapo::cuda target), null otherwise.
// Same contract as the CPU kernel: contiguous inputs, advantages in the compute dtype, raw_grad undefined or [B, T] in
// the compute dtype.
// Computes the token-level losses (is_token_level); weights undefined or [B, T] in the compute dtype.
using PolicyLossKernelFn = core::PolicyLossKernelResult (*)(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                                            const torch::Tensor& advantages, const torch::Tensor& mask,
                                                            const PolicyLossOptions& options, torch::Tensor& raw_grad,
                                                            const torch::Tensor& weights);
inline PolicyLossKernelFn& cuda_policy_loss_kernel() {
  static PolicyLossKernelFn kernel = nullptr;
  return kernel;
}

// The same kernel finishing on the device (PolicyLossOptions::defer_data_checks), also set by <dapo/cuda/register.cuh>:
// returns [loss, clip_fraction, dual_clip_fraction, approx_kl, grad_scale, data_check], float64 on the device.
using PolicyLossDeferredFn = torch::Tensor (*)(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                               const torch::Tensor& advantages, const torch::Tensor& mask,
                                               const PolicyLossOptions& options, torch::Tensor& raw_grad,
                                               const torch::Tensor& weights);
inline PolicyLossDeferredFn& cuda_policy_loss_deferred() {
  static PolicyLossDeferredFn kernel = nullptr;
  return kernel;
}

template <class Fn>
void visit_mask_dtype(torch::ScalarType dtype, const Fn& fn) {
  switch (dtype) {
    case torch::kBool:
      return fn(bool{});
    case torch::kFloat32:
      return fn(float{});
    case torch::kFloat64:
      return fn(double{});
    case torch::kBFloat16:
      return fn(c10::BFloat16{});
    case torch::kHalf:
      return fn(c10::Half{});
    default:
      DAPO_REQUIRE(false, "dapo::policy_loss", "unsupported mask dtype ", dtype);
  }
}

// clip_cov's draw as verl makes it, torch.randperm(candidates)[:count] on the CPU, from `generator` (undefined: the
// default CPU generator, as verl's call without one).
inline ClipCovChoice clip_cov_torch_choice(const at::Generator& generator) {
  return [generator](int64_t candidates, int64_t count) {
    // The default generator named rather than an empty optional: the same stream, and no false
    // -Wmaybe-uninitialized from g++ 12 on the optional's destructor with LibTorch 2.15's headers.
    const at::Generator source = generator.defined() ? generator : at::detail::getDefaultCPUGenerator();
    const torch::Tensor order = torch::randperm(candidates, source, torch::TensorOptions().dtype(torch::kLong));
    const auto* first = order.data_ptr<int64_t>();
    return std::vector<int64_t>(first, first + count);
  };
}

// Everything below whose body runs the CPU kernel: see <dapo/core/kernel_abi.hpp>.
inline namespace DAPO_KERNEL_ABI {

// Defined below, or, under DAPO_SEPARATE_COMPILATION, in one translation unit of the program (kernel_abi.hpp).
DAPO_SEPARATE_INLINE core::PolicyLossKernelResult cpu_policy_loss_kernel(
    const torch::Tensor& logp, const torch::Tensor& old_logp, const torch::Tensor& advantages,
    const torch::Tensor& mask, const PolicyLossOptions& options, torch::Tensor& raw_grad,
    const torch::Tensor& weights = {}, const at::Generator& generator = {});

// The backward of the fused loss: d loss / d logp = raw_grad * grad_scale, times the incoming gradient. An autograd
// Node of its own, not a torch::autograd::Function: g++ 14 at -O3 reports a false -Warray-bounds inside LibTorch 2.x's
// Function<T>::apply (its std::vector<bool>::reserve), which would stop a consumer building with -Werror, and no
// pragma in this header reaches a warning located in the standard library's headers.
struct PolicyLossBackward : torch::autograd::Node {
  torch::Tensor raw_grad;  // [B, T] in the compute dtype
  double grad_scale = 0.0;
  torch::Tensor device_grad_scale;  // float64 scalar on the device, in place of grad_scale when the call was deferred
  torch::ScalarType logp_dtype = torch::kFloat32;

  std::string name() const override { return "dapo::PolicyLossBackward"; }
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grad_outputs) override {
    torch::Tensor grad_logp;
    if (raw_grad.defined() && grad_outputs[0].defined()) {
      const torch::Tensor factor =
          device_grad_scale.defined()
              ? (grad_outputs[0].to(torch::kFloat64) * device_grad_scale).to(raw_grad.scalar_type())
              : grad_outputs[0].to(raw_grad.scalar_type()) * grad_scale;
      grad_logp = raw_grad.mul(factor);
      if (grad_logp.scalar_type() != logp_dtype) grad_logp = grad_logp.to(logp_dtype);
    }
    return {grad_logp};
  }
  void release_variables() override {
    raw_grad.reset();
    device_grad_scale.reset();
  }
};

// The outputs of a deferred call from the device's finished values (cuda_policy_loss_deferred): fresh tensors in the
// compute dtype (the loss gets the autograd node), and the data check.
inline PolicyLossOutput deferred_policy_loss_output(const torch::Tensor& finished, const torch::Tensor& logp,
                                                    torch::Tensor raw_grad, torch::ScalarType compute_type) {
  const auto fresh = [&](const torch::Tensor& values) {
    return values.to(compute_type, /*non_blocking=*/false, /*copy=*/true);
  };
  const torch::Tensor metrics = fresh(finished.narrow(0, 1, 3));  // clip_fraction, dual_clip_fraction, approx_kl
  PolicyLossOutput out{fresh(finished.select(0, 0)), metrics[0], metrics[1], metrics[2], finished[5]};
  if (raw_grad.defined()) {
    const auto node = detail::make_autograd_node<PolicyLossBackward>();
    node->set_next_edges(torch::autograd::collect_next_edges(logp));
    node->raw_grad = std::move(raw_grad);
    node->device_grad_scale = finished[4];
    node->logp_dtype = logp.scalar_type();
    torch::autograd::set_history(out.loss, node);
  }
  return out;
}

// The fused kernel (CPU, or CUDA when registered); the loss gets PolicyLossBackward when logp requires grad, the
// metrics are never differentiable.
inline PolicyLossOutput fused_policy_loss(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                          const torch::Tensor& advantages, const torch::Tensor& mask,
                                          const PolicyLossOptions& options, const torch::Tensor& weights = {},
                                          const at::Generator& generator = {}) {
  const auto compute_type = compute_dtype(logp.scalar_type());
  const bool want_grad = torch::autograd::compute_requires_grad(logp);
  const bool deferred = logp.is_cuda() && options.defer_data_checks && cuda_policy_loss_deferred() != nullptr;
  torch::Tensor raw_grad, finished;
  core::PolicyLossKernelResult out;
  {
    const torch::NoGradGuard no_grad;  // the copies below are inputs of the kernel, not part of the graph
    const torch::Tensor logp_c = logp.contiguous(), old_logp_c = old_logp.contiguous(), mask_c = mask.contiguous();
    const torch::Tensor advantages_c = advantages.to(compute_type).contiguous();
    const torch::Tensor weights_c = weights.defined() ? weights.to(compute_type).contiguous() : weights;
    if (want_grad) raw_grad = torch::empty(logp.sizes(), logp.options().dtype(compute_type));
    if (deferred) {
      finished = cuda_policy_loss_deferred()(logp_c, old_logp_c, advantages_c, mask_c, options, raw_grad, weights_c);
    } else if (logp.is_cuda()) {
      out = cuda_policy_loss_kernel()(logp_c, old_logp_c, advantages_c, mask_c, options, raw_grad, weights_c);
    } else {
      out = cpu_policy_loss_kernel(logp_c, old_logp_c, advantages_c, mask_c, options, raw_grad, weights_c, generator);
    }
  }
  if (deferred) return deferred_policy_loss_output(finished, logp, std::move(raw_grad), compute_type);
  const auto scalar = [&](double value) { return torch::scalar_tensor(value, logp.options().dtype(compute_type)); };
  torch::Tensor loss = scalar(out.result.loss);
  if (want_grad) {
    const auto node = detail::make_autograd_node<PolicyLossBackward>();
    node->set_next_edges(torch::autograd::collect_next_edges(logp));
    node->raw_grad = std::move(raw_grad);
    node->grad_scale = out.grad_scale;
    node->logp_dtype = logp.scalar_type();
    torch::autograd::set_history(loss, node);
  }
  return {loss, scalar(out.result.clip_fraction), scalar(out.result.dual_clip_fraction), scalar(out.result.approx_kl)};
}

#if DAPO_DEFINE_TORCH_KERNELS
DAPO_SEPARATE_INLINE core::PolicyLossKernelResult cpu_policy_loss_kernel(
    const torch::Tensor& logp, const torch::Tensor& old_logp, const torch::Tensor& advantages,
    const torch::Tensor& mask, const PolicyLossOptions& options, torch::Tensor& raw_grad, const torch::Tensor& weights,
    const at::Generator& generator) {
  core::PolicyLossKernelResult out;
  if (options.mode == PolicyLossMode::kVanilla && !weights.defined() && options.delta == 0.0) {
    // DAPO's own path reads every logp and mask dtype as it is.
    visit_floating_dtype(logp.scalar_type(), "dapo::policy_loss", [&](auto compute_tag, auto logp_tag) {
      using C = decltype(compute_tag);
      using T = decltype(logp_tag);
      visit_mask_dtype(mask.scalar_type(), [&](auto mask_tag) {
        using M = decltype(mask_tag);
        const core::PolicyLossInputs<T, C, M> inputs{
            logp.data_ptr<T>(), old_logp.data_ptr<T>(), advantages.data_ptr<C>(), mask.data_ptr<M>(),
            logp.size(0),       logp.size(1),           advantages.dim() == 2};
        out =
            core::vanilla_policy_loss_kernel<C>(inputs, options, raw_grad.defined() ? raw_grad.data_ptr<C>() : nullptr,
                                                "dapo::policy_loss", AtenParallelFor{});
      });
    });
    return out;
  }
  // The other losses, and vanilla with weights or the two-sided clip, read everything in the compute dtype (one
  // conversion pass where the inputs differ), which keeps their kernels to two instantiations (float and double).
  const auto compute_type = compute_dtype(logp.scalar_type());
  const auto as_compute = [&](const torch::Tensor& t) { return t.to(compute_type).contiguous(); };
  const torch::Tensor logp_c = as_compute(logp), old_logp_c = as_compute(old_logp), mask_c = as_compute(mask);
  visit_floating_dtype(compute_type, "dapo::policy_loss", [&](auto compute_tag, auto) {
    using C = decltype(compute_tag);
    const core::PolicyLossInputs<C, C, C> inputs{logp_c.data_ptr<C>(),
                                                 old_logp_c.data_ptr<C>(),
                                                 advantages.data_ptr<C>(),
                                                 mask_c.data_ptr<C>(),
                                                 logp.size(0),
                                                 logp.size(1),
                                                 advantages.dim() == 2,
                                                 weights.defined() ? weights.data_ptr<C>() : nullptr};
    out = core::any_policy_loss_kernel<C>(inputs, options, raw_grad.defined() ? raw_grad.data_ptr<C>() : nullptr,
                                          "dapo::policy_loss", AtenParallelFor{}, clip_cov_torch_choice(generator));
  });
  return out;
}
#endif  // DAPO_DEFINE_TORCH_KERNELS

}  // namespace DAPO_KERNEL_ABI
}  // namespace detail

inline namespace DAPO_KERNEL_ABI {  // see <dapo/core/kernel_abi.hpp>

// DAPO Eq. 8 objective, negated as a loss to minimise. Validates every argument first; see the file comment for shapes.
// With no masked token the loss and metrics are 0 (group-token-mean instead requires a token in every group).
// bfloat16 and float16 inputs are computed in float32; the loss and metrics are float32 then.
// weights: [B, T] per-token weights of the loss (verl's rollout_is_weights: each token's loss is multiplied by its
// weight; the metrics are not), or undefined. Every loss of PolicyLossOptions::mode, by verl's names; clip_cov draws
// its tokens as verl does, torch::randperm on the CPU from `generator` (undefined: the default CPU generator).
// On CUDA the fused kernel computes the token-level losses; geo_mean, kl_cov and clip_cov run the composite there.
inline PolicyLossOutput policy_loss(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                    const torch::Tensor& advantages, const torch::Tensor& mask,
                                    const PolicyLossOptions& options, const torch::Tensor& weights,
                                    const at::Generator& generator = {}) {
  constexpr const char* kWhere = "dapo::policy_loss";
  detail::check_policy_loss_inputs(logp, old_logp, advantages, mask, options, kWhere, weights);
  const bool cuda_fused =
      logp.is_cuda() && detail::cuda_policy_loss_kernel() != nullptr && is_token_level(options.mode);
  const bool fused = logp.device().is_cpu() || cuda_fused;
  if (!fused) {
    detail::check_policy_loss_data(mask, options, kWhere);
    return detail::composite_policy_loss(logp, old_logp, advantages, mask, options, weights, generator);
  }
  return detail::fused_policy_loss(logp, old_logp.detach(), advantages.detach(), mask, options,
                                   weights.defined() ? weights.detach() : weights, generator);
}

// After a policy_loss call with PolicyLossOptions::defer_data_checks: raises the error the immediate call would have
// raised when the call's data_check, read on the host (`data_check`), is not 0. `mask` is the call's mask, checked
// again to name the bad value, group or count (a host mask: nothing waits). Pass 0 for a call that checked at once.
inline void check_deferred_policy_loss(double data_check, const torch::Tensor& mask, const PolicyLossOptions& options) {
  constexpr const char* kWhere = "dapo::policy_loss";
  if (data_check == 0.0) return;
  detail::check_policy_loss_data(mask, options, kWhere);
  DAPO_REQUIRE(false, kWhere,
               "the device found the data invalid (a mask value other than 0 and 1, a group without a masked token, or "
               "more masked tokens or rows than the global counts), but the mask given to check_deferred_policy_loss "
               "passes: pass the call's own mask and options");
}

// Without per-token weights.
inline PolicyLossOutput policy_loss(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                    const torch::Tensor& advantages, const torch::Tensor& mask,
                                    const PolicyLossOptions& options = {}) {
  return policy_loss(logp, old_logp, advantages, mask, options, torch::Tensor());
}

}  // namespace DAPO_KERNEL_ABI

// The counts of a mini-batch's mask [B, T] (bool or floating, 0 and 1) for micro_batch_options; with data parallel,
// of this rank's share, then summed over ranks (MiniBatchCounts::operator+=). Counted on the CPU (a CUDA mask is
// copied: B * T bytes, and the count has to reach the host anyway).
inline MiniBatchCounts count_mini_batch(const torch::Tensor& mask) {
  constexpr const char* kWhere = "dapo::count_mini_batch";
  detail::check_defined(mask, "mask", kWhere);
  detail::check_dim(mask, 2, "mask", kWhere);
  DAPO_REQUIRE(mask.scalar_type() == torch::kBool || mask.is_floating_point(), kWhere, "mask has dtype ",
               mask.scalar_type(), ", expected bool or a floating dtype holding 0 and 1");
  torch::Tensor host = mask.to(torch::kCPU);
  if (host.scalar_type() == torch::kBFloat16 || host.scalar_type() == torch::kHalf) host = host.to(torch::kFloat32);
  host = host.contiguous();
  MiniBatchCounts counts;
  detail::visit_mask_dtype(host.scalar_type(), [&](auto mask_tag) {
    using M = decltype(mask_tag);
    counts = detail::count_mask(host.data_ptr<M>(), host.size(0), host.size(1), kWhere);
  });
  return counts;
}

}  // namespace dapo
