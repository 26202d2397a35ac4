// How dapo's core kernels are handed to a thread pool: a ParallelFor is any callable parallel(count, body) that runs
// body(first, last) over disjoint ranges covering [0, count). SerialFor, the default, runs it on the calling thread;
// the LibTorch front ends pass ATen's pool (<dapo/detail/aten_kernels.hpp>). Not a thread pool itself.
#pragma once

#include <cstdint>

namespace dapo::core {

// Runs body(0, count) once on the calling thread (nothing when count is 0).
struct SerialFor {
  template <class Body>
  void operator()(int64_t count, const Body& body) const {
    if (count > 0) body(0, count);
  }
};

}  // namespace dapo::core
