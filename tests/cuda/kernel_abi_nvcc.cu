// The nvcc half of kernel_abi_test: the CPU loss kernel and its SIMD dispatch as a .cu file's host code sees them
// (nvcc has no vector extensions: the scalar path). See kernel_abi_test.cpp.
#include <dapo/core/loss.hpp>

#include <vector>

using LanesFunction = int (*)();

LanesFunction nvcc_widest_float_lanes() {
  return &dapo::simd::widest_float_lanes;
}

double nvcc_policy_loss(const std::vector<float>& logp, const std::vector<float>& old_logp,
                        const std::vector<float>& advantages, const std::vector<float>& mask, int64_t rows,
                        int64_t cols) {
  return dapo::core::policy_loss<float>(logp, old_logp, advantages, mask, rows, cols).loss;
}
