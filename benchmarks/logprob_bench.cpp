// dapo::linear_logprobs vs the naive log_softmax(hidden @ weight.T).gather(...), forward + backward (gradients for
// hidden and weight), float32, at N = 2048 tokens, H = 1536, V = 151936 (Qwen2.5-1.5B's lm-head). Reports time and
// peak memory allocated (exact, from a tracking allocator) above what existed before the call. Then counts, per chunk,
// the operators that pass over the chunk's [chunk, V] logits (a RecordFunction callback; matrix products apart), for
// the kernels (CPU here; CUDA's are registered by dapo::cuda) and for the ATen ops that other devices run, in float32
// and bfloat16, with and without the entropy and its gradient.
// Usage: logprob_bench [--threads N] [--json PATH] [--tokens N]
#include <ATen/record_function.h>
#include <dapo/logprob.hpp>

#include <torch/torch.h>

#include <cstdio>
#include <mutex>
#include <set>

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

// Counts the innermost operators (none of their own operators touches the logits) that read or write a tensor of
// exactly chunk x vocab elements with a vocab-long dimension: the passes over one chunk's logits. Views, allocations
// and per-row gathers and scatters (chunk elements) are not passes. Matrix products are counted apart.
class VocabularyPasses {
 public:
  struct Counts {
    int64_t passes = 0, products = 0;
    std::map<std::string, int64_t> by_name;
  };

  VocabularyPasses(int64_t chunk, int64_t vocab) {
    const std::lock_guard<std::mutex> lock(mutex());
    state() = {chunk, vocab, {}};
    at::enableRecordFunction(true);
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&VocabularyPasses::start, &VocabularyPasses::end)
                                        .scopes({at::RecordScope::FUNCTION})
                                        .needsInputs(true)
                                        .needsOutputs(true));
  }
  ~VocabularyPasses() { at::removeCallback(handle_); }
  VocabularyPasses(const VocabularyPasses&) = delete;
  VocabularyPasses& operator=(const VocabularyPasses&) = delete;

  static Counts counts() {
    const std::lock_guard<std::mutex> lock(mutex());
    return state().counts;
  }

 private:
  struct State {
    int64_t chunk = 0, vocab = 0;
    Counts counts;
  };
  struct Frame {
    bool touches = false, child_touches = false;
  };

  static bool spans_logits(const c10::IValue& value) {
    if (!value.isTensor()) return false;
    const at::Tensor& t = value.toTensor();
    if (!t.defined() || t.numel() != state().chunk * state().vocab) return false;
    for (const int64_t size : t.sizes())
      if (size == state().vocab) return true;
    return false;
  }
  static std::unique_ptr<at::ObserverContext> start(const at::RecordFunction& call) {
    const std::lock_guard<std::mutex> lock(mutex());
    bool touches = false;
    for (const c10::IValue& input : call.inputs()) touches = touches || spans_logits(input);
    frames().push_back({touches, false});
    return nullptr;
  }
  static void end(const at::RecordFunction& call, at::ObserverContext* /*context*/) {
    const std::lock_guard<std::mutex> lock(mutex());
    if (frames().empty()) return;
    Frame frame = frames().back();
    frames().pop_back();
    for (const c10::IValue& output : call.outputs()) frame.touches = frame.touches || spans_logits(output);
    const std::string name = call.name();
    if (not_a_pass(name)) return;  // nor does it make its caller's work a pass
    const bool product = name == "aten::mm" || name == "aten::addmm" || name == "aten::addmm_";
    if (!frames().empty()) frames().back().child_touches |= frame.touches || frame.child_touches || product;
    if (product) {
      ++state().counts.products;
      ++state().counts.by_name[name];
    } else if (frame.touches && !frame.child_touches) {
      ++state().counts.passes;
      ++state().counts.by_name[name];
    }
  }
  // Views, allocations, no-op conversions, and the per-row gathers and scatters.
  static bool not_a_pass(const std::string& name) {
    static const std::set<std::string> kNames = {
        "aten::empty",   "aten::empty_like",   "aten::empty_strided", "aten::as_strided",   "aten::view",
        "aten::narrow",  "aten::slice",        "aten::select",        "aten::unsqueeze",    "aten::squeeze",
        "aten::t",       "aten::transpose",    "aten::expand",        "aten::alias",        "aten::detach",
        "aten::reshape", "aten::_unsafe_view", "aten::contiguous",    "aten::to",           "aten::resize_",
        "aten::gather",  "aten::scatter_",     "aten::scatter",       "aten::scatter_add_", "aten::lift_fresh",
        "aten::conj",    "aten::resolve_conj", "aten::resolve_neg"};
    return kNames.count(name) != 0;
  }
  static std::vector<Frame>& frames() {
    thread_local std::vector<Frame> value;
    return value;
  }
  static State& state() {
    static State value;
    return value;
  }
  static std::mutex& mutex() {
    static std::mutex value;
    return value;
  }
  at::CallbackHandle handle_;
};

std::string names(const std::map<std::string, int64_t>& by_name, int64_t chunks) {
  std::string out;
  for (const auto& [name, count] : by_name) {
    if (count == 0) continue;
    if (!out.empty()) out += ", ";
    out += name + (count == chunks ? "" : " x" + std::to_string(count / chunks));
  }
  return out;
}

// Passes per chunk, forward and backward, over two chunks of `chunk` rows at the bench's V (H cut to 64: the passes
// over [chunk, V] do not depend on it, the bfloat16 products on this CPU do).
nlohmann::json count_passes(int64_t chunk, int64_t vocab, at::ScalarType dtype, bool aten, bool with_entropy,
                            bool entropy_gradient) {
  constexpr int64_t kChunks = 2, kHidden = 64;
  const auto hidden = (at::randn({kChunks * chunk, kHidden}) * 0.5).to(dtype).requires_grad_(true);
  const auto weight = (at::randn({vocab, kHidden}) * 0.02).to(dtype).requires_grad_(true);
  const auto targets = at::randint(vocab, {kChunks * chunk}, at::kLong);
  const dapo::LinearLogprobOptions options{.chunk_size = chunk, .with_entropy = with_entropy};
  VocabularyPasses::Counts forward, backward;
  {
    const VocabularyPasses counter(chunk, vocab);
    const auto out = dapo::detail::linear_logprobs_unchecked(hidden, weight, targets, options, aten);
    forward = VocabularyPasses::counts();
    auto objective = out.logp.sum();
    if (entropy_gradient) objective = objective + out.entropy.sum();
    objective.backward();
    backward = VocabularyPasses::counts();
  }
  backward.passes -= forward.passes;
  backward.products -= forward.products;
  for (const auto& [name, count] : forward.by_name) backward.by_name[name] -= count;
  const std::string path = aten ? "ATen ops" : "kernels";
  const std::string entropy = !with_entropy ? "no entropy" : entropy_gradient ? "entropy, its gradient" : "entropy";
  std::printf("%-9s %-9s %-22s %8.1f %8.1f %9.1f %9.1f   forward: %s; backward: %s\n", path.c_str(),
              c10::toString(dtype), entropy.c_str(), static_cast<double>(forward.passes) / kChunks,
              static_cast<double>(backward.passes) / kChunks, static_cast<double>(forward.products) / kChunks,
              static_cast<double>(backward.products) / kChunks, names(forward.by_name, kChunks).c_str(),
              names(backward.by_name, kChunks).c_str());
  return {{"path", path},
          {"dtype", c10::toString(dtype)},
          {"entropy", entropy},
          {"forward_passes_per_chunk", static_cast<double>(forward.passes) / kChunks},
          {"backward_passes_per_chunk", static_cast<double>(backward.passes) / kChunks},
          {"forward_products_per_chunk", static_cast<double>(forward.products) / kChunks},
          {"backward_products_per_chunk", static_cast<double>(backward.products) / kChunks}};
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
  constexpr int64_t kHidden = 1536, kVocab = 151936;
  // The counts first: the tracking allocator, installed below, does not serve the bfloat16 products' raw allocations.
  nlohmann::json passes = nlohmann::json::array();
  constexpr int64_t kCountChunk = 256;
  std::printf("passes over one chunk's [%lld, V] logits, per chunk (matrix products apart), V = %lld:\n",
              static_cast<long long>(kCountChunk), static_cast<long long>(kVocab));
  std::printf("%-9s %-9s %-22s %8s %8s %9s %9s   operators\n", "path", "dtype", "entropy", "fwd", "bwd", "fwd mm",
              "bwd mm");
  for (const bool aten : {false, true}) {
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      for (const auto& [with_entropy, entropy_gradient] : {std::pair{false, false}, {true, false}, {true, true}}) {
        passes.push_back(count_passes(kCountChunk, kVocab, dtype, aten, with_entropy, entropy_gradient));
      }
    }
  }
  std::printf("\n");
  auto& memory = dapo::bench::TrackingAllocator::install();
  at::manual_seed(0);
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
                        {"vocab", kVocab},
                        {"passes", passes}};
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
