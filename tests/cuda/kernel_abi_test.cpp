// One program, a C++ file and a .cu file that both use dapo's CPU loss kernel: each must keep its own compilation of
// it (<dapo/core/kernel_abi.hpp>). Without the ABI tag the two inline definitions share one symbol and the linker
// keeps the first (the .cu object is linked first here): the C++ half would then run the scalar copy and refuse the
// vector widths this CPU has. Built and run wherever CMake finds a CUDA compiler; needs no GPU.
#include <dapo/core/loss.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

using LanesFunction = int (*)();
LanesFunction nvcc_widest_float_lanes();
double nvcc_policy_loss(const std::vector<float>& logp, const std::vector<float>& old_logp,
                        const std::vector<float>& advantages, const std::vector<float>& mask, int64_t rows,
                        int64_t cols);

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what);
  if (!ok) ++failures;
}

}  // namespace

int main() {
  const LanesFunction cxx = &dapo::simd::widest_float_lanes;
  const LanesFunction nvcc = nvcc_widest_float_lanes();
  std::printf("widest float lanes: C++ %d, nvcc %d\n", cxx(), nvcc());
  check(cxx != nvcc, "the C++ and the nvcc compilations of widest_float_lanes are different functions");
  check(nvcc() == 1, "nvcc's compilation is the scalar one");
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__aarch64__))
  check(cxx() >= 4, "the C++ compilation uses vector lanes");
#endif

  // The same loss from both halves, and from the C++ half at every width it offers.
  const int64_t rows = 6, cols = 37;
  std::vector<float> logp, old_logp, mask, advantages;
  for (int64_t i = 0; i < rows * cols; ++i) {
    logp.push_back(-0.1f - 0.01f * static_cast<float>(i % 13));
    old_logp.push_back(-0.12f - 0.009f * static_cast<float>(i % 11));
    mask.push_back(i % 7 == 3 ? 0.0f : 1.0f);
  }
  for (int64_t r = 0; r < rows; ++r) advantages.push_back(r % 2 == 0 ? 1.0f : -0.5f);
  const double from_nvcc = nvcc_policy_loss(logp, old_logp, advantages, mask, rows, cols);
  for (const int lanes : {1, 4, 8, 16}) {
    if (lanes > cxx()) continue;
    const dapo::core::PolicyLossInputs<float, float, float> inputs{
        logp.data(), old_logp.data(), advantages.data(), mask.data(), rows, cols, false};
    const double from_cxx =
        dapo::core::policy_loss_kernel<float>(inputs, dapo::PolicyLossOptions{}, static_cast<float*>(nullptr),
                                              "kernel_abi_test", dapo::core::SerialFor{}, lanes)
            .result.loss;
    std::printf("lanes %2d: C++ loss %.9g, nvcc loss %.9g\n", lanes, from_cxx, from_nvcc);
    check(std::abs(from_cxx - from_nvcc) <= 1e-6 * std::abs(from_nvcc), "both halves compute the same loss");
  }
  return failures == 0 ? 0 : 1;
}
