// The run directory (--output): the one place that names the files a run writes there (metrics.jsonl, eval.jsonl,
// summary.json, report.html, events.out.tfevents.*, checkpoints/, plots/, rollouts/) and that prepares the directory
// for a new, resumed or overwritten run. Writers, readers and the CLI take the names from here.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace qwen {

// What to do with a directory that already holds a run's files.
enum class OutputReuse {
  kRefuse,     // the default: an error naming what is there and the flags that allow it
  kResume,     // train --resume: the run continues in place
  kOverwrite,  // --overwrite: the old run's files are removed first
};

struct RunDirectory {
  std::filesystem::path root;

  static constexpr const char* kMetrics = "metrics.jsonl";  // one row per step (jsonl logger)
  static constexpr const char* kEval = "eval.jsonl";        // one row per held-out evaluation (always written)
  static constexpr const char* kSummary = "summary.json";   // the demo's result
  static constexpr const char* kReport = "report.html";     // the report page (report/page.cpp)
  static constexpr const char* kCheckpoints = "checkpoints";
  static constexpr const char* kPlots = "plots";  // the report's charts as SVG files
  static constexpr const char* kRollouts = "rollouts";
  static constexpr const char* kEventsPrefix = "events.out.tfevents.";  // TensorBoard event files start so

  std::filesystem::path metrics() const { return root / kMetrics; }
  std::filesystem::path eval() const { return root / kEval; }
  std::filesystem::path summary() const { return root / kSummary; }
  std::filesystem::path report() const { return root / kReport; }
  std::filesystem::path checkpoints() const { return root / kCheckpoints; }
  std::filesystem::path plots() const { return root / kPlots; }
  std::filesystem::path rollouts() const { return root / kRollouts; }
  // rollouts/step-NNNNNN.jsonl
  std::filesystem::path rollout_log(int64_t step) const;

  // The run files the directory holds ("metrics.jsonl", "checkpoints/", ...), empty for a new or empty directory.
  std::vector<std::string> files_present() const;
  // Applies `reuse` before anything is written, and creates the directory. kOverwrite removes the run's files (the
  // names above, the event files) and nothing else. Throws std::invalid_argument (kRefuse) naming the directory and
  // what it holds; `hint` says which flags allow reuse. std::runtime_error when a file cannot be removed.
  void prepare(OutputReuse reuse, const std::string& hint) const;
};

}  // namespace qwen
