// Fuzz target: the ZIP check run on a checkpoint's optimizer.pt before LibTorch reads it (common/zip_check.hpp):
// every offset and size in the archive comes from the file, so arbitrary bytes must give a verdict, never a read
// outside them.
#include "fuzz_support.hpp"
#include "qwen_gsm8k/common/zip_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  (void)qwen::zip_archive_problem(std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size));
  return 0;
}
