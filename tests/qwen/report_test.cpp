// qwen::render_svg, training_charts, write_report and write_comparison: every SVG is checked by a real renderer
// (rsvg-convert, skipped with a message when it is not installed), escaping, skipped non-finite values, edge cases
// (no data, one step, constant values, extreme ranges) and the errors that name the path. read_json_lines is tested
// with the other common/ helpers in common_test.cpp.
#include "qwen_gsm8k/report/report.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/files.hpp"
#include "support/qwen_fixtures.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

using dapo::test::contains;
using dapo::test::read_file;
using dapo::test::write_file;

std::size_t count(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

bool have_rsvg_convert() {
  static const bool found = std::system("command -v rsvg-convert > /dev/null 2>&1") == 0;
  return found;
}

// Renders the SVG file to PNG with rsvg-convert (a strict XML parser) and checks a PNG came out. Skips, with a
// message, where rsvg-convert is not installed (apt-get install librsvg2-bin).
void check_renders(const fs::path& svg_file) {
  if (!have_rsvg_convert()) {
    MESSAGE("skipped: rsvg-convert not on PATH (apt-get install librsvg2-bin), " << svg_file.filename().string()
                                                                                 << " not rendered");
    return;
  }
  fs::path png = svg_file;
  png += ".png";
  const std::string command = "rsvg-convert -o '" + png.string() + "' '" + svg_file.string() + "'";
  INFO("command: " << command);
  CHECK(std::system(command.c_str()) == 0);
  REQUIRE(fs::exists(png));
  const std::string bytes = read_file(png);
  REQUIRE(bytes.size() > 8);
  CHECK(bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
}

void check_svg_renders(const std::string& svg, const fs::path& dir, const std::string& name) {
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(contains(svg, "</svg>"));
  CHECK_FALSE(contains(svg, "nan"));
  CHECK_FALSE(contains(svg, "inf"));
  write_file(dir / (name + ".svg"), svg);
  check_renders(dir / (name + ".svg"));
}

// `steps` training steps with every field the trainer writes, shaped like a run that learns.
std::vector<json> synthetic_metrics(int steps) {
  std::vector<json> rows;
  for (int step = 1; step <= steps; ++step) {
    const double t = static_cast<double>(step) / steps;
    rows.push_back({{"step", step},
                    {"sampled/score/mean", -0.5 + 1.2 * t},
                    {"sampled/score/std", 0.4},
                    {"reward/correctness", 0.2 + 0.6 * t},
                    {"reward/digit", 0.1},
                    {"reward/format", 0.5 + 0.3 * t},
                    {"reward/mark", 0.05},
                    {"reward/overlong", -0.2 * (1 - t)},
                    {"sampled/accuracy", 0.3 + 0.4 * t},
                    {"sampled/response_length/mean", 180.0 - 40 * t},
                    {"sampled/response_length/max", 512},
                    {"sampled/truncated_fraction", 0.1 * (1 - t)},
                    {"actor/entropy", 0.9 - 0.3 * t},
                    {"actor/pg_clipfrac", 0.02 + 0.01 * std::sin(step)},
                    {"actor/pg_clipfrac_lower", 0.001},
                    {"actor/ppo_kl", 1e-4 * (1 + t)},
                    {"actor/grad_norm", 1.3},
                    {"train/num_gen_batches", 2},
                    {"dapo/kept_groups", 16},
                    {"dapo/filtered_groups", 4},
                    {"perf/rollout_tokens_per_second", 5400.0},
                    {"perf/update_tokens_per_second", 12000.0},
                    {"timing_s/step", 10.4},
                    {"actor/lr", 1e-6},
                    {"actor/pg_loss", 0.01}});
  }
  return rows;
}

const qwen::Chart* find_chart(const std::vector<qwen::Chart>& charts, const std::string& title) {
  const auto found =
      std::find_if(charts.begin(), charts.end(), [&](const auto& chart) { return chart.title == title; });
  return found == charts.end() ? nullptr : &*found;
}

std::vector<std::string> series_names(const qwen::Chart& chart) {
  std::vector<std::string> names;
  for (const auto& series : chart.series) names.push_back(series.name);
  return names;
}

}  // namespace

TEST_CASE("render_svg: a small chart renders, names every series, escapes text, skips non-finite points") {
  dapo::test::ScratchDir dir;
  const qwen::Chart chart{"Reward <total> & parts",
                          "step",
                          "reward",
                          {{"policy <a> & b", {{1, 0.1}, {2, kNaN}, {3, 0.35}, {4, 0.5}}},
                           {"second", {{1, -0.2}, {kInf, 0.3}, {2, 0.0}, {3, -kInf}, {4, 0.25}}},
                           {"empty", {}}}};
  const std::string svg = qwen::render_svg(chart);
  check_svg_renders(svg, dir.path(), "small");

  CHECK(contains(svg, "Reward &lt;total&gt; &amp; parts"));
  CHECK(contains(svg, "policy &lt;a&gt; &amp; b"));
  CHECK_FALSE(contains(svg, "<a>"));
  CHECK(contains(svg, ">second<"));
  CHECK(contains(svg, ">empty (no data)<"));
  CHECK(count(svg, "<polyline") == 2);  // the empty series draws nothing
  // Few points: a marker per finite point (3 + 3), plus one per legend entry with data (2).
  CHECK(count(svg, "<circle") == 8);
  // Step ticks are whole numbers; reward ticks cover [-0.2, 0.5] in steps of 0.2.
  CHECK(contains(svg, ">1</text>"));
  CHECK(contains(svg, ">4</text>"));
  CHECK_FALSE(contains(svg, ">1.5</text>"));
  CHECK(contains(svg, ">-0.2</text>"));
  CHECK(contains(svg, ">0.0</text>"));
  CHECK(contains(svg, ">0.6</text>"));
  CHECK_FALSE(contains(svg, ">0.5</text>"));

  // Many points: lines only.
  qwen::ChartSeries dense{"dense", {}};
  for (int i = 0; i < 200; ++i) dense.points.emplace_back(i, std::sin(i * 0.1));
  const std::string dense_svg = qwen::render_svg({"Dense", "step", "y", {dense}});
  CHECK(count(dense_svg, "<circle") == 0);
  check_svg_renders(dense_svg, dir.path(), "dense");

  CHECK_THROWS_AS(qwen::render_svg(chart, 100, 320), std::invalid_argument);
  CHECK_THROWS_AS(qwen::render_svg(chart, 640, 10), std::invalid_argument);
}

TEST_CASE("render_svg: no series, empty series, one point, constant values, extreme ranges, a long legend") {
  dapo::test::ScratchDir dir;
  const std::string none = qwen::render_svg({"Nothing", "step", "y", {}});
  CHECK(contains(none, ">no data<"));
  check_svg_renders(none, dir.path(), "none");

  const std::string all_nan = qwen::render_svg({"All NaN", "step", "y", {{"a", {{1, kNaN}, {kNaN, 2}}}}});
  CHECK(contains(all_nan, ">no data<"));
  CHECK(contains(all_nan, ">a (no data)<"));
  check_svg_renders(all_nan, dir.path(), "all_nan");

  const std::string single = qwen::render_svg({"One step", "step", "accuracy", {{"train", {{7, 0.25}}}}});
  CHECK(count(single, "<circle") == 2);  // the point and its legend marker
  CHECK(count(single, "<polyline") == 0);
  CHECK(contains(single, ">7</text>"));
  check_svg_renders(single, dir.path(), "single");

  const std::string constant =
      qwen::render_svg({"Constant", "step", "y", {{"zero", {{1, 0}, {2, 0}, {3, 0}}}, {"zero too", {{1, 0}}}}});
  CHECK_FALSE(contains(constant, ">no data<"));
  check_svg_renders(constant, dir.path(), "constant");

  const std::string constant_nonzero =
      qwen::render_svg({"Constant 512", "step", "tokens", {{"max", {{1, 512}, {2, 512}}}}});
  CHECK(contains(constant_nonzero, ">500</text>"));
  check_svg_renders(constant_nonzero, dir.path(), "constant_nonzero");

  // Tiny values get exponent labels that stay distinct; huge ones too; the whole double range does not overflow.
  const std::string tiny = qwen::render_svg({"Tiny", "step", "kl", {{"kl", {{0, 1e-9}, {1, 3e-9}, {2, 2e-9}}}}});
  CHECK(contains(tiny, "e-09</text>"));
  check_svg_renders(tiny, dir.path(), "tiny");
  const std::string huge = qwen::render_svg(
      {"Huge",
       "step",
       "y",
       {{"h", {{0.5, -std::numeric_limits<double>::max()}, {1.5, std::numeric_limits<double>::max()}}}}});
  check_svg_renders(huge, dir.path(), "huge");

  qwen::Chart many{"Many series", "step", "y", {}};
  for (int i = 0; i < 14; ++i) many.series.push_back({"series number " + std::to_string(i), {{0, i}, {1, i + 1.0}}});
  const std::string many_svg = qwen::render_svg(many);
  CHECK(contains(many_svg, "stroke-dasharray"));      // past ten colours the lines dash
  CHECK_FALSE(contains(many_svg, "height=\"320\""));  // extra legend rows make it taller
  check_svg_renders(many_svg, dir.path(), "many");

  // Text that is not valid XML on its own: control characters and a stray byte.
  const std::string odd = qwen::render_svg({std::string("bell\x07 and \xff byte"), "step", "y", {{"a", {{0, 1}}}}});
  CHECK_FALSE(contains(odd, "\x07"));
  check_svg_renders(odd, dir.path(), "odd_text");
}

TEST_CASE("training_charts: series per field, missing and non-finite values skipped, pass@k named by k") {
  std::vector<json> metrics = synthetic_metrics(5);
  metrics[1].erase("actor/entropy");
  metrics[2]["actor/entropy"] = kNaN;
  metrics[3]["actor/entropy"] = "high";  // not a number: skipped
  metrics[4].erase("step");              // falls back to its index
  metrics[0]["reward/length"] = 0.25;    // an extra reward function appears after the known ones
  const std::vector<json> evals = {{{"step", 0}, {"accuracy", 0.2}, {"pass_at_k", 0.5}, {"k", 8}},
                                   {{"step", 5}, {"accuracy", 0.4}, {"pass_at_k", 0.7}, {"k", 8}}};
  const auto charts = qwen::training_charts(metrics, evals);

  std::vector<std::string> titles;
  for (const auto& chart : charts) titles.push_back(chart.title);
  CHECK(titles == std::vector<std::string>{"Reward", "Accuracy", "Response length", "Entropy", "Clip fractions",
                                           "Approx KL", "Learning rate", "Gradient norm", "Generation rounds",
                                           "Groups"});

  const auto* reward = find_chart(charts, "Reward");
  REQUIRE(reward != nullptr);
  CHECK(series_names(*reward) ==
        std::vector<std::string>{"total", "correctness", "digit", "format", "mark", "overlong", "length"});
  CHECK(reward->series[0].points.size() == 5);
  CHECK(reward->series[6].points.size() == 1);

  const auto* accuracy = find_chart(charts, "Accuracy");
  REQUIRE(accuracy != nullptr);
  CHECK(series_names(*accuracy) == std::vector<std::string>{"train (sampled)", "eval (greedy)", "eval pass@8"});
  CHECK(accuracy->series[1].points == std::vector<std::pair<double, double>>{{0, 0.2}, {5, 0.4}});

  const auto* entropy = find_chart(charts, "Entropy");
  REQUIRE(entropy != nullptr);
  REQUIRE(entropy->series.size() == 1);
  const auto& points = entropy->series[0].points;
  REQUIRE(points.size() == 2);  // steps 1 and 5; 2 missing, 3 NaN, 4 a string
  CHECK(points[0].first == 1);
  CHECK(points[1].first == 4);  // no "step" in the fifth row: its index

  const auto* clipping = find_chart(charts, "Clip fractions");
  REQUIRE(clipping != nullptr);
  CHECK(series_names(*clipping) == std::vector<std::string>{"clipped", "dual-clipped"});
  const auto* groups = find_chart(charts, "Groups");
  REQUIRE(groups != nullptr);
  CHECK(series_names(*groups) == std::vector<std::string>{"kept", "filtered (all agree)"});
  CHECK(groups->series[1].points.front() == std::pair<double, double>{1, 4});
  CHECK(find_chart(charts, "Learning rate")->series.at(0).points.size() == 5);

  // Different k per row: the name cannot say one k. No metrics at all: every chart still there, without series.
  const auto mixed = qwen::training_charts(
      {}, {{{"step", 1}, {"pass_at_k", 0.5}, {"k", 4}}, {{"step", 2}, {"pass_at_k", 0.6}, {"k", 8}}});
  CHECK(mixed.size() == 10);
  CHECK(series_names(*find_chart(mixed, "Accuracy")) == std::vector<std::string>{"eval pass@k"});
  CHECK(find_chart(mixed, "Reward")->series.empty());
}

TEST_CASE("write_report: report.html and plots/*.svg for a 30-step run; all render; summary and escaping") {
  dapo::test::ScratchDir dir;
  const fs::path out = dir.path() / "run" / "report";  // neither exists yet
  const std::vector<json> metrics = synthetic_metrics(30);
  const std::vector<json> evals = {
      {{"step", 0}, {"accuracy", 0.42}, {"problems", 200}},
      {{"step", 10}, {"accuracy", 0.5}, {"pass_at_k", 0.71}, {"k", 8}, {"problems", 200}},
      {{"step", 30}, {"accuracy", 0.61}, {"pass_at_k", 0.83}, {"k", 8}, {"problems", 200}}};
  const json summary = {{"sft_accuracy", 0.42},
                        {"final_accuracy", 0.61},
                        {"wall_seconds", 312.5},
                        {"note", "a < b & c > d"},
                        {"settings", {{"lr", 1e-6}, {"group_size", 8}, {"model", "Qwen2.5-0.5B-Instruct"}}}};
  qwen::write_report(out, metrics, evals, summary);

  const fs::path html_path = out / "report.html";
  REQUIRE(fs::exists(html_path));
  const std::string html = read_file(html_path);
  CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(contains(html, "30 training steps (steps 1 to 30), 3 evaluations."));
  CHECK(contains(html, ">0.42<"));
  CHECK(contains(html, ">0.61<"));
  CHECK(contains(html, ">312.5<"));
  CHECK(contains(html, ">settings.lr<"));
  CHECK(contains(html, ">1e-06<"));
  CHECK(contains(html, ">Qwen2.5-0.5B-Instruct<"));
  CHECK(contains(html, "a &lt; b &amp; c &gt; d"));
  CHECK_FALSE(contains(html, "a < b"));
  CHECK(contains(html, ">pass_at_k<"));
  CHECK(contains(html, ">0.83<"));
  CHECK_FALSE(contains(html, "<script"));
  CHECK_FALSE(contains(html, "src="));  // nothing external

  std::vector<fs::path> plots;
  for (const auto& entry : fs::directory_iterator(out / "plots")) plots.push_back(entry.path());
  std::sort(plots.begin(), plots.end());
  std::vector<std::string> names;
  for (const auto& plot : plots) names.push_back(plot.filename().string());
  CHECK(names == std::vector<std::string>{"accuracy.svg", "approx-kl.svg", "clip-fractions.svg", "entropy.svg",
                                          "generation-rounds.svg", "gradient-norm.svg", "groups.svg",
                                          "learning-rate.svg", "response-length.svg", "reward.svg"});
  CHECK(count(html, "<svg ") == plots.size());  // each inline too
  for (const auto& plot : plots) {
    const std::string svg = read_file(plot);
    CHECK(contains(html, svg));  // the inline copy is the file
    CHECK_FALSE(contains(svg, "no data"));
    check_renders(plot);
  }
  CHECK(contains(read_file(out / "plots" / "accuracy.svg"), ">eval pass@8<"));

  // Writing again replaces the files and leaves no temporaries behind.
  qwen::write_report(out, metrics, evals, summary);
  for (const auto& entry : fs::recursive_directory_iterator(out)) {
    CHECK_MESSAGE(entry.path().extension() != ".tmp", entry.path().string());
  }
}

TEST_CASE("write_comparison: one series per run, named by algorithm and seed, rendered") {
  dapo::test::ScratchDir dir;
  const fs::path dapo_run = dir.path() / "a", grpo_run = dir.path() / "b", bare = dir.path() / "bare";
  for (const auto& run : {dapo_run, grpo_run, bare}) fs::create_directories(run);
  auto write = [](const fs::path& path, const std::string& text) { std::ofstream(path) << text; };
  write(dapo_run / "summary.json", R"({"algorithm": "dapo", "seed": 1})");
  write(dapo_run / "eval.jsonl", "{\"step\": 0, \"accuracy\": 0.6}\n{\"step\": 5, \"accuracy\": 0.8}\n");
  write(dapo_run / "metrics.jsonl", "{\"step\": 1, \"sampled/accuracy\": 0.4}\n");
  write(grpo_run / "summary.json", R"({"algorithm": "grpo", "seed": 1})");
  write(grpo_run / "eval.jsonl", "{\"step\": 0, \"accuracy\": 0.6}\n{\"step\": 5, \"accuracy\": 0.7}\n");
  write(bare / "eval.jsonl", "{\"step\": 0, \"accuracy\": 0.1}\n");

  const auto charts = qwen::comparison_charts({dapo_run, grpo_run, bare});
  REQUIRE(charts.size() == 2);
  const auto twice = qwen::comparison_charts({grpo_run, grpo_run});
  CHECK(twice[0].series[1].name == "grpo seed 1 (b)");
  REQUIRE(charts[0].series.size() == 3);
  CHECK(charts[0].series[0].name == "dapo seed 1");
  CHECK(charts[0].series[1].name == "grpo seed 1");
  CHECK(charts[0].series[2].name == "bare");
  CHECK(charts[0].series[1].points.back() == std::pair<double, double>{5.0, 0.7});
  REQUIRE(charts[1].series.size() == 1);  // only the first run has metrics
  const auto written = qwen::write_comparison(dir.path() / "out", {dapo_run, grpo_run, bare});
  REQUIRE(written.size() == 2);
  CHECK(written[0].filename() == "held-out-greedy-accuracy.svg");
  for (const auto& path : written) check_renders(path);
  CHECK(contains(read_file(written[0]), "grpo seed 1"));
}

TEST_CASE("write_report: empty run, a single step, constant values; an unwritable directory names the path") {
  dapo::test::ScratchDir dir;
  qwen::write_report(dir.path() / "empty", {}, {}, json());
  const std::string empty_html = read_file(dir.path() / "empty" / "report.html");
  CHECK(contains(empty_html, "No training steps recorded"));
  CHECK(contains(empty_html, "No summary recorded."));
  CHECK(contains(empty_html, "No evaluations recorded."));
  for (const auto& entry : fs::directory_iterator(dir.path() / "empty" / "plots")) check_renders(entry.path());

  qwen::write_report(dir.path() / "single", synthetic_metrics(1), {{{"step", 1}, {"accuracy", 0.5}}},
                     {{"final_accuracy", 0.5}});
  CHECK(contains(read_file(dir.path() / "single" / "report.html"), "1 training step (step 1), 1 evaluation."));
  for (const auto& entry : fs::directory_iterator(dir.path() / "single" / "plots")) check_renders(entry.path());

  std::vector<json> constant;
  for (int step = 0; step < 10; ++step)
    constant.push_back({{"step", step}, {"sampled/score/mean", 1.0}, {"actor/entropy", 0.0}});
  qwen::write_report(dir.path() / "constant", constant, {}, {{"values", json::array({1, 2})}});
  for (const auto& entry : fs::directory_iterator(dir.path() / "constant" / "plots")) check_renders(entry.path());

  // A file where the directory should be.
  write_file(dir.path() / "occupied", "x");
  try {
    qwen::write_report(dir.path() / "occupied", {}, {}, json());
    FAIL("expected std::runtime_error");
  } catch (const std::runtime_error& error) {
    CHECK(contains(error.what(), (dir.path() / "occupied").string()));
  }
}
