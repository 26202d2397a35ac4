// Checkpoint directories that survive a kill at any moment: each checkpoint is written into a hidden temporary
// directory, flushed to disk, then renamed into place, and only then does root/latest name it. Readers follow latest,
// so they see the previous complete checkpoint until the new one is. What goes inside is the caller's business.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

namespace qwen {

// Writes checkpoint `name` under `root`: write(dir) fills a temporary directory, which is then synced, renamed to
// root/name and recorded in root/latest; older checkpoints beyond the newest `keep` are deleted (0 keeps all).
// Returns root/name. When write throws (a full disk), the temporary directory is removed, latest and every complete
// checkpoint stay as they were, and the exception propagates.
std::filesystem::path commit_checkpoint(const std::filesystem::path& root, const std::string& name,
                                        const std::function<void(const std::filesystem::path&)>& write, int64_t keep);

// The checkpoint root/latest names, if any. A path that is itself a checkpoint directory is returned as it is.
std::optional<std::filesystem::path> find_checkpoint(const std::filesystem::path& root_or_checkpoint);

}  // namespace qwen
