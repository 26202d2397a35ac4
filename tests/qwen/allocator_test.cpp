// The allocator of dapo's programs (CMake's DAPO_ALLOCATOR): a large tensor freed and made again is not faulted in
// from the kernel again, page by page, as glibc's malloc does (docs/benchmarks.md: page faults).
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <torch/torch.h>
#include <unistd.h>

#include <string>

namespace {

double page_faults() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_minflt + usage.ru_majflt);
}

}  // namespace

TEST_CASE("dapo's programs keep freed tensor memory for the next tensor when built with tcmalloc") {
  const bool tcmalloc = ::dlsym(RTLD_DEFAULT, "tc_malloc") != nullptr;
  if (std::string(DAPO_ALLOCATOR) != "tcmalloc") {
    MESSAGE("built with DAPO_ALLOCATOR=system: nothing to check");
    return;
  }
  REQUIRE_MESSAGE(tcmalloc, "DAPO_ALLOCATOR is tcmalloc but the process runs with another malloc");
  constexpr int64_t kFloats = 16 << 20;  // 64 MiB, far above glibc's largest mmap threshold (32 MiB)
  const double pages = kFloats * 4.0 / static_cast<double>(::sysconf(_SC_PAGESIZE));
  torch::ones({kFloats});  // the first one is faulted in
  const double before = page_faults();
  constexpr int kRounds = 8;
  for (int i = 0; i < kRounds; ++i) CHECK(torch::ones({kFloats}).sum().item<double>() == kFloats);
  // glibc: every round faults all its pages in again (8 x 16384 here); tcmalloc reuses the first one's.
  CHECK(page_faults() - before < 0.1 * pages * kRounds);
}
