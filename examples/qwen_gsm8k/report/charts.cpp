// training_charts: which fields of metrics.jsonl and eval.jsonl make which chart of a run.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "qwen_gsm8k/report/markup.hpp"
#include "qwen_gsm8k/report/report.hpp"
#include "qwen_gsm8k/report/series.hpp"

namespace qwen {
namespace {

using detail::finite_field;
using detail::series_of;
using nlohmann::json;

void add_if_any(Chart& chart, ChartSeries series) {
  if (!series.points.empty()) chart.series.push_back(std::move(series));
}

// The reward functions the rows report, as the part of "reward/<name>" after the prefix: the GSM8K ones in a fixed
// order, then any others alphabetically.
std::vector<std::string> reward_functions(const std::vector<json>& metrics) {
  std::vector<std::string> names = {"correctness", "digit", "format", "mark", "overlong"};
  std::vector<std::string> others;
  for (const json& row : metrics) {
    if (!row.is_object()) continue;
    for (const auto& [key, value] : row.items()) {
      if (key.rfind("reward/", 0) != 0 || !value.is_number()) continue;
      const std::string name = key.substr(7);
      if (name.empty()) continue;
      if (std::find(names.begin(), names.end(), name) == names.end() &&
          std::find(others.begin(), others.end(), name) == others.end()) {
        others.push_back(name);
      }
    }
  }
  std::sort(others.begin(), others.end());
  names.insert(names.end(), others.begin(), others.end());
  return names;
}

// "eval pass@8" when every row that has pass_at_k says the same k; "eval pass@k" otherwise.
std::string pass_at_k_name(const std::vector<json>& evals) {
  std::optional<double> common_k;
  bool same = true;
  for (const json& row : evals) {
    if (!finite_field(row, "pass_at_k")) continue;
    const auto k = finite_field(row, "k");
    if (!k || (common_k && *common_k != *k)) {
      same = false;
      break;
    }
    common_k = k;
  }
  if (!same || !common_k) return "eval pass@k";
  return "eval pass@" + detail::general(*common_k);
}

}  // namespace

std::vector<Chart> training_charts(const std::vector<nlohmann::json>& metrics,
                                   const std::vector<nlohmann::json>& evals) {
  std::vector<Chart> charts;

  Chart reward{"Reward", "step", "mean reward per sampled response", {}};
  add_if_any(reward, series_of(metrics, "sampled/score/mean", "total"));
  for (const std::string& name : reward_functions(metrics)) {
    add_if_any(reward, series_of(metrics, "reward/" + name, name));
  }
  charts.push_back(std::move(reward));

  Chart accuracy{"Accuracy", "step", "fraction correct", {}};
  add_if_any(accuracy, series_of(metrics, "sampled/accuracy", "train (sampled)"));
  add_if_any(accuracy, series_of(evals, "accuracy", "eval (greedy)"));
  add_if_any(accuracy, series_of(evals, "pass_at_k", pass_at_k_name(evals)));
  charts.push_back(std::move(accuracy));

  Chart length{"Response length", "step", "tokens", {}};
  add_if_any(length, series_of(metrics, "sampled/response_length/mean", "mean"));
  add_if_any(length, series_of(metrics, "sampled/response_length/max", "max"));
  charts.push_back(std::move(length));

  Chart entropy{"Entropy", "step", "mean token entropy (nats)", {}};
  add_if_any(entropy, series_of(metrics, "actor/entropy", "entropy"));
  charts.push_back(std::move(entropy));

  Chart clipping{"Clip fractions", "step", "fraction of response tokens", {}};
  add_if_any(clipping, series_of(metrics, "actor/pg_clipfrac", "clipped"));
  add_if_any(clipping, series_of(metrics, "actor/pg_clipfrac_lower", "dual-clipped"));
  charts.push_back(std::move(clipping));

  Chart kl{"Approx KL", "step", "mean of old_logp - logp", {}};
  add_if_any(kl, series_of(metrics, "actor/ppo_kl", "approx KL"));
  charts.push_back(std::move(kl));

  Chart lr{"Learning rate", "step", "lr of the step's last update", {}};
  add_if_any(lr, series_of(metrics, "actor/lr", "lr"));
  charts.push_back(std::move(lr));

  Chart grad_norm{"Gradient norm", "step", "mean over the step's updates, before clipping", {}};
  add_if_any(grad_norm, series_of(metrics, "actor/grad_norm", "grad norm"));
  charts.push_back(std::move(grad_norm));

  Chart rounds{"Generation rounds", "step", "rounds of dynamic sampling", {}};
  add_if_any(rounds, series_of(metrics, "train/num_gen_batches", "rounds"));
  charts.push_back(std::move(rounds));

  Chart groups{"Groups", "step", "prompts (groups)", {}};
  add_if_any(groups, series_of(metrics, "dapo/kept_groups", "kept"));
  add_if_any(groups, series_of(metrics, "dapo/filtered_groups", "filtered (all agree)"));
  charts.push_back(std::move(groups));
  return charts;
}

}  // namespace qwen
