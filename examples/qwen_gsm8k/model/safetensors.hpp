// The safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the raw data. Files are memory-mapped for reading; every header field is checked
// against the file before any byte is used. Not a general serialisation library: only what model weights need.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace qwen {

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;  // as in the file: "F32", "BF16", ...
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
};

class SafetensorsFile {
 public:
  // Maps and validates the file; throws std::runtime_error naming the file, the tensor and the offset at fault.
  static SafetensorsFile open(const std::filesystem::path& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::filesystem::path& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The stored tensor as a CPU tensor that views the mapped bytes (no copy): valid while this file is open; read-only.
  torch::Tensor view(const SafetensorsEntry& entry) const;
  // Tells the kernel that bytes [first, last) of `entry` (offsets within the tensor; all of it by default) are no
  // longer needed, so the pages wholly inside leave the resident set once they have been copied.
  void release(const SafetensorsEntry& entry, uint64_t first = 0, uint64_t last = UINT64_MAX) const;

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  const std::byte* mapping_ = nullptr;
  std::size_t size_ = 0;
  std::size_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (any device or layout; copied to contiguous CPU) as one safetensors file, atomically (a temporary
// file, then a rename). Names must be unique.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The safetensors dtype name of a tensor dtype ("F32", "BF16", ...); throws for dtypes the format lacks.
std::string safetensors_dtype_name(torch::ScalarType dtype);

}  // namespace qwen
