// Runs side by side: comparison_charts names each run and reads its accuracies; write_comparison writes the SVGs.
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "qwen_gsm8k/common/atomic_file.hpp"
#include "qwen_gsm8k/common/json_lines.hpp"
#include "qwen_gsm8k/common/run_directory.hpp"
#include "qwen_gsm8k/report/markup.hpp"
#include "qwen_gsm8k/report/report.hpp"
#include "qwen_gsm8k/report/series.hpp"

namespace qwen {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// "<algorithm> seed <seed>" from the run's summary.json when it has both, else the directory's name.
std::string run_name(const fs::path& run, const std::string& directory) {
  const RunDirectory files{run};
  if (!fs::exists(files.summary())) return directory;
  std::ifstream in(files.summary());
  const json summary = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (summary.is_object() && summary.contains("algorithm") && summary.contains("seed")) {
    return summary.at("algorithm").get<std::string>() + " seed " + summary.at("seed").dump();
  }
  return directory;
}

}  // namespace

std::vector<Chart> comparison_charts(const std::vector<std::filesystem::path>& runs) {
  Chart held_out{"Held-out greedy accuracy", "step", "fraction correct", {}};
  Chart sampled{"Sampled training accuracy", "step", "fraction correct", {}};
  std::set<std::string> names;  // labels used so far
  for (const auto& run : runs) {
    const std::string directory = (run.filename().empty() ? run.parent_path() : run).filename().string();
    std::string name = run_name(run, directory);
    if (!names.insert(name).second) {
      name += " (" + directory + ")";
      names.insert(name);
    }
    const RunDirectory files{run};
    if (fs::exists(files.eval())) {
      held_out.series.push_back(detail::series_of(read_json_lines(files.eval()), "accuracy", name));
    }
    if (fs::exists(files.metrics())) {
      sampled.series.push_back(detail::series_of(read_json_lines(files.metrics()), "sampled/accuracy", name));
    }
  }
  return {held_out, sampled};
}

std::vector<std::filesystem::path> write_comparison(const std::filesystem::path& output_dir,
                                                    const std::vector<std::filesystem::path>& runs) {
  std::error_code error;
  fs::create_directories(output_dir, error);
  if (error) throw std::runtime_error(output_dir.string() + ": cannot create directory: " + error.message());
  std::vector<std::filesystem::path> written;
  for (const Chart& chart : comparison_charts(runs)) {
    written.push_back(output_dir / (detail::slug_of(chart.title) + ".svg"));
    write_file_atomically(written.back(), render_svg(chart));
  }
  return written;
}

}  // namespace qwen
