// Writing a whole file atomically: the bytes go to "<path>.tmp" beside it, which is flushed to disk (fsync) and then
// renamed over `path`, so a reader, or a run killed mid-write, sees the old file or the complete new one, never a mix.
// Every step is checked: a write the disk refuses (full, a file size limit, an I/O error) throws with its errno text
// instead of leaving a short file under the real name. The directory entry itself is not synced (commit_checkpoint
// does that for checkpoints).
#pragma once

#include <filesystem>
#include <functional>
#include <ostream>
#include <string_view>

namespace qwen {

// Writes `text` as the whole content of `path`. On any failure `path` is left as it was, the temporary file is
// removed, and std::runtime_error names the file, the system's reason (strerror) and a hint.
void write_file_atomically(const std::filesystem::path& path, std::string_view text);

// The same for content produced piece by piece (safetensors' tensors): `write` streams it into the temporary file. An
// exception from `write` propagates after the temporary is removed; a stream left failed counts as a failed write. A
// write the disk refuses does not fail the stream (LibTorch's archive writer cannot take that): `write` runs to its
// end with the rest of the bytes dropped, then the error is thrown.
void write_file_atomically(const std::filesystem::path& path, const std::function<void(std::ostream&)>& write);

}  // namespace qwen
