// Process set-up for programs that run the model on CPU. LibTorch's elementwise ops use OpenMP threads, its matrix
// products OpenBLAS's own threads, on the same cores. Both pools busy-wait after each piece of work by default and
// starve each other:
// - libgomp's idle workers spin (measured here: a Qwen2.5-0.5B decode step 0.45 s spinning, 0.14 s passive);
// - OpenBLAS's idle workers call sched_yield for 2^28 cycles before they sleep (measured: the demo's DAPO step 8.0 s
//   with 12 s of system time, 6.0 s with 2 s once they sleep after 2^4 cycles).
// Both libraries read their settings (GOMP_SPINCOUNT, OPENBLAS_THREAD_TIMEOUT) only when they load, before main(), so
// the program re-executes itself once with them set. Neither changes any result: the threads' number and the split
// of the work stay the same. Only with OpenBLAS: pip's LibTorch multiplies with MKL on the OpenMP pool itself, one
// pool, and there sleeping workers cost a wake-up per op (measured with generate_bench on 2 cores, LibTorch 2.15: the
// demo's model decodes a step of 32 rows in 0.77 ms spinning, 3.2 to 3.7 ms passive; Qwen2.5-0.5B's 0.41 s either
// way).
//
// OpenBLAS's thread count is a second setting: LibTorch's set_num_threads sizes its OpenMP pool only, and OpenBLAS
// otherwise starts one thread per core, whatever --threads says, in every local rank. Its threaded products wait for
// each other's blocks in a spin loop (OpenBLAS 0.3.29, LibTorch 2.6's: eight nops, no sched_yield), so on a busy
// machine a waiting thread burns its time slice while the one it waits for is descheduled. Measured on 2 cores beside
// two busy loops (docs/benchmarks.md): the demo's step on LibTorch 2.6 18.4 s with 14.8 s of user CPU, 6.8 s with
// 4.9 s single-threaded.
#pragma once

#include <dlfcn.h>
#include <torch/version.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <utility>

namespace qwen {

// Call first thing in main(). Settings already present (set by the user, or by the re-execution) are left alone.
inline void use_passive_thread_pools(char** argv) {
  if (::dlsym(RTLD_DEFAULT, "openblas_get_num_threads") == nullptr) return;  // one pool: let it spin
  bool changed = false;
  for (const auto& [name, value] : {std::pair{"GOMP_SPINCOUNT", "0"}, std::pair{"OPENBLAS_THREAD_TIMEOUT", "4"}}) {
    if (std::getenv(name) != nullptr) continue;
    ::setenv(name, value, 1);
    changed = true;
  }
  if (changed) ::execv("/proc/self/exe", argv);  // returns only if it failed; the program then runs as it is
}

// OpenBLAS's threads for a model of this hidden size, given LibTorch's `threads`; 0: leave OpenBLAS as it starts (one
// thread per core). Small models' products are too small to share: measured with step_bench on 2 cores, quiet, the
// demo's model (hidden 64) steps in about the same time single-threaded on LibTorch 2.6 (2.7x faster under load), the
// small shape (hidden 256) 1.3x faster with both threads. The cut lies between the two, unmeasured: 128 and below take
// one thread. With LibTorch 1.x, 0: Debian 12's OpenBLAS 0.3.21 yields while it waits, and its sums depend on its
// thread count in some products (the seed-1 demo single-threaded on 1.13 is another run: 0.580 after the warm start,
// not 0.610), so 1.13's runs stay those that docs/driver.md and docs/distributed.md record.
inline int blas_threads_for(std::int64_t hidden_size, int threads) {
#if TORCH_VERSION_MAJOR >= 2
  return hidden_size <= 128 ? 1 : threads;
#else
  static_cast<void>(hidden_size), static_cast<void>(threads);
  return 0;
#endif
}

// Sets OpenBLAS's thread count (0: leaves it), from a thread outside any BLAS call, unless the user chose one (OpenBLAS
// reads OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS, then OMP_NUM_THREADS). Returns the count OpenBLAS now uses, 0 where
// LibTorch's BLAS is not OpenBLAS (then nothing is set).
inline int set_blas_threads(int threads) {
  using GetThreads = int (*)();
  using SetThreads = void (*)(int);
  auto* get = reinterpret_cast<GetThreads>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  auto* set = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (get == nullptr || set == nullptr) return 0;
  bool chosen = false;
  for (const char* name : {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"}) {
    chosen = chosen || std::getenv(name) != nullptr;
  }
  if (!chosen && threads > 0) set(threads);
  return get();
}

}  // namespace qwen
