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

// Separate compilation (optional; the headers alone are the default). A program that calls the policy loss from many
// translation units compiles its kernels in each of them: every loss of the family for every arithmetic and dtype,
// about a minute of g++ -O3 per translation unit. Defining DAPO_SEPARATE_COMPILATION for every translation unit of
// the program turns the heaviest entry points (core::policy_loss for float and double, and the tensor front end's CPU
// kernel) into declarations, and one translation unit defines them:
//   core only:     #define DAPO_COMPILE_CORE_KERNELS  then  #include <dapo/core/loss.hpp>
//   with LibTorch: #define DAPO_COMPILE_TORCH_KERNELS then  #include <dapo/loss.hpp>   (the core ones too)
// as dapo's own targets dapo_core_compiled and dapo_torch_compiled do (src/). Every translation unit must be compiled
// with the same instruction-set flags as that one: the kernels' names carry DAPO_KERNEL_ABI, so a mismatch is a link
// error, never a wrong kernel.
#if defined(DAPO_COMPILE_TORCH_KERNELS) && !defined(DAPO_COMPILE_CORE_KERNELS)
#define DAPO_COMPILE_CORE_KERNELS
#endif
#if defined(DAPO_SEPARATE_COMPILATION)
#define DAPO_SEPARATE_INLINE
#if defined(DAPO_COMPILE_CORE_KERNELS)
#define DAPO_DEFINE_CORE_KERNELS 1
#else
#define DAPO_DEFINE_CORE_KERNELS 0
#endif
#if defined(DAPO_COMPILE_TORCH_KERNELS)
#define DAPO_DEFINE_TORCH_KERNELS 1
#else
#define DAPO_DEFINE_TORCH_KERNELS 0
#endif
#else
#define DAPO_SEPARATE_INLINE inline
#define DAPO_DEFINE_CORE_KERNELS 1
#define DAPO_DEFINE_TORCH_KERNELS 1
#endif
