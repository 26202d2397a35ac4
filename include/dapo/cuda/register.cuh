// Connects the CUDA kernels to the library: the policy loss's to dapo::policy_loss, the lm-head log-prob's to
// dapo::linear_logprobs. Include this from one .cu file of a program that links LibTorch with CUDA. The dapo::cuda
// CMake target does it for you: built with dapo (add_subdirectory), or compiled into your target by find_package(dapo
// COMPONENTS torch cuda). Tensors on CUDA then run fused; without it they run the composite <dapo/reference/loss.hpp>
// and linear_logprobs' ATen ops.
//
// Shapes: as <dapo/loss.hpp>. The kernel's per-unit sums are added in unit order, which keeps results deterministic:
// on the host (B x 56 bytes come back, and bad masks raise the same errors as on CPU), or, with
// PolicyLossOptions::defer_data_checks, on the device by a one-thread kernel (the checks become a flag; nothing waits).
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <vector>

#include "dapo/cuda/logprob.cuh"
#include "dapo/cuda/policy_loss.cuh"
#include "dapo/logprob.hpp"
#include "dapo/loss.hpp"

namespace dapo::cuda {

// Launches the kernel on the inputs' GPU, which need not be the current one (a data-parallel rank on GPU r, whose
// current device is still 0): the per-unit partial sums are allocated there and the kernel runs on that GPU's current
// stream. Returns the partials, [units, kUnitFields] float64 on the device.
inline torch::Tensor launch_policy_loss_partials(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                                 const torch::Tensor& advantages, const torch::Tensor& mask,
                                                 const PolicyLossOptions& options, torch::Tensor& raw_grad,
                                                 const torch::Tensor& weights) {
  constexpr const char* kWhere = "dapo::policy_loss";
  const c10::cuda::CUDAGuard device_guard(logp.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(logp.device().index());
  const int64_t rows = logp.size(0), cols = logp.size(1);
  const int64_t units = policy_loss_units(rows, options);
  torch::Tensor partials = torch::empty({units, kUnitFields}, logp.options().dtype(torch::kFloat64));
  cudaError_t status = cudaSuccess;
  UnitSums* unit_sums = reinterpret_cast<UnitSums*>(partials.data_ptr<double>());
  if (options.mode == PolicyLossMode::kVanilla && !weights.defined() && options.delta == 0.0) {
    // DAPO's own path reads every logp and mask dtype as it is.
    dapo::detail::visit_floating_dtype(logp.scalar_type(), kWhere, [&](auto compute_tag, auto storage_tag) {
      using C = decltype(compute_tag);
      using T = decltype(storage_tag);
      dapo::detail::visit_mask_dtype(mask.scalar_type(), [&](auto mask_tag) {
        using M = decltype(mask_tag);
        const core::PolicyLossInputs<T, C, M> inputs{
            logp.data_ptr<T>(),   old_logp.data_ptr<T>(), advantages.data_ptr<C>(), mask.data_ptr<M>(), rows, cols,
            advantages.dim() == 2};
        status = launch_vanilla_policy_loss<C>(inputs, options, raw_grad.defined() ? raw_grad.data_ptr<C>() : nullptr,
                                               unit_sums, stream);
      });
    });
  } else {
    // The other token-level losses, and vanilla with weights or the two-sided clip, in the compute dtype (as on the
    // CPU).
    const auto compute_type = dapo::detail::compute_dtype(logp.scalar_type());
    const auto as_compute = [&](const torch::Tensor& t) { return t.to(compute_type).contiguous(); };
    const torch::Tensor logp_c = as_compute(logp), old_logp_c = as_compute(old_logp), mask_c = as_compute(mask);
    dapo::detail::visit_floating_dtype(compute_type, kWhere, [&](auto compute_tag, auto) {
      using C = decltype(compute_tag);
      const core::PolicyLossInputs<C, C, C> inputs{logp_c.data_ptr<C>(),
                                                   old_logp_c.data_ptr<C>(),
                                                   advantages.data_ptr<C>(),
                                                   mask_c.data_ptr<C>(),
                                                   rows,
                                                   cols,
                                                   advantages.dim() == 2,
                                                   weights.defined() ? weights.data_ptr<C>() : nullptr};
      status = launch_policy_loss<C>(inputs, options, raw_grad.defined() ? raw_grad.data_ptr<C>() : nullptr, unit_sums,
                                     stream);
    });
  }
  DAPO_REQUIRE(status == cudaSuccess, kWhere, "CUDA kernel launch failed: ", cudaGetErrorString(status));
  return partials;
}

// The immediate call: the partials come back to the host (B x 56 bytes, a wait) and are added there.
inline core::PolicyLossKernelResult policy_loss_kernel_cuda(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                                            const torch::Tensor& advantages, const torch::Tensor& mask,
                                                            const PolicyLossOptions& options, torch::Tensor& raw_grad,
                                                            const torch::Tensor& weights) {
  constexpr const char* kWhere = "dapo::policy_loss";
  const int64_t rows = logp.size(0), cols = logp.size(1), units = policy_loss_units(rows, options);
  const torch::Tensor host = launch_policy_loss_partials(logp, old_logp, advantages, mask, options, raw_grad, weights)
                                 .cpu();  // synchronises with the stream
  core::PolicyLossSums total;
  bool invalid_mask = false;
  const bool grouped = options.aggregation == LossAggregation::kGroupTokenMean;
  const int64_t bad_unit =
      add_unit_sums(reinterpret_cast<const UnitSums*>(host.data_ptr<double>()), units, grouped, total, invalid_mask);
  if (bad_unit >= 0) {
    // Name the exact element or group with the tensor checks the composite path uses.
    dapo::detail::check_policy_loss_data(mask, options, kWhere);
    DAPO_REQUIRE(false, kWhere, invalid_mask ? "a mask value is neither 0 nor 1" : "a group has no masked token",
                 " (unit ", bad_unit, ")");
  }
  return core::finish_policy_loss(total, rows, cols, options, kWhere);
}

// The deferred call (PolicyLossOptions::defer_data_checks): a one-thread kernel adds the partials and finishes on the
// device; returns the kFinishedFields float64 values there. Nothing waits.
inline torch::Tensor policy_loss_deferred_cuda(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                               const torch::Tensor& advantages, const torch::Tensor& mask,
                                               const PolicyLossOptions& options, torch::Tensor& raw_grad,
                                               const torch::Tensor& weights) {
  const torch::Tensor partials =
      launch_policy_loss_partials(logp, old_logp, advantages, mask, options, raw_grad, weights);
  const c10::cuda::CUDAGuard device_guard(logp.device());  // the finishing kernel runs on the same GPU and stream
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(logp.device().index());
  torch::Tensor finished = torch::empty({kFinishedFields}, logp.options().dtype(torch::kFloat64));
  const cudaError_t status =
      launch_finish_policy_loss(reinterpret_cast<const UnitSums*>(partials.data_ptr<double>()), partials.size(0),
                                logp.size(0), logp.size(1), options, finished.data_ptr<double>(), stream);
  DAPO_REQUIRE(status == cudaSuccess, "dapo::policy_loss", "CUDA kernel launch failed: ", cudaGetErrorString(status));
  return finished;
}

// Runs launch(compute_tag, storage_tag, stream) for the logits' dtype on their GPU's current stream; raises if the
// launch failed.
template <class Launch>
void launch_on_logits(const torch::Tensor& logits, const Launch& launch) {
  constexpr const char* kWhere = "dapo::linear_logprobs";
  const c10::cuda::CUDAGuard device_guard(logits.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(logits.device().index());
  cudaError_t status = cudaSuccess;
  dapo::detail::visit_floating_dtype(logits.scalar_type(), kWhere, [&](auto compute_tag, auto storage_tag) {
    status = launch(compute_tag, storage_tag, stream);
  });
  DAPO_REQUIRE(status == cudaSuccess, kWhere, "CUDA kernel launch failed: ", cudaGetErrorString(status));
}

// linear_logprobs' statistics of one chunk of logits (see dapo::detail::LogprobKernels): one read of [R, V].
inline void logprob_statistics_cuda(const torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& lse,
                                    const torch::Tensor& chosen, const torch::Tensor& mean) {
  launch_on_logits(logits, [&](auto compute_tag, auto storage_tag, cudaStream_t stream) {
    using C = decltype(compute_tag);
    using T = decltype(storage_tag);
    return launch_softmax_statistics<C, T>(logits.data_ptr<T>(), logits.size(0), logits.size(1),
                                           targets.data_ptr<int64_t>(), lse.data_ptr<C>(), chosen.data_ptr<C>(),
                                           mean.defined() ? mean.data_ptr<C>() : nullptr, stream);
  });
}

// linear_logprobs' gradient of one chunk of logits, in place: one read and one write of [R, V].
inline void logprob_logits_grad_cuda(const torch::Tensor& logits, const torch::Tensor& targets,
                                     const torch::Tensor& lse, const torch::Tensor& mean,
                                     const torch::Tensor& grad_logp, const torch::Tensor& grad_entropy) {
  launch_on_logits(logits, [&](auto compute_tag, auto storage_tag, cudaStream_t stream) {
    using C = decltype(compute_tag);
    using T = decltype(storage_tag);
    const auto pointer = [](const torch::Tensor& t) { return t.defined() ? t.data_ptr<C>() : nullptr; };
    return launch_logprob_logits_grad<C, T>(logits.data_ptr<T>(), logits.size(0), logits.size(1),
                                            targets.data_ptr<int64_t>(), lse.data_ptr<C>(), pointer(mean),
                                            pointer(grad_logp), pointer(grad_entropy), stream);
  });
}

// Registers the kernels when the program starts.
inline const bool kPolicyLossRegistered = [] {
  dapo::detail::cuda_policy_loss_kernel() = &policy_loss_kernel_cuda;
  dapo::detail::cuda_policy_loss_deferred() = &policy_loss_deferred_cuda;
  return true;
}();

inline const bool kLogprobRegistered = [] {
  dapo::detail::cuda_logprob_kernels() = {&logprob_statistics_cuda, &logprob_logits_grad_cuda};
  return true;
}();

}  // namespace dapo::cuda
