// The model tests' main: doctest's, after the process set-up the driver makes (cli/runtime.hpp): the idle threads of
// LibTorch's OpenMP pool and of OpenBLAS sleep instead of spinning. It changes no result, only the time: LibTorch
// 2.14's libgomp and OpenBLAS 0.3.34 both spin in user space, against each other on the same cores (the warm start of
// trainer_test's demo: 296 s spinning, 50 s sleeping, on one 2-core machine; docs/platforms.md). The workers and
// drivers the tests start inherit the settings. OpenBLAS's thread count is then set as the driver sets it for a model
// of hidden size 64, every model here: one thread with LibTorch 2.x, whose OpenBLAS spins while its threads wait for
// each other; as it starts with 1.x.
#define DOCTEST_CONFIG_IMPLEMENT
#include <ATen/Parallel.h>
#include <doctest/doctest.h>

#include "qwen_gsm8k/cli/runtime.hpp"

int main(int argc, char** argv) {
  qwen::use_passive_thread_pools(argv);
  qwen::set_blas_threads(qwen::blas_threads_for(64, at::get_num_threads()));
  return doctest::Context(argc, argv).run();
}
