// Process set-up for programs that run the model on CPU. LibTorch's elementwise ops use OpenMP threads, its matrix
// products OpenBLAS's own threads, on the same cores. Both pools busy-wait after each piece of work by default and
// starve each other:
// - libgomp's idle workers spin (measured here: a Qwen2.5-0.5B decode step 0.45 s spinning, 0.14 s passive);
// - OpenBLAS's idle workers call sched_yield for 2^28 cycles before they sleep (measured: the demo's DAPO step 8.0 s
//   with 12 s of system time, 6.0 s with 2 s once they sleep after 2^4 cycles).
// Both libraries read their settings (GOMP_SPINCOUNT, OPENBLAS_THREAD_TIMEOUT) only when they load, before main(), so
// the program re-executes itself once with them set. Neither changes any result: the threads' number and the split
// of the work stay the same (OPENBLAS_NUM_THREADS would not: OpenBLAS's sums then change in the last bits).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <utility>

namespace qwen {

// Call first thing in main(). Settings already present (set by the user, or by the re-execution) are left alone.
inline void use_passive_thread_pools(char** argv) {
  bool changed = false;
  for (const auto& [name, value] : {std::pair{"GOMP_SPINCOUNT", "0"}, std::pair{"OPENBLAS_THREAD_TIMEOUT", "4"}}) {
    if (std::getenv(name) != nullptr) continue;
    ::setenv(name, value, 1);
    changed = true;
  }
  if (changed) ::execv("/proc/self/exe", argv);  // returns only if it failed; the program then runs as it is
}

}  // namespace qwen
