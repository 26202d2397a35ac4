// read_json_lines: line by line, each error naming file:line.
#include "qwen_gsm8k/common/json_lines.hpp"

#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "qwen_gsm8k/common/json_error.hpp"

namespace qwen {

std::vector<nlohmann::json> read_json_lines(const std::filesystem::path& path) {
  using nlohmann::json;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path.string() + ": cannot open for reading (does the file exist?)");
  std::vector<json> rows;
  std::string line;
  for (std::size_t line_number = 1; std::getline(in, line); ++line_number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = path.string() + ":" + std::to_string(line_number) + ": ";
    json row;
    try {
      row = json::parse(line);
    } catch (const json::exception& parse_error) {
      const bool last_line = in.peek() == std::char_traits<char>::eof();
      throw std::runtime_error(where + "not valid JSON " + json_error_where(parse_error) + " (" + parse_error.what() +
                               ")" +
                               (last_line ? "; a run stopped mid-write leaves a partial last line: delete it" : ""));
    }
    if (!row.is_object()) {
      throw std::runtime_error(where + "expected one JSON object per line, not " + std::string(row.type_name()));
    }
    rows.push_back(std::move(row));
  }
  if (in.bad()) throw std::runtime_error(path.string() + ": read failed");
  return rows;
}

}  // namespace qwen
