// The ABI tag of dapo's CPU kernels. They are inline functions whose bodies depend on how a translation unit is
// compiled: its SIMD width (-mavx2, -mavx512f, -march=native) and nvcc, which has no vector extensions and compiles
// the scalar path only. Two translation units of one program compiled differently would hold two bodies of one
// function, and the linker would keep one of them for both (an ODR violation: a .cu file's copy could make the C++
// files refuse 8 float lanes on an AVX2 CPU). So everything whose body depends on it sits in an inline namespace
// named after the compilation mode: each mode gets its own symbols, and the names programs use
// (dapo::policy_loss, dapo::simd::widest_float_lanes) do not change. Types shared across modes (options, results,
// the CUDA kernel's registry) stay outside it.
#pragma once

#if defined(__CUDACC__)
#define DAPO_KERNEL_ABI kernels_nvcc
#elif defined(__AVX512F__)
#define DAPO_KERNEL_ABI kernels_avx512
#elif defined(__AVX2__)
#define DAPO_KERNEL_ABI kernels_avx2
#else
#define DAPO_KERNEL_ABI kernels_baseline
#endif
