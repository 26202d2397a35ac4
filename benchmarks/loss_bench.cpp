// Fused dapo::policy_loss vs the composite dapo::reference::policy_loss, forward + backward, float32, token-mean
// with Clip-Higher and dual clip, at 64K, 1M and 4M tokens (rows of 4096 tokens, ragged bool masks, [B] advantages).
// A streaming copy of the bytes the loss must touch, timed in the same run, turns the fused time into a fraction of
// memory bandwidth. Then every token-level loss of the family (verl's loss_mode names) at 1M tokens, fused vs its
// composite, [B, T] advantages and per-token weights (verl's rollout_is_weights).
// Usage: loss_bench [--threads N] [--json PATH]
#include <dapo/loss.hpp>
#include <dapo/reference/loss.hpp>

#include <cstdio>
#include <string>

#include "support/flags.hpp"
#include "support/harness.hpp"

namespace {

struct Batch {
  at::Tensor logp, old_logp, advantages, mask;
};

Batch make_batch(int64_t rows, int64_t cols) {
  Batch b;
  b.old_logp = -at::rand({rows, cols}) * 4.0;
  b.logp = b.old_logp + at::randn({rows, cols}) * 0.3;
  b.advantages = at::randn({rows});
  const auto lengths = at::randint(cols / 4, cols + 1, {rows, 1});
  b.mask = at::arange(cols).unsqueeze(0) < lengths;  // bool
  return b;
}

// One training use: forward, then the gradient with respect to logp.
template <class LossFn>
void forward_backward(const Batch& b, const dapo::PolicyLossOptions& options, LossFn loss_fn,
                      at::Tensor* grad = nullptr, double* loss = nullptr) {
  const auto logp = b.logp.detach().requires_grad_(true);
  const auto out = loss_fn(logp, b.old_logp, b.advantages, b.mask, options);
  out.loss.backward();
  if (grad != nullptr) *grad = logp.grad();
  if (loss != nullptr) *loss = out.loss.template item<double>();
}

}  // namespace

int main(int argc, char** argv) try {
  std::string json_path = "loss_bench.json";
  int threads = 2;
  dapo::bench::Flags flags("loss_bench");
  flags.integer("--threads", threads, 1, "N", "CPU threads")
      .text("--json", json_path, "PATH", "where the JSON record goes");
  if (!flags.parse(argc, argv)) return 0;
  at::set_num_threads(threads);
  at::manual_seed(0);
  const dapo::PolicyLossOptions options{.clip_low = 0.2, .clip_high = 0.28, .dual_clip = 3.0};
  auto fused = [](auto&&... args) { return dapo::policy_loss(args...); };
  auto reference = [](auto&&... args) { return dapo::reference::policy_loss(args...); };

  nlohmann::json record{{"benchmark", "policy_loss forward+backward, float32"}, {"machine", dapo::bench::machine()}};
  std::printf("policy_loss fwd+bwd, float32, token-mean, clip 0.2/0.28, dual clip 3; %s, %d threads\n",
              dapo::bench::cpu_model().c_str(), at::get_num_threads());
  std::printf("%10s %12s %14s %9s %14s %12s %10s\n", "tokens", "fused ms", "reference ms", "speedup", "copy ms",
              "fused/copy", "GB/s");
  for (const int64_t rows : {16, 256, 1024}) {
    constexpr int64_t kCols = 4096;
    const Batch batch = make_batch(rows, kCols);
    // Check first: the fused result must equal the composite's.
    at::Tensor fused_grad, reference_grad;
    double fused_loss = 0, reference_loss = 0;
    forward_backward(batch, options, fused, &fused_grad, &fused_loss);
    forward_backward(batch, options, reference, &reference_grad, &reference_loss);
    dapo::bench::require_close(fused_loss, reference_loss, 1e-5, "loss");
    dapo::bench::require_close(fused_grad, reference_grad, 1e-5, "d loss / d logp");

    const int repeats = rows >= 1024 ? 5 : 20;
    const double fused_s = dapo::bench::best_seconds([&] { forward_backward(batch, options, fused); }, repeats);
    const double reference_s = dapo::bench::best_seconds([&] { forward_backward(batch, options, reference); }, repeats);
    // Bytes the loss must touch: read logp, old_logp (4 B each) and the bool mask (1 B), write the gradient (4 B).
    const int64_t tokens = rows * kCols;
    const int64_t bytes = tokens * (4 + 4 + 1 + 4) + rows * 4;
    const auto source = at::empty({bytes / 2}, at::kByte).fill_(1);  // a copy reads and writes: bytes/2 each way
    auto destination = at::empty_like(source);
    const double copy_s = dapo::bench::best_seconds([&] { destination.copy_(source); }, repeats);
    std::printf("%10lld %12.3f %14.3f %8.1fx %14.3f %11.2fx %10.2f\n", static_cast<long long>(tokens), fused_s * 1e3,
                reference_s * 1e3, reference_s / fused_s, copy_s * 1e3, fused_s / copy_s, bytes / fused_s / 1e9);
    record["rows"].push_back({{"tokens", tokens},
                              {"fused_ms", fused_s * 1e3},
                              {"reference_ms", reference_s * 1e3},
                              {"speedup", reference_s / fused_s},
                              {"copy_ms", copy_s * 1e3},
                              {"copy_bytes", bytes},
                              {"fused_over_copy", fused_s / copy_s},
                              {"fused_effective_GBps", bytes / fused_s / 1e9}});
  }
  // The family at 1M tokens: each token-level loss, with per-token advantages and weights.
  std::printf("\nthe loss family, fwd+bwd, float32, 1,048,576 tokens, [B, T] advantages, per-token weights\n");
  std::printf("%10s %12s %14s %9s\n", "loss", "fused ms", "reference ms", "speedup");
  Batch batch = make_batch(256, 4096);
  batch.advantages = at::randn({256, 4096});
  const auto weights = at::rand({256, 4096}) * 2.0;
  for (const auto& [mode, name] : dapo::kPolicyLossNames) {
    if (!dapo::is_token_level(mode)) continue;
    dapo::PolicyLossOptions family{.aggregation = dapo::LossAggregation::kTokenMean, .mode = mode, .dro_beta = 0.5};
    if (mode == dapo::PolicyLossMode::kVanilla) family.dual_clip = 3.0;
    if (mode == dapo::PolicyLossMode::kDppoTv || mode == dapo::PolicyLossMode::kDppoKl) {
      family.clip_low = 0.05;
      family.clip_high = 0.08;
    }
    auto fused_weighted = [&](auto&&... args) { return dapo::policy_loss(args..., weights); };
    auto reference_weighted = [&](auto&&... args) { return dapo::reference::policy_loss(args..., weights); };
    at::Tensor fused_grad, reference_grad;
    double fused_loss = 0, reference_loss = 0;
    forward_backward(batch, family, fused_weighted, &fused_grad, &fused_loss);
    forward_backward(batch, family, reference_weighted, &reference_grad, &reference_loss);
    dapo::bench::require_close(fused_loss, reference_loss, 1e-5, "loss");
    dapo::bench::require_close(fused_grad, reference_grad, 1e-5, "d loss / d logp");
    const double fused_s = dapo::bench::best_seconds([&] { forward_backward(batch, family, fused_weighted); }, 10);
    const double reference_s =
        dapo::bench::best_seconds([&] { forward_backward(batch, family, reference_weighted); }, 10);
    std::printf("%10s %12.3f %14.3f %8.1fx\n", std::string(name).c_str(), fused_s * 1e3, reference_s * 1e3,
                reference_s / fused_s);
    record["family"].push_back({{"loss", name},
                                {"tokens", 256 * 4096},
                                {"fused_ms", fused_s * 1e3},
                                {"reference_ms", reference_s * 1e3},
                                {"speedup", reference_s / fused_s}});
  }
  dapo::bench::write_json(record, json_path);
  std::printf("wrote %s\n", json_path.c_str());
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "loss_bench: %s\n", error.what());
  return 1;
}
