// Test support for the LibTorch front ends: vectors <-> tensors.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace dapo::test {

inline torch::Tensor tensor(const std::vector<double>& values, std::vector<int64_t> shape,
                            torch::ScalarType dtype = torch::kFloat64) {
  return torch::tensor(values, torch::kFloat64).reshape(shape).to(dtype);
}

// "Float", "Double", "Bool", ...: compare dtypes as text so a failing CHECK prints them (doctest cannot print
// c10::ScalarType itself: ADL finds c10::toString first).
inline std::string dtype_name(const torch::Tensor& t) {
  return c10::toString(t.scalar_type());
}

inline std::vector<double> values(const torch::Tensor& t) {
  const torch::Tensor flat = t.detach().to(torch::kFloat64).contiguous().reshape(-1);
  return std::vector<double>(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
}

}  // namespace dapo::test
