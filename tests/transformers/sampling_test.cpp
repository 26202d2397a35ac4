// Our sampler against transformers' logits processors (repetition penalty, temperature, top-k, top-p, in the order
// generate() applies them; tests/transformers/references.py): the same kept tokens and renormalised probabilities,
// and draws (the engine's sampler) that follow transformers' probabilities. Shapes: B = rows, V = vocabulary,
// S = tokens seen, N = draws.
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "qwen_gsm8k/engine/sequence_random.hpp"
#include "qwen_gsm8k/model/fused_ops.hpp"
#include "qwen_gsm8k/model/sampling.hpp"
#include "support/shared.hpp"
#include "transformers/references.hpp"

namespace {

struct SamplingCase {
  qwen::SamplingOptions options;
  torch::Tensor logits;                    // [B, V] float32
  torch::Tensor seen;                      // [B, S] int64
  torch::Tensor probs;                     // [B, V] float64: transformers' softmax of the processed scores
  std::vector<std::vector<int64_t>> kept;  // per row, the tokens transformers keeps (finite scores)
  std::string name;
};

torch::Tensor matrix(const nlohmann::json& rows, torch::ScalarType dtype) {
  const auto flat = dapo::test::flatten(rows);
  return torch::tensor(flat, torch::kFloat64)
      .reshape({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows.at(0).size())})
      .to(dtype);
}

std::vector<SamplingCase> read_cases() {
  const auto json = dapo::test::read_reference("sampling_cases.json");
  std::vector<SamplingCase> cases;
  for (const auto& item : json.at("cases")) {
    SamplingCase c;
    c.options.temperature = item.at("temperature");
    c.options.top_k = item.at("top_k");
    c.options.top_p = item.at("top_p");
    c.options.repetition_penalty = item.at("repetition_penalty");
    c.logits = matrix(item.at("logits"), torch::kFloat32);
    c.seen = matrix(item.at("seen"), torch::kInt64);
    c.probs = matrix(item.at("probs"), torch::kFloat64);
    c.kept = item.at("kept").get<std::vector<std::vector<int64_t>>>();
    c.name = item.at("kind").get<std::string>() + " temperature " + std::to_string(c.options.temperature) + " top_k " +
             std::to_string(c.options.top_k) + " top_p " + std::to_string(c.options.top_p) + " repetition_penalty " +
             std::to_string(c.options.repetition_penalty);
    cases.push_back(std::move(c));
  }
  REQUIRE_MESSAGE(!cases.empty(), "sampling_cases.json holds no cases");
  return cases;
}

std::vector<int64_t> finite_tokens(const torch::Tensor& row) {
  const torch::Tensor indices = torch::isfinite(row).nonzero().flatten().contiguous();
  return {indices.data_ptr<int64_t>(), indices.data_ptr<int64_t>() + indices.numel()};
}

// The chi-square value that a statistic with `df` degrees of freedom exceeds with probability 1e-6
// (Wilson-Hilferty: within about 1 % of the exact quantile for df >= 3, and conservative below).
double chi_square_limit(int64_t df) {
  constexpr double z = 4.753;  // the standard normal's 1 - 1e-6 quantile
  const double k = static_cast<double>(df), a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0) + (df < 3 ? 10.0 : 0.0);
}

}  // namespace

TEST_CASE("the logits processors keep the tokens transformers keeps, with its probabilities within 1e-6") {
  const auto cases = read_cases();
  int64_t rows = 0, ties = 0;
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const torch::Tensor scores = qwen::process_logits(c.logits, c.seen, c.options);
    REQUIRE(scores.sizes() == c.logits.sizes());
    for (int64_t b = 0; b < scores.size(0); ++b) {
      CAPTURE(b);
      CHECK(finite_tokens(scores[b]) == c.kept[static_cast<std::size_t>(b)]);
      ++rows;
    }
    const double error = (scores.softmax(-1).to(torch::kFloat64) - c.probs).abs().max().item<double>();
    CHECK(error <= 1e-6);
    if (c.name.rfind("ties", 0) == 0) ++ties;
  }
  MESSAGE(rows << " rows of " << cases.size() << " cases (" << ties << " with crafted ties) compared");
  CHECK(ties > 0);
}

TEST_CASE("our sampler's draws follow transformers' probabilities (chi-square, p = 1e-6) and never a removed token") {
  const auto cases = read_cases();
  constexpr int64_t kDraws = 20000;
  // The engine's sampler (fused::sample_tokens: the inverse of the float32 CDF at each draw's uniform) at one
  // sequence's stream of SplitMix64 uniforms, as the engine draws.
  torch::Tensor uniforms = torch::empty({kDraws}, torch::kFloat32);
  const uint64_t seed = qwen::sequence_seed(20261202, 0);
  float* u = uniforms.data_ptr<float>();
  for (int64_t t = 0; t < kDraws; ++t) u[t] = qwen::sequence_uniform(seed, t);
  int64_t tested = 0;
  for (const auto& c : cases) {
    if (c.kept[0].size() < 2) continue;  // one kept token: nothing to draw
    CAPTURE(c.name);
    const torch::Tensor scores = qwen::process_logits(c.logits, c.seen, c.options);
    // Row 0 of the case N times: N independent draws from one distribution.
    const torch::Tensor rows = scores.narrow(0, 0, 1).expand({kDraws, scores.size(1)}).contiguous();
    const torch::Tensor draws = qwen::fused::sample_tokens(rows, uniforms, 1.0).first;
    const torch::Tensor counts = torch::bincount(draws, {}, scores.size(1)).to(torch::kFloat64);
    const torch::Tensor expected = c.probs[0] * kDraws;
    // Tokens transformers removed are never drawn.
    CHECK(counts.masked_select(c.probs[0] == 0).sum().item<double>() == 0);
    // Bins: every token expected at least 5 times, the rest of the kept tokens pooled into one.
    const torch::Tensor large = expected >= 5;
    double statistic = 0;
    int64_t bins = 0;
    const auto add_bin = [&](double observed, double mean) {
      statistic += (observed - mean) * (observed - mean) / mean;
      ++bins;
    };
    const torch::Tensor observed_large = counts.masked_select(large), expected_large = expected.masked_select(large);
    for (int64_t i = 0; i < observed_large.numel(); ++i) {
      add_bin(observed_large[i].item<double>(), expected_large[i].item<double>());
    }
    const torch::Tensor small = ~large & (c.probs[0] > 0);
    const double pooled_mean = expected.masked_select(small).sum().item<double>();
    if (pooled_mean >= 5) add_bin(counts.masked_select(small).sum().item<double>(), pooled_mean);
    if (bins < 2) continue;
    CAPTURE(bins);
    CAPTURE(statistic);
    CHECK(statistic < chi_square_limit(bins - 1));
    ++tested;
  }
  MESSAGE(tested << " distributions drawn " << kDraws << " times each");
  CHECK(tested >= 10);
}
