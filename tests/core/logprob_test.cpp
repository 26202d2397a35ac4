// The row kernels behind linear_logprobs: softmax statistics and the in-place logits gradient, at every SIMD width,
// against a double-precision evaluation; NaN logits give NaN statistics, as torch.logsumexp does.
#include <dapo/core/logprob.hpp>

#include <random>
#include <vector>

#include "support/shared.hpp"

namespace {

struct Reference {
  std::vector<double> lse, mean, grad;  // grad [R, V] of sum(g_logp * logp + g_entropy * entropy)
};

Reference reference(const std::vector<double>& z, int64_t rows, int64_t vocab, const std::vector<int64_t>& targets,
                    const std::vector<double>& g_logp, const std::vector<double>& g_entropy) {
  Reference out;
  out.grad.resize(z.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = z.data() + r * vocab;
    double max = row[0];
    for (int64_t j = 1; j < vocab; ++j) max = std::max(max, row[j]);
    double sum = 0, weighted = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      sum += std::exp(row[j] - max);
      weighted += std::exp(row[j] - max) * row[j];
    }
    const double lse = max + std::log(sum), mean = weighted / sum;
    out.lse.push_back(lse);
    out.mean.push_back(mean);
    for (int64_t j = 0; j < vocab; ++j) {
      const double p = std::exp(row[j] - lse);
      out.grad[r * vocab + j] = g_logp[r] * ((j == targets[r]) - p) - g_entropy[r] * p * (row[j] - mean);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("softmax_statistics and logprob_logits_grad match double precision at every SIMD width") {
  std::mt19937_64 rng(8);
  std::normal_distribution<double> normal;
  const int64_t rows = 5, vocab = 1003;  // a ragged tail for every width
  std::vector<double> z(rows * vocab);
  for (auto& value : z) value = 3.0 * normal(rng);
  std::vector<int64_t> targets{0, 17, 1002, 500, 3};
  std::vector<double> g_logp, g_entropy;
  for (int64_t r = 0; r < rows; ++r) {
    g_logp.push_back(normal(rng));
    g_entropy.push_back(normal(rng));
  }
  const Reference expected = reference(z, rows, vocab, targets, g_logp, g_entropy);

  std::vector<int> widths{1};
  for (const int lanes : {4, 8, 16}) {
    if (lanes <= dapo::simd::widest_float_lanes()) widths.push_back(lanes);
  }
  for (const int lanes : widths) {
    CAPTURE(lanes);
    std::vector<float> logits(z.begin(), z.end());
    std::vector<float> lse(rows), chosen(rows), mean(rows);
    dapo::core::softmax_statistics<float>(logits.data(), rows, vocab, targets.data(), lse.data(), chosen.data(),
                                          mean.data(), dapo::core::SerialFor{}, lanes);
    for (int64_t r = 0; r < rows; ++r) {
      CHECK(dapo::test::close(lse[r], expected.lse[r], 1e-6, 1e-6));
      CHECK(dapo::test::close(mean[r], expected.mean[r], 1e-5, 1e-5));
      CHECK(chosen[r] == logits[r * vocab + targets[r]]);
    }
    const std::vector<float> gl(g_logp.begin(), g_logp.end()), ge(g_entropy.begin(), g_entropy.end());
    dapo::core::logprob_logits_grad<float>(logits.data(), rows, vocab, targets.data(), lse.data(), mean.data(),
                                           gl.data(), ge.data(), dapo::core::SerialFor{}, lanes);
    double error = 0, norm = 0;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      error += (logits[i] - expected.grad[i]) * (logits[i] - expected.grad[i]);
      norm += expected.grad[i] * expected.grad[i];
    }
    CHECK(std::sqrt(error / norm) < 1e-5);
  }

  // Double runs one value at a time and agrees to rounding.
  std::vector<double> lse(rows), chosen(rows), mean(rows);
  dapo::core::softmax_statistics<double>(z.data(), rows, vocab, targets.data(), lse.data(), chosen.data(), mean.data());
  for (int64_t r = 0; r < rows; ++r) CHECK(dapo::test::close(lse[r], expected.lse[r], 1e-12));
}

TEST_CASE("softmax_statistics: NaN logits give a NaN log-sum-exp") {
  std::vector<float> logits(40, 1.0f);
  logits[13] = std::nanf("");
  const std::vector<int64_t> targets{0};
  float lse = 0, chosen = 0;
  dapo::core::softmax_statistics<float>(logits.data(), 1, 40, targets.data(), &lse, &chosen,
                                        static_cast<float*>(nullptr));
  CHECK(std::isnan(lse));
}
