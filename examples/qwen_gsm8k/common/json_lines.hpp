// Reading JSON Lines files (metrics.jsonl, eval.jsonl): one JSON object per line. Not a writer: the trainer appends
// its rows itself.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <vector>

namespace qwen {

// One JSON object per non-blank line (a trailing '\r' is ignored). A line that is not a JSON object throws
// std::runtime_error "<path>:<line>: ..." (with a hint when it is a cut-off last line); a file that cannot be opened
// throws naming the path.
std::vector<nlohmann::json> read_json_lines(const std::filesystem::path& path);

}  // namespace qwen
