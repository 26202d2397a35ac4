// Arithmetic policies for dapo's elementwise CPU kernels: Scalar<C> (one float or double at a time, also usable in
// CUDA device code) and FloatVector (a SIMD register of floats, through GCC/Clang vector extensions). A kernel written
// once against the policy interface runs with either; not a general SIMD library.
//
// Policy interface: Value, kLanes, splat(x), select(mask, a, b), exp(v), load<T>(p), load_partial<T>(p, n),
// store(p, v), store_partial(p, v, n), sum(v) and max(v) across lanes (as double). Comparisons and + - * come from the
// language. FloatVector<kLanes> holds 4, 8 or 16 floats; kernels pick the width at run time from the CPU (see
// <dapo/core/loss.hpp>), so a portable build still uses AVX2 or AVX-512 where the machine has them.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "dapo/core/error.hpp"
#include "dapo/core/kernel_abi.hpp"

// "float_lanes is 3, expected 0 (the widest this CPU runs), 1, 4, 8 or 16 that this CPU runs (at most 8)"
#define DAPO_SIMD_REQUIRE(condition, where, requested)                                                \
  DAPO_REQUIRE(condition, where, "float_lanes is ", requested,                                        \
               ", expected 0 (the widest this CPU runs), 1, 4, 8 or 16 that this CPU runs (at most ", \
               ::dapo::simd::widest_float_lanes(), ")")

#if defined(__CUDACC__)
#define DAPO_HOST_DEVICE __host__ __device__
#define DAPO_INLINE __forceinline__
#elif defined(__GNUC__)
#define DAPO_HOST_DEVICE
// Always inlined, so that a kernel compiled for a wider instruction set (target attributes) compiles these with it.
#define DAPO_INLINE [[gnu::always_inline]] inline
#else
#define DAPO_HOST_DEVICE
#define DAPO_INLINE inline
#endif

namespace dapo::simd {
inline namespace DAPO_KERNEL_ABI {  // see kernel_abi.hpp

template <class C>
struct Scalar {
  using Value = C;
  static constexpr int kLanes = 1;
  static constexpr double kExpLow = -1.0e300, kExpHigh = 1.0e300;  // exp's valid arguments: all
  DAPO_HOST_DEVICE DAPO_INLINE static Value splat(double x) { return static_cast<Value>(x); }
  template <class Mask>
  DAPO_HOST_DEVICE DAPO_INLINE static Value select(Mask mask, Value a, Value b) {
    return mask ? a : b;
  }
  DAPO_HOST_DEVICE DAPO_INLINE static Value exp(Value x) { return std::exp(x); }
  DAPO_HOST_DEVICE DAPO_INLINE static Value log(Value x) { return std::log(x); }
  template <class T>
  DAPO_HOST_DEVICE DAPO_INLINE static Value load(const T* p) {
    return static_cast<Value>(*p);
  }
  template <class T>
  DAPO_HOST_DEVICE DAPO_INLINE static Value load_partial(const T* p, int64_t) {
    return static_cast<Value>(*p);
  }
  template <class G>
  DAPO_HOST_DEVICE DAPO_INLINE static void store(G* p, Value v) {
    *p = static_cast<G>(v);
  }
  template <class G>
  DAPO_HOST_DEVICE DAPO_INLINE static void store_partial(G* p, Value v, int64_t) {
    *p = static_cast<G>(v);
  }
  DAPO_HOST_DEVICE DAPO_INLINE static double sum(Value v) { return static_cast<double>(v); }
  DAPO_HOST_DEVICE DAPO_INLINE static double max(Value v) { return static_cast<double>(v); }
};

#if defined(__GNUC__) && !defined(__CUDACC__)
#define DAPO_HAVE_FLOAT_VECTOR 1

// GCC's -Wpsabi: a function that returns a wide vector (FloatVector<8>, <16>) "changes the ABI" unless the translation
// unit enables AVX. No such ABI boundary exists, as every function here is always inlined into its caller. GCC
// reports these for template instantiations at the end of the translation unit, so the warning has to stay off from
// here to the end of it: a pragma, not a flag that consumers inherit. Its other form, a note about the alignment of
// wide by-value parameters, cannot be silenced by a pragma; wide vectors are passed by const reference instead.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

// GCC ignores vector_size on a type that depends on a template parameter, so the three widths are spelled out.
template <int kLaneCount>
struct VectorTypes;
template <>
struct VectorTypes<4> {
  typedef float Value __attribute__((vector_size(16)));
  typedef int32_t Bits __attribute__((vector_size(16)));
  typedef uint8_t WideBytes __attribute__((vector_size(16)));
  typedef uint32_t Words __attribute__((vector_size(16)));
};
template <>
struct VectorTypes<8> {
  typedef float Value __attribute__((vector_size(32)));
  typedef int32_t Bits __attribute__((vector_size(32)));
  typedef uint8_t WideBytes __attribute__((vector_size(32)));
  typedef uint32_t Words __attribute__((vector_size(32)));
};
template <>
struct VectorTypes<16> {
  typedef float Value __attribute__((vector_size(64)));
  typedef int32_t Bits __attribute__((vector_size(64)));
  typedef uint8_t WideBytes __attribute__((vector_size(64)));
  typedef uint32_t Words __attribute__((vector_size(64)));
};

template <int kLaneCount>
struct FloatVector {
  using Value = typename VectorTypes<kLaneCount>::Value;
  using Bits = typename VectorTypes<kLaneCount>::Bits;  // what comparisons return
  static constexpr int kLanes = kLaneCount;
  static constexpr double kExpLow = -87.0, kExpHigh = 88.0;  // where exp below holds

  DAPO_INLINE static Value splat(double x) { return Value{} + static_cast<float>(x); }

  DAPO_INLINE static Value select(const Bits& mask, const Value& a, const Value& b) {
#if defined(__clang__)
    return std::bit_cast<Value>((std::bit_cast<Bits>(a) & mask) | (std::bit_cast<Bits>(b) & ~mask));
#else
    return mask ? a : b;  // GCC: a blend instruction where the target has one
#endif
  }

  // exp with a relative error below 1e-7 (Cephes expf: 2^n * p(r), |r| <= ln2 / 2) for x in [-87, 88], which is all
  // dapo's kernels pass (log-ratios are clamped to [-20, 20] first); NaN stays NaN.
  DAPO_INLINE static Value exp(const Value& x) {
    const Bits is_number = x == x;
    const Value v = select(is_number, x, splat(0.0));
    const Value scaled = v * 1.44269504088896341f;
    const Bits n = __builtin_convertvector(scaled + select(scaled >= splat(0.0), splat(0.5), splat(-0.5)), Bits);
    const Value fn = __builtin_convertvector(n, Value);
    const Value r = v - fn * 0.693359375f + fn * 2.12194440e-4f;  // v - n ln2, ln2 split for exactness
    Value p = splat(1.9875691500e-4);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const Value two_to_n = std::bit_cast<Value>((n + 127) << 23);
    return select(is_number, p * two_to_n, x);
  }

  // log lane by lane (std::log): only the dppo_kl loss takes a log, once per token.
  DAPO_INLINE static Value log(const Value& x) {
    Value out;
    for (int i = 0; i < kLanes; ++i) out[i] = std::log(x[i]);
    return out;
  }

  // kLanes bytes (bool or uint8) widened to 32-bit lanes with one byte shuffle: GCC turns a byte-to-int
  // __builtin_convertvector into one scalar insert per lane.
  template <class Byte, std::size_t... kIndex>
  DAPO_INLINE static Bits widen_bytes(const Byte* p, std::index_sequence<kIndex...>) {
    using Wide = typename VectorTypes<kLaneCount>::WideBytes;  // as many bytes as Bits has
    // Built from integers, not by a small memcpy into a wide stack slot: that would stall store forwarding.
    using Words = typename VectorTypes<kLaneCount>::Words;
    uint32_t head[kLanes / 4];
    std::memcpy(head, p, kLanes);
    Words words = {};
    for (int i = 0; i < kLanes / 4; ++i) words[i] = head[i];
    const Wide bytes = std::bit_cast<Wide>(words);
    constexpr int kZero = kLanes * 4;  // any index of the second (all-zero) operand
    const Wide spread = __builtin_shufflevector(bytes, Wide{}, (kIndex % 4 == 0 ? int(kIndex / 4) : kZero)...);
    return std::bit_cast<Bits>(spread);
  }

  template <class T>
  DAPO_INLINE static Value load(const T* p) {
    if constexpr (std::is_same_v<T, float>) {
      Value v;
      std::memcpy(&v, p, sizeof v);
      return v;
    } else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, uint8_t>) {
      return __builtin_convertvector(widen_bytes(p, std::make_index_sequence<kLanes * 4>{}), Value);
    } else {
      return load_partial(p, kLanes);
    }
  }
  // The first n lanes from p, the rest 0.
  template <class T>
  DAPO_INLINE static Value load_partial(const T* p, int64_t n) {
    float lanes[kLanes] = {};
    for (int64_t i = 0; i < n; ++i) lanes[i] = static_cast<float>(p[i]);
    Value v;
    std::memcpy(&v, lanes, sizeof v);
    return v;
  }
  template <class G>
  DAPO_INLINE static void store(G* p, const Value& v) {
    if constexpr (std::is_same_v<G, float>) {
      std::memcpy(p, &v, sizeof v);
    } else {
      for (int i = 0; i < kLanes; ++i) p[i] = static_cast<G>(v[i]);
    }
  }
  template <class G>
  DAPO_INLINE static void store_partial(G* p, const Value& v, int64_t n) {
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<G>(v[i]);
  }
  DAPO_INLINE static double sum(const Value& v) {
    double total = 0.0;
    for (int i = 0; i < kLanes; ++i) total += v[i];
    return total;
  }
  DAPO_INLINE static double max(const Value& v) {
    double largest = v[0];
    for (int i = 1; i < kLanes; ++i) largest = v[i] > largest ? v[i] : largest;
    return largest;
  }
};
#endif

// The widest float vector this build runs on this CPU: 16 (compiled for AVX-512), 8 (compiled for AVX2, or AVX2 + FMA
// found at run time) or 4 (the SSE2 / NEON baseline); 1 without vector extensions.
// AVX-512 is used only when the whole translation unit targets it (-mavx512f, -march=native): GCC lowers 512-bit
// generic vector comparisons piecewise inside a function that merely carries a target attribute.
#if defined(DAPO_HAVE_FLOAT_VECTOR) && (defined(__x86_64__) || defined(__i386__)) && !defined(__AVX2__)
#define DAPO_X86_AVX2_DISPATCH 1
#endif

inline int widest_float_lanes() {
#if !defined(DAPO_HAVE_FLOAT_VECTOR)
  return 1;
#elif defined(__AVX512F__)
  return 16;
#elif defined(__AVX2__)
  return 8;
#elif defined(DAPO_X86_AVX2_DISPATCH)
  static const int lanes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 8 : 4;
  return lanes;
#else
  return 4;
#endif
}

#if defined(DAPO_X86_AVX2_DISPATCH)
// Kernel::run<FloatVector<8>> compiled for AVX2: Kernel::run and everything it calls are always inlined, so they are
// compiled here, with this function's instruction set. (No lambda may sit in between: it would not be inlined.)
template <class Kernel, class... Args>
__attribute__((target("avx2,fma"))) decltype(auto) run_avx2(Args&... args) {
  return Kernel::template run<FloatVector<8>>(args...);
}
#endif

// Runs Kernel::template run<Math>(args...) for float data with `lanes` float lanes (1: Scalar<float>; 4, 8, 16:
// FloatVector), which must not exceed widest_float_lanes().
template <class Kernel, class... Args>
decltype(auto) run_float(int lanes, Args&... args) {
#if defined(DAPO_HAVE_FLOAT_VECTOR)
  if (lanes == 1) return Kernel::template run<Scalar<float>>(args...);
#if defined(__AVX512F__)
  if (lanes == 16) return Kernel::template run<FloatVector<16>>(args...);
#endif
#if defined(__AVX2__)
  if (lanes == 8) return Kernel::template run<FloatVector<8>>(args...);
#elif defined(DAPO_X86_AVX2_DISPATCH)
  if (lanes == 8) return run_avx2<Kernel>(args...);
#endif
  return Kernel::template run<FloatVector<4>>(args...);
#else
  (void)lanes;
  return Kernel::template run<Scalar<float>>(args...);
#endif
}

// Runs Kernel::template run<Math> for data of compute type C: double one value at a time, float with `lanes` lanes.
template <class C, class Kernel, class... Args>
decltype(auto) run(int lanes, Args&... args) {
  if constexpr (std::is_same_v<C, float>) {
    return run_float<Kernel>(lanes, args...);
  } else {
    (void)lanes;
    return Kernel::template run<Scalar<C>>(args...);
  }
}

// Checks a requested float width (0 = the widest this CPU runs) and returns the width to use.
inline int resolve_float_lanes(int requested, const char* where) {
  DAPO_SIMD_REQUIRE(requested == 0 || requested == 1 || requested == 4 || requested == 8 || requested == 16, where,
                    requested);
  DAPO_SIMD_REQUIRE(requested <= widest_float_lanes(), where, requested);
  return requested == 0 ? widest_float_lanes() : requested;
}

}  // namespace DAPO_KERNEL_ABI
}  // namespace dapo::simd
