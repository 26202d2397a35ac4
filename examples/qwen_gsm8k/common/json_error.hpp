// Where nlohmann::json::parse refused a text, for error messages. It throws two kinds: parse_error for a syntax error
// (with the byte offset) and out_of_range 406 for a number too large for a double (with none), so every caller
// catches their common base, nlohmann::json::exception, and says where with this.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>

namespace qwen {

// "at byte 17" (plus `offset`, where the text starts inside its file), or "at a number too large for a double".
inline std::string json_error_where(const nlohmann::json::exception& error, std::size_t offset = 0) {
  if (const auto* syntax = dynamic_cast<const nlohmann::json::parse_error*>(&error)) {
    return "at byte " + std::to_string(offset + syntax->byte);
  }
  return "at a number too large for a double";
}

}  // namespace qwen
