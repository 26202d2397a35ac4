// Fuzz target: a safetensors file's header (length prefix, JSON, every entry's dtype, shape and byte range).
// What an accepted header promises is checked too: every tensor's bytes lie inside the file and do not overlap.
#include <algorithm>
#include <vector>

#include "fuzz_support.hpp"
#include "qwen_gsm8k/model/safetensors_header.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string source = "fuzz.safetensors";
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  dapo::fuzz::expect_clean_rejection(source, [&] {
    const qwen::SafetensorsHeader header = qwen::parse_safetensors_header(file, source);
    if (header.data_start < 8 || header.data_start > size) dapo::fuzz::finding("data_start outside the file");
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const auto& entry : header.entries) {
      uint64_t bytes = entry.element_bytes;
      for (const int64_t extent : entry.shape) {
        if (extent < 0) dapo::fuzz::finding("negative size in an accepted shape");
        bytes *= static_cast<uint64_t>(extent);  // checked by the parser not to overflow
      }
      if (entry.begin > entry.end || entry.end > size - header.data_start || entry.end - entry.begin != bytes) {
        dapo::fuzz::finding("an accepted tensor's bytes do not match its shape or lie outside the file");
      }
      ranges.emplace_back(entry.begin, entry.end);
    }
    std::sort(ranges.begin(), ranges.end());
    for (std::size_t i = 1; i < ranges.size(); ++i) {
      if (ranges[i].first < ranges[i - 1].second) dapo::fuzz::finding("accepted tensors overlap");
    }
  });
  return 0;
}
