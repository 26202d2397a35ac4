// dapo::linear_logprobs vs the naive log_softmax(hidden @ weight.T).gather(...), forward + backward (gradients for
// hidden and weight), float32, at N = 2048 tokens, H = 1536, V = 151936 (Qwen2.5-1.5B's lm-head). Reports time and
// peak memory allocated (exact, from a tracking allocator) above what existed before the call.
// Usage: logprob_bench [--threads N] [--json PATH] [--tokens N]
#include <dapo/logprob.hpp>

#include <torch/torch.h>

#include <cstdio>

#include "support/flags.hpp"
#include "support/harness.hpp"
#include "support/tracking_allocator.hpp"

namespace {

struct Run {
  double seconds = 0;
  int64_t peak_bytes = 0;    // peak allocation during the call, above the bytes live before it
  int64_t output_bytes = 0;  // logp + grad_hidden + grad_weight: what any implementation must return
  at::Tensor logp, grad_hidden, grad_weight;
};

Run forward_backward(bool chunked, int64_t chunk_size, const at::Tensor& hidden0, const at::Tensor& weight0,
                     const at::Tensor& targets, dapo::bench::TrackingAllocator& memory) {
  auto hidden = hidden0.detach().requires_grad_(true);
  auto weight = weight0.detach().requires_grad_(true);
  Run run;
  memory.reset_peak();
  const int64_t before = memory.live_bytes();
  const auto start = std::chrono::steady_clock::now();
  at::Tensor logp;
  if (chunked) {
    logp = dapo::linear_logprobs(hidden, weight, targets, {.chunk_size = chunk_size}).logp;
  } else {
    logp = torch::log_softmax(torch::matmul(hidden, weight.t()), -1).gather(1, targets.unsqueeze(1)).squeeze(1);
  }
  logp.sum().backward();
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.peak_bytes = memory.peak_bytes() - before;
  run.logp = logp.detach();
  run.grad_hidden = hidden.grad();
  run.grad_weight = weight.grad();
  run.output_bytes = (run.logp.numel() + run.grad_hidden.numel() + run.grad_weight.numel()) * 4;
  return run;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string json_path = "logprob_bench.json";
  int threads = 2;
  int64_t tokens = 2048;
  dapo::bench::Flags flags("logprob_bench");
  flags.integer("--threads", threads, 1, "N", "CPU threads")
      .text("--json", json_path, "PATH", "where the JSON record goes")
      .integer("--tokens", tokens, 1, "N", "tokens (rows of hidden)");
  if (!flags.parse(argc, argv)) return 0;
  at::set_num_threads(threads);
  auto& memory = dapo::bench::TrackingAllocator::install();
  at::manual_seed(0);
  constexpr int64_t kHidden = 1536, kVocab = 151936;
  const auto hidden = at::randn({tokens, kHidden}) * 0.5;
  const auto weight = at::randn({kVocab, kHidden}) * 0.02;
  const auto targets = at::randint(kVocab, {tokens}, at::kLong);

  std::printf("linear_logprobs fwd+bwd vs naive, float32, N=%lld H=%lld V=%lld; %s, %d threads\n",
              static_cast<long long>(tokens), static_cast<long long>(kHidden), static_cast<long long>(kVocab),
              dapo::bench::cpu_model().c_str(), at::get_num_threads());
  const Run naive = forward_backward(false, 0, hidden, weight, targets, memory);
  nlohmann::json record{{"benchmark", "linear_logprobs forward+backward, float32"},
                        {"machine", dapo::bench::machine()},
                        {"tokens", tokens},
                        {"hidden", kHidden},
                        {"vocab", kVocab}};
  auto report = [&](const std::string& name, const Run& run) {
    const double workspace = static_cast<double>(run.peak_bytes - run.output_bytes);
    const double naive_workspace = static_cast<double>(naive.peak_bytes - naive.output_bytes);
    std::printf("%-22s %9.2f s %8.2fx %11.2f GiB %8.3fx %14.2f GiB %8.3fx\n", name.c_str(), run.seconds,
                run.seconds / naive.seconds, run.peak_bytes / 1073741824.0,
                static_cast<double>(run.peak_bytes) / naive.peak_bytes, workspace / 1073741824.0,
                workspace / naive_workspace);
    record["runs"].push_back({{"name", name},
                              {"seconds", run.seconds},
                              {"time_vs_naive", run.seconds / naive.seconds},
                              {"peak_extra_bytes", run.peak_bytes},
                              {"peak_vs_naive", static_cast<double>(run.peak_bytes) / naive.peak_bytes},
                              {"workspace_bytes", run.peak_bytes - run.output_bytes},
                              {"workspace_vs_naive", workspace / naive_workspace}});
  };
  std::printf("%-22s %11s %9s %15s %9s %18s %9s\n", "path", "time", "vs naive", "peak extra", "vs naive",
              "peak - outputs", "vs naive");
  report("naive", naive);
  for (const int64_t chunk : {1024, 256}) {
    const Run chunked = forward_backward(true, chunk, hidden, weight, targets, memory);
    dapo::bench::require_close(chunked.logp, naive.logp, 1e-5, "logp");
    dapo::bench::require_close(chunked.grad_hidden, naive.grad_hidden, 1e-4, "grad hidden");
    dapo::bench::require_close(chunked.grad_weight, naive.grad_weight, 1e-4, "grad weight");
    report("chunked, chunk " + std::to_string(chunk), chunked);
  }
  std::printf(
      "peak extra: allocated during fwd+bwd above what was live before; peak - outputs: the same less\n"
      "logp, grad_hidden and grad_weight (%.2f GiB), which every implementation returns.\n",
      naive.output_bytes / 1073741824.0);
  dapo::bench::write_json(record, json_path);
  std::printf("wrote %s\n", json_path.c_str());
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "logprob_bench: %s\n", error.what());
  return 1;
}
