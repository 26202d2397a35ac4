// The report a user opens after training: line charts of the run as standalone SVG (no plotting library, no
// JavaScript) and one self-contained report.html with the charts inline, the run's summary and its evaluations.
// Not a logger: the trainer writes metrics.jsonl / eval.jsonl; this file only reads and draws them.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace qwen {

struct ChartSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x = step, y); non-finite points are skipped when drawn
};

struct Chart {
  std::string title, x_label, y_label;
  std::vector<ChartSeries> series;
};

// A standalone SVG document (no XML declaration, no element ids, so it can also be inlined in HTML any number of
// times): a title, a legend, axes with "nice" ticks and labels, one polyline per series in distinct colours, with
// markers when a series has few points. A chart without a finite point says "no data"; a series without one is
// listed in the legend as "(no data)"; a constant series gets a range around its value. Text is XML-escaped.
// `width` x `height` is the size with one legend row; each further row of the legend adds to the height, so every
// chart keeps the same plot area. Throws std::invalid_argument when width < 240 or height < 160.
std::string render_svg(const Chart& chart, int width = 640, int height = 320);

// The charts of a run, all against "step" (a row without a finite "step" uses its index in the list):
//   reward          sampled/score/mean and every reward/<function> field
//   accuracy        sampled/accuracy per step, eval accuracy, eval pass@k when the eval rows have pass_at_k
//   response length sampled/response_length/mean and /max
//   entropy (actor/entropy), clip fractions (actor/pg_clipfrac, actor/pg_clipfrac_lower), approx KL (actor/ppo_kl),
//   learning rate (actor/lr), gradient norm (actor/grad_norm), generation rounds (train/num_gen_batches),
//   groups (dapo/kept_groups, dapo/filtered_groups)
// Missing, non-numeric and non-finite values are skipped; series with no point at all are left out, but every chart
// is always returned (in this order), so a run always has the same plot files.
std::vector<Chart> training_charts(const std::vector<nlohmann::json>& metrics,
                                   const std::vector<nlohmann::json>& evals);

// Runs side by side: for each run directory (eval.jsonl, metrics.jsonl; summary.json or report's settings name it as
// "<algorithm> seed <seed>" when present, else the directory's name; a name already taken gets the directory's name
// added), one series per run of held-out greedy accuracy
// and one of sampled training accuracy, against steps: two charts. A run without a file has no series there.
std::vector<Chart> comparison_charts(const std::vector<std::filesystem::path>& runs);
// Writes the comparison charts to output_dir/<slug>.svg (held-out-greedy-accuracy.svg, sampled-training-accuracy.svg),
// atomically; returns the paths.
std::vector<std::filesystem::path> write_comparison(const std::filesystem::path& output_dir,
                                                    const std::vector<std::filesystem::path>& runs);

// Writes output_dir/report.html (self-contained: inline SVGs, CSS, a table of `summary` with nested objects
// flattened to dotted keys, a table of the eval rows) and output_dir/plots/<slug>.svg per chart of training_charts,
// e.g. plots/reward.svg. Creates the directories; each file is written to "<name>.tmp" and renamed, so a reader
// never sees half a file. Throws std::runtime_error naming the path on an I/O failure.
void write_report(const std::filesystem::path& output_dir, const std::vector<nlohmann::json>& metrics,
                  const std::vector<nlohmann::json>& evals, const nlohmann::json& summary);

}  // namespace qwen
