// Boundary checks of the LibTorch front ends: each throws std::invalid_argument naming the argument, what it was and
// what was expected ("mask has shape [4, 9] but logp has [4, 10]"). The math behind the front ends assumes them.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include <string>
#include <vector>

#include "dapo/core/error.hpp"

namespace dapo::detail {

inline std::string shape_of(const torch::Tensor& tensor) {
  return shape_string(tensor.sizes().vec());
}

inline void check_defined(const torch::Tensor& tensor, const char* name, const char* where) {
  DAPO_REQUIRE(tensor.defined(), where, name, " is an undefined tensor");
}

inline void check_floating(const torch::Tensor& tensor, const char* name, const char* where) {
  check_defined(tensor, name, where);
  DAPO_REQUIRE(tensor.is_floating_point(), where, name, " has dtype ", tensor.scalar_type(),
               ", expected a floating dtype (float32, float64, bfloat16 or float16)");
}

inline void check_dim(const torch::Tensor& tensor, int64_t dim, const char* name, const char* where) {
  DAPO_REQUIRE(tensor.dim() == dim, where, name, " has shape ", shape_of(tensor), ", expected ", dim, " dimension",
               dim == 1 ? "" : "s");
}

inline void check_same_device(const torch::Tensor& tensor, const torch::Tensor& reference, const char* name,
                              const char* reference_name, const char* where) {
  DAPO_REQUIRE(tensor.device() == reference.device(), where, name, " is on ", tensor.device(), " but ", reference_name,
               " is on ", reference.device());
}

// The index of the first element (row-major order) where flags is true, e.g. "[1, 3]"; "" when none is.
inline std::string first_true_index(const torch::Tensor& flags) {
  const torch::Tensor positions = flags.reshape(-1).nonzero();
  if (positions.size(0) == 0) return {};
  int64_t flat = positions[0][0].item<int64_t>();
  std::vector<int64_t> index(static_cast<std::size_t>(flags.dim()));
  for (int64_t d = flags.dim() - 1; d >= 0; --d) {
    index[static_cast<std::size_t>(d)] = flat % flags.size(d);
    flat /= flags.size(d);
  }
  return shape_string(index);
}

// Throws naming the first NaN or infinite element ("rewards[5] is nan, expected a finite number").
inline void check_finite(const torch::Tensor& tensor, const char* name, const char* where) {
  const torch::Tensor bad = ~torch::isfinite(tensor);
  const std::string index = first_true_index(bad);
  DAPO_REQUIRE(index.empty(), where, name, index, " is ",
               index.empty() ? 0.0 : tensor.masked_select(bad)[0].item<double>(), ", expected a finite number");
}

}  // namespace dapo::detail
