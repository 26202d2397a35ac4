// What the LibTorch front ends need to run dapo's core kernels: ATen's thread pool as a ParallelFor, and a dispatch
// from a tensor's dtype to the C++ element type and the compute type of the kernels.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/types.h>

#include "dapo/core/error.hpp"

namespace dapo::detail {

// Hands a core kernel's blocks (or rows) to ATen's thread pool.
struct AtenParallelFor {
  template <class Body>
  void operator()(int64_t count, const Body& body) const {
    at::parallel_for(0, count, 1, body);
  }
};

// Calls fn(compute_tag, storage_tag) for a floating dtype: float and double compute in themselves, bfloat16 and
// float16 in float.
template <class Fn>
void visit_floating_dtype(torch::ScalarType dtype, const char* where, const Fn& fn) {
  switch (dtype) {
    case torch::kFloat32:
      return fn(float{}, float{});
    case torch::kFloat64:
      return fn(double{}, double{});
    case torch::kBFloat16:
      return fn(float{}, c10::BFloat16{});
    case torch::kHalf:
      return fn(float{}, c10::Half{});
    default:
      DAPO_REQUIRE(false, where, "unsupported dtype ", dtype, ", expected float32, float64, bfloat16 or float16");
  }
}

// The dtype kernels compute in for a storage dtype: float32 for the 16-bit floats, else the dtype itself.
inline torch::ScalarType compute_dtype(torch::ScalarType dtype) {
  return dtype == torch::kBFloat16 || dtype == torch::kHalf ? torch::kFloat32 : dtype;
}

}  // namespace dapo::detail
