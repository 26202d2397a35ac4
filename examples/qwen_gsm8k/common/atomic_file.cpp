// write_file_atomically: one temporary beside the target, removed on every failure after it was created.
#include "qwen_gsm8k/common/atomic_file.hpp"

#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>

namespace qwen {
namespace {

namespace fs = std::filesystem;

void remove_quietly(const fs::path& path) {
  std::error_code ignored;
  fs::remove(path, ignored);
}

}  // namespace

void write_file_atomically(const fs::path& path, const std::function<void(std::ostream&)>& write) {
  fs::path temporary = path;
  temporary += ".tmp";
  std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
  if (!out) {
    throw std::runtime_error(temporary.string() +
                             ": cannot open for writing (does the directory exist, and is it writable?)");
  }
  try {
    write(out);
    out.close();
    if (!out) throw std::runtime_error(temporary.string() + ": write failed (disk full?)");
  } catch (...) {
    out.close();
    remove_quietly(temporary);
    throw;
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) {
    remove_quietly(temporary);
    throw std::runtime_error(path.string() + ": cannot move " + temporary.filename().string() +
                             " into place: " + error.message() + " (is there a directory of that name?)");
  }
}

void write_file_atomically(const fs::path& path, std::string_view text) {
  write_file_atomically(
      path, [text](std::ostream& out) { out.write(text.data(), static_cast<std::streamsize>(text.size())); });
}

}  // namespace qwen
