// Process set-up for programs that run the model on CPU. LibTorch's elementwise ops use OpenMP threads, its matrix
// products OpenBLAS's own threads, on the same cores; libgomp's idle workers spin-wait after each parallel region and
// starve the BLAS threads (measured here: a Qwen2.5-0.5B decode step 0.45 s spinning, 0.14 s passive). libgomp reads
// GOMP_SPINCOUNT only at start-up, so the program re-executes itself once with GOMP_SPINCOUNT=0.
#pragma once

#include <unistd.h>

#include <cstdlib>

namespace qwen {

// Call first thing in main(). A GOMP_SPINCOUNT already set (by the user, or by the re-execution) is left alone.
inline void use_passive_openmp(char** argv) {
  if (std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  ::setenv("GOMP_SPINCOUNT", "0", 1);
  ::execv("/proc/self/exe", argv);  // returns only if it failed; the program then runs with spinning workers
}

}  // namespace qwen
