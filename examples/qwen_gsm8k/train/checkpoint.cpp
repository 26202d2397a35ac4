// Atomic checkpoint directories: temporary directory, fsync, rename, then the "latest" pointer.
#include "qwen_gsm8k/train/checkpoint.hpp"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "qwen_gsm8k/common/atomic_file.hpp"

namespace qwen {
namespace {

constexpr const char* kLatest = "latest";
constexpr const char* kPartialPrefix = ".partial-";

void sync_path(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // nothing to flush that we could open; the rename still orders what we wrote
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

std::filesystem::path commit_checkpoint(const std::filesystem::path& root, const std::string& name,
                                        const std::function<void(const std::filesystem::path&)>& write, int64_t keep) {
  std::filesystem::create_directories(root);
  // Leftovers of a writer that was killed: half-written checkpoints and half-deleted old ones.
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    if (entry.path().filename().string().rfind(kPartialPrefix, 0) == 0) std::filesystem::remove_all(entry.path());
  }
  const auto partial = root / (kPartialPrefix + name);
  std::filesystem::create_directories(partial);
  try {
    write(partial);
  } catch (...) {
    // A write that failed (a full disk) leaves nothing behind that needs the space; latest is untouched.
    std::error_code ignored;
    std::filesystem::remove_all(partial, ignored);
    throw;
  }
  for (const auto& entry : std::filesystem::recursive_directory_iterator(partial)) {
    if (entry.is_regular_file()) sync_path(entry.path());
  }
  sync_path(partial);

  const auto final_dir = root / name;
  if (std::filesystem::exists(final_dir)) {
    // Saving the same step again: swap the two directories in one atomic step, then delete the old one (now under
    // the partial name). Where the file system cannot swap, move the old one aside first.
    if (::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
      const auto old = root / (kPartialPrefix + name + ".old");
      std::filesystem::rename(final_dir, old);
      std::filesystem::rename(partial, final_dir);
      std::filesystem::remove_all(old);
    } else {
      std::filesystem::remove_all(partial);
    }
  } else {
    std::filesystem::rename(partial, final_dir);
  }
  sync_path(root);
  write_file_atomically(root / kLatest, name + "\n");
  sync_path(root);

  if (keep > 0) {
    std::vector<std::filesystem::path> complete;
    for (const auto& entry : std::filesystem::directory_iterator(root)) {
      const std::string file = entry.path().filename().string();
      if (entry.is_directory() && file.rfind(kPartialPrefix, 0) != 0) complete.push_back(entry.path());
    }
    std::sort(complete.begin(), complete.end());  // names sort by step (zero-padded)
    for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < complete.size(); ++i) {
      if (complete[i] == final_dir) continue;
      // Rename first, so a kill in the middle of the deletion never leaves a half-deleted checkpoint under a
      // complete name; the next write sweeps the .partial- leftover.
      const auto doomed = root / (kPartialPrefix + complete[i].filename().string() + ".deleting");
      std::filesystem::rename(complete[i], doomed);
      std::filesystem::remove_all(doomed);
    }
  }
  return final_dir;
}

std::optional<std::filesystem::path> find_checkpoint(const std::filesystem::path& root_or_checkpoint) {
  if (std::filesystem::exists(root_or_checkpoint / "trainer_state.json")) return root_or_checkpoint;
  std::ifstream in(root_or_checkpoint / kLatest);
  std::string name;
  if (!(in >> name)) return std::nullopt;
  const auto dir = root_or_checkpoint / name;
  if (!std::filesystem::exists(dir / "trainer_state.json")) {
    throw std::runtime_error((root_or_checkpoint / kLatest).string() + " names " + name +
                             ", which is not a complete checkpoint (was it deleted by hand?)");
  }
  return dir;
}

}  // namespace qwen
