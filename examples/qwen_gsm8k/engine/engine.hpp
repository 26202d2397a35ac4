// The generation engine: continuous batching over a fixed pool of sequence slots, as serving engines (vLLM, SGLang)
// schedule. Requests (a prompt, n samples, a seed) come from a source as slots free up; a prompt is prefilled once
// and its keys and values are forked into its n slots; every step decodes all live slots; a finished sequence is
// handed to the sink and its slot is refilled at the next check. Whether a sequence has finished is read from the
// device every check_every steps, not every token. The sink may stop the run (streaming dynamic sampling): what is
// still in flight is dropped and counted.
//
// Each sequence draws from its own generator (sequence_random.hpp), so its tokens depend on its request's seed, its
// sample index and its logits only: greedy output is the same for any pool size, and sampled output too wherever the
// logits come out bit for bit the same (batch composition can change BLAS's summation order; rollout_bench measures
// how often).
//
// Shapes: S = slots (max_num_seqs), R = live rows, N = max_new_tokens, V = vocabulary, C = slot capacity.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "qwen_gsm8k/model/model.hpp"
#include "qwen_gsm8k/model/sampling.hpp"

namespace qwen {

// The engine's profiler scopes (RECORD_USER_SCOPE; free unless LibTorch's profiler is on): an admission (prefills,
// forks, first tokens), one decode step (a graph replay where graphs are on), a check of the finished flags.
// benchmarks/profile_bench attributes the device's kernels to them.
inline constexpr const char* kAdmitScope = "qwen::engine_admit";
inline constexpr const char* kDecodeStepScope = "qwen::engine_decode_step";
inline constexpr const char* kCheckScope = "qwen::engine_check";

struct EngineRequest {
  std::vector<int64_t> prompt;
  int64_t n = 1;      // samples of this prompt
  uint64_t seed = 0;  // sample i draws from sequence_seed(seed, i)
};

enum class FinishReason { kStop, kLength };
const char* finish_reason_name(FinishReason reason);  // "stop", "length" (vLLM's and OpenAI's names)

struct EngineSequence {
  int64_t request = 0;          // the request's index in the order the source gave them
  int64_t sample = 0;           // in [0, n)
  std::vector<int64_t> tokens;  // generated, the stop token included
  std::vector<float> logprobs;  // log softmax(logits / temperature) of each token; empty unless return_logprobs
  FinishReason finish_reason = FinishReason::kLength;
};

struct EngineOptions {
  int64_t max_num_seqs = 64;      // slots (vLLM's name)
  int64_t max_prompt_tokens = 0;  // the longest prompt a slot takes; capacity = this + max_new_tokens
  int64_t max_new_tokens = 256;
  std::vector<int64_t> stop_ids;  // a sequence ends after emitting any of these (kept in its tokens)
  SamplingOptions sampling;
  bool return_logprobs = false;
  // Read the finished flags from the device every check_every decode steps (one host synchronisation), and at once
  // when a sequence reaches max_new_tokens. A sequence that stops between checks runs at most check_every - 1 steps
  // more: at most that many wasted rows per sequence.
  int64_t check_every = 8;
  bool shared_prefill = true;  // one prefill per request, forked into its n slots; false: one per sequence
  bool continuous = true;      // false: static batches (a batch is admitted when the pool is empty; for comparison)
  // On CUDA, each decode step runs as a CUDA graph (vLLM's and SGLang's decode): its shape, the live rows rounded up to
  // a power of two (at most max_num_seqs) and the attended window to a power of two from 64 (at most the capacity),
  // is run eagerly once, captured the next time and replayed after (engine/decode_graphs.hpp). Padding rows are free
  // slots whose results nobody reads. Elsewhere, or off: eager steps at the exact shapes.
  bool cuda_graphs = true;
  // Tests and benchmarks: decode at the rounded shapes the graphs replay, with or without graphs, on any device.
  bool graph_shapes = false;
  // Benchmarks and tests only: sequence (request, sample) stops after this many tokens as if it had emitted a stop
  // token there (random weights never stop); 0 or unset: no forced stop. Noticed at checks, as real stops are.
  std::function<int64_t(int64_t request, int64_t sample)> oracle_length;

  void validate() const;  // throws std::invalid_argument naming the option
};

struct EngineStats {
  int64_t decode_calls = 0;   // model forwards of one token per live row
  int64_t rows_computed = 0;  // rows over all decode calls (what a step's matrix products have; padding included)
  int64_t prefill_calls = 0;
  int64_t prefill_rows = 0;    // prompts prefilled
  int64_t prefill_tokens = 0;  // of those prompts (padding not counted)
  int64_t checks = 0;          // reads of the finished flags (host synchronisations)
  int64_t sequences = 0;       // handed to the sink
  int64_t useful_tokens = 0;   // their tokens
  int64_t dropped = 0;         // in flight when the sink stopped the run
  int64_t requests = 0;        // taken from the source
  int64_t cache_bytes = 0;     // the slot pool's key/value buffers
  int64_t graph_captures = 0;  // decode-step shapes captured as CUDA graphs
  int64_t graph_replays = 0;   // decode steps run as a graph replay
};

// The next request, or nullopt when there is none now: the source is asked again at the next check, and the run ends
// when it has none and no sequence is in flight. Called only when a slot is free for it.
using RequestSource = std::function<std::optional<EngineRequest>()>;
// Takes each finished sequence; returns false to stop the run (sequences in flight are dropped).
using SequenceSink = std::function<bool(EngineSequence&&)>;

class GenerationEngine {
 public:
  GenerationEngine(Qwen2ForCausalLM& model, EngineOptions options);
  // Generates until the source is empty and every sequence is handed over, or the sink says stop. Under NoGradGuard;
  // autocast as the caller set it. Throws std::invalid_argument for a bad request (naming its index).
  EngineStats run(const RequestSource& source, const SequenceSink& sink);
  const EngineOptions& options() const { return options_; }

 private:
  Qwen2ForCausalLM model_;
  EngineOptions options_;
};

// Every request's sequences, [request][sample], with max_prompt_tokens taken from the requests when it is 0.
std::vector<std::vector<EngineSequence>> generate_requests(Qwen2ForCausalLM& model,
                                                           const std::vector<EngineRequest>& requests,
                                                           EngineOptions options, EngineStats* stats = nullptr);

}  // namespace qwen
