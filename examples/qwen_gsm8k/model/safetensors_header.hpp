// The two JSON parts of Hugging Face's safetensors format, parsed and checked without LibTorch: a file's header (the
// 8-byte little-endian length, then a JSON object naming each tensor's dtype, shape and byte range) and a sharded
// checkpoint's model.safetensors.index.json. safetensors.hpp maps the file and makes tensors of what these return.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qwen {

struct SafetensorsHeaderEntry {
  std::string name;
  std::string dtype_name;  // as in the file: "F32", "BF16", ...
  std::size_t element_bytes = 0;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
};

struct SafetensorsHeader {
  std::size_t data_start = 0;  // file offset of the data section: 8 + the header's length
  std::vector<SafetensorsHeaderEntry> entries;
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// The dtypes the format names and this driver reads, with their element sizes.
inline constexpr std::pair<std::string_view, std::size_t> kSafetensorsDtypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
    {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};

// Parses the header of a whole safetensors file, `file` (its bytes: the data section is only measured, never read).
// Every field is checked against the file: a known dtype, sizes >= 0, byte ranges inside the data section, of the
// size shape and dtype imply, not overlapping. Throws std::runtime_error "<source>: <what>, <where>" otherwise.
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file, const std::string& source);

// model.safetensors.index.json's "weight_map": tensor name -> shard file name (a plain name in the same directory).
// Throws std::runtime_error naming `source` and the entry at fault.
std::map<std::string, std::string> parse_shard_index(std::string_view text, const std::string& source);

}  // namespace qwen
