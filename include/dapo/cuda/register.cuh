// Connects the CUDA policy-loss kernel to dapo::policy_loss: include this from one .cu file of a program that links
// LibTorch with CUDA. The dapo::cuda CMake target does it for you: built with dapo (add_subdirectory), or compiled into
// your target by find_package(dapo COMPONENTS torch cuda). Tensors on CUDA then run fused; without it they run the
// composite <dapo/reference/loss.hpp>.
//
// Shapes: as <dapo/loss.hpp>. The kernel's per-unit sums come back to the host (B x 56 bytes) and are added there in
// unit order, which keeps results deterministic and lets bad masks raise the same errors as on CPU.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <vector>

#include "dapo/cuda/policy_loss.cuh"
#include "dapo/loss.hpp"

namespace dapo::cuda {

inline core::PolicyLossKernelResult policy_loss_kernel_cuda(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                                            const torch::Tensor& advantages, const torch::Tensor& mask,
                                                            const PolicyLossOptions& options, torch::Tensor& raw_grad,
                                                            const torch::Tensor& weights) {
  constexpr const char* kWhere = "dapo::policy_loss";
  // The inputs' GPU, which need not be the current one (a data-parallel rank on GPU r, whose current device is still
  // 0): the partials are allocated there and the kernel launches on that GPU's current stream.
  const c10::cuda::CUDAGuard device_guard(logp.device());
  const int64_t rows = logp.size(0), cols = logp.size(1);
  const int64_t units = policy_loss_units(rows, options);
  torch::Tensor partials = torch::empty({units, kUnitFields}, logp.options().dtype(torch::kFloat64));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(logp.device().index());
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
  const torch::Tensor host = partials.cpu();  // synchronises with the stream
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

// Registers the kernel when the program starts.
inline const bool kPolicyLossRegistered = [] {
  dapo::detail::cuda_policy_loss_kernel() = &policy_loss_kernel_cuda;
  return true;
}();

}  // namespace dapo::cuda
