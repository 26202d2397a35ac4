// Checking a ZIP archive against itself before it is loaded. LibTorch's .pt files (torch::save, the optimizer state of
// a checkpoint) are ZIP archives of stored entries, each with its CRC-32, and LibTorch 1.13 reads them without
// checking it: bytes overwritten inside optimizer.pt load as garbage moments that surface steps later as NaN. Not a ZIP
// reader: nothing is extracted, compressed entries are only bounds-checked.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <span>
#include <string>

namespace qwen {

// What is wrong with `archive` (the whole file's bytes), or nothing when it is sound: the end of central directory
// record (ZIP64 too), every central directory entry and its local header inside the file, and each stored entry's
// data against its CRC-32. The text names the entry and the offset.
std::optional<std::string> zip_archive_problem(std::span<const std::byte> archive);

// The same for a file (memory-mapped, read once); a file that cannot be opened or mapped is a problem too.
std::optional<std::string> zip_archive_problem(const std::filesystem::path& path);

}  // namespace qwen
