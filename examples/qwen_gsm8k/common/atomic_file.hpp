// Writing a whole file atomically: the bytes go to "<path>.tmp" beside it, which is then renamed over `path`, so a
// reader, or a run killed mid-write, sees the old file or the complete new one, never a mix. Not durable against a
// power cut (no fsync): a crashed process is what it guards against.
#pragma once

#include <filesystem>
#include <functional>
#include <ostream>
#include <string_view>

namespace qwen {

// Writes `text` as the whole content of `path`. On any failure `path` is left as it was, the temporary file is
// removed, and std::runtime_error names the file and gives a hint.
void write_file_atomically(const std::filesystem::path& path, std::string_view text);

// The same for content produced piece by piece (safetensors' tensors): `write` streams it into the temporary file. An
// exception from `write` propagates after the temporary is removed; a stream left failed counts as a failed write.
void write_file_atomically(const std::filesystem::path& path, const std::function<void(std::ostream&)>& write);

}  // namespace qwen
