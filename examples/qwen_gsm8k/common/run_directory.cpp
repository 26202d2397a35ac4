// The run directory's file names and its preparation for a new, resumed or overwritten run.
#include "qwen_gsm8k/common/run_directory.hpp"

#include <cstdio>
#include <stdexcept>
#include <system_error>

#include "qwen_gsm8k/common/joined.hpp"

namespace qwen {

std::filesystem::path RunDirectory::rollout_log(int64_t step) const {
  char name[64];
  std::snprintf(name, sizeof name, "step-%06lld.jsonl", static_cast<long long>(step));
  return rollouts() / name;
}

std::vector<std::string> RunDirectory::files_present() const {
  std::vector<std::string> found;
  for (const char* file : {kMetrics, kEval, kSummary}) {
    if (std::filesystem::exists(root / file)) found.emplace_back(file);
  }
  if (std::filesystem::exists(checkpoints())) found.emplace_back(std::string(kCheckpoints) + "/");
  return found;
}

void RunDirectory::prepare(OutputReuse reuse, const std::string& hint) const {
  const std::vector<std::string> found = files_present();
  if (!found.empty() && reuse == OutputReuse::kRefuse) {
    throw std::invalid_argument("--output " + root.string() + " already holds a run (" + joined(found, ", ") +
                                "): " + hint);
  }
  std::error_code error;
  if (!found.empty() && reuse == OutputReuse::kOverwrite) {
    for (const char* name : {kMetrics, kEval, kSummary, kReport, kCheckpoints, kPlots, kRollouts}) {
      std::filesystem::remove_all(root / name, error);
      if (error) throw std::runtime_error((root / name).string() + ": cannot remove (--overwrite): " + error.message());
    }
    for (const auto& entry : std::filesystem::directory_iterator(root)) {
      if (entry.path().filename().string().rfind(kEventsPrefix, 0) == 0) {
        std::filesystem::remove(entry.path(), error);
        if (error)
          throw std::runtime_error(entry.path().string() + ": cannot remove (--overwrite): " + error.message());
      }
    }
  }
  std::filesystem::create_directories(root, error);
  if (error) throw std::runtime_error(root.string() + ": cannot create the output directory: " + error.message());
}

}  // namespace qwen
