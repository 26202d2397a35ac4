// The safetensors header and shard index, checked field by field before anything trusts them.
#include "qwen_gsm8k/model/safetensors_header.hpp"

#include <nlohmann/json.hpp>

#include <dapo/core/error.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "qwen_gsm8k/common/json_error.hpp"

namespace qwen {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit

[[noreturn]] void header_error(const std::string& source, const std::string& message) {
  throw std::runtime_error(source + ": " + message);
}

// One tensor's entry: dtype known, shape sizes, byte range inside the data section and of the size the shape and
// dtype imply (computed without overflow: a hostile shape must not wrap around to a plausible size).
SafetensorsHeaderEntry parse_entry(const std::string& source, const std::string& name, const nlohmann::json& value,
                                   std::size_t data_start, std::size_t data_bytes) {
  const std::string where = "tensor \"" + name + "\"";
  if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets")) {
    header_error(source, where + " lacks dtype, shape or data_offsets");
  }
  SafetensorsHeaderEntry entry;
  entry.name = name;
  if (!value.at("dtype").is_string()) header_error(source, where + ": dtype is not a string");
  entry.dtype_name = value.at("dtype").get<std::string>();
  for (const auto& [dtype, bytes] : kSafetensorsDtypes) {
    if (entry.dtype_name == dtype) entry.element_bytes = bytes;
  }
  if (entry.element_bytes == 0) {
    header_error(source, where + ": unknown dtype \"" + entry.dtype_name + "\" (expected F32, BF16, F16, ...)");
  }
  if (!value.at("shape").is_array()) header_error(source, where + ": shape is not a list");
  uint64_t expected = entry.element_bytes;
  bool overflow = false;
  for (const auto& extent : value.at("shape")) {
    if (!extent.is_number_unsigned() || extent.get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()}) {
      header_error(source, where + ": shape holds " + extent.dump() + ", expected sizes >= 0");
    }
    entry.shape.push_back(extent.get<int64_t>());
    overflow = __builtin_mul_overflow(expected, extent.get<uint64_t>(), &expected) || overflow;
  }
  const auto& offsets = value.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    header_error(source, where + ": data_offsets is " + offsets.dump() + ", expected [begin, end]");
  }
  entry.begin = offsets[0].get<uint64_t>();
  entry.end = offsets[1].get<uint64_t>();
  if (entry.begin > entry.end || entry.end > data_bytes) {
    header_error(source, where + ": data_offsets [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
                             "] fall outside the data section of " + std::to_string(data_bytes) +
                             " bytes (file offset " + std::to_string(data_start) + "; truncated file?)");
  }
  if (overflow || entry.end - entry.begin != expected) {
    header_error(source, where + ": " + std::to_string(entry.end - entry.begin) + " bytes for shape " +
                             dapo::shape_string(entry.shape) + " of " + entry.dtype_name + ", expected " +
                             (overflow ? std::string("more than 2^64") : std::to_string(expected)));
  }
  return entry;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file, const std::string& source) {
  if (file.size() < 8) {
    header_error(source,
                 "is " + std::to_string(file.size()) + " bytes, too short for the 8-byte header length (truncated?)");
  }
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.data(), 8);  // little-endian, as on every platform LibTorch runs on
  if (header_bytes > kMaxHeaderBytes || header_bytes > file.size() - 8) {
    header_error(source, "header length " + std::to_string(header_bytes) + " (bytes 0..8) exceeds the file size " +
                             std::to_string(file.size()) +
                             " or the 100 MB limit (truncated or not a safetensors file?)");
  }
  SafetensorsHeader header;
  header.data_start = 8 + header_bytes;
  const std::size_t data_bytes = file.size() - header.data_start;
  const auto* text = reinterpret_cast<const char*>(file.data()) + 8;
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text, text + header_bytes);
  } catch (const nlohmann::json::exception& error) {
    header_error(source, "header is not valid JSON " + json_error_where(error, 8) + " of the file");
  }
  if (!json.is_object()) header_error(source, "header is not a JSON object");

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, value] : json.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) header_error(source, "__metadata__ is not an object");
      for (const auto& [key, field] : value.items()) {
        if (!field.is_string()) header_error(source, "__metadata__[\"" + key + "\"] is not a string");
        header.metadata[key] = field.get<std::string>();
      }
      continue;
    }
    SafetensorsHeaderEntry entry = parse_entry(source, name, value, header.data_start, data_bytes);
    ranges.emplace_back(entry.begin, entry.end);
    header.entries.push_back(std::move(entry));
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      header_error(source, "tensors overlap at data offset " + std::to_string(ranges[i].first));
    }
  }
  return header;
}

std::map<std::string, std::string> parse_shard_index(std::string_view text, const std::string& source) {
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    header_error(source, "invalid JSON " + json_error_where(error));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index.at("weight_map").is_object()) {
    header_error(source, "no \"weight_map\" object");
  }
  std::map<std::string, std::string> shards;
  for (const auto& [name, file] : index.at("weight_map").items()) {
    const std::string shard = file.is_string() ? file.get<std::string>() : std::string();
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos) {
      header_error(source,
                   "weight_map[\"" + name + "\"] is " + file.dump() + ", expected a file name in the same directory");
    }
    shards[name] = shard;
  }
  return shards;
}

}  // namespace qwen
