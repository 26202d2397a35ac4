// What goes into the generation engine and what comes out of it, without a tensor: a request (a prompt, n samples, a
// seed), a finished sequence, the run's counts, and the source and sink the engine's caller gives it. The scheduler
// (scheduler.hpp) works on these alone; the model runner (model_runner.hpp) turns them into tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace qwen {

struct EngineRequest {
  std::vector<int64_t> prompt;
  int64_t n = 1;      // samples of this prompt
  uint64_t seed = 0;  // sample i draws from sequence_seed(seed, i)
  // This request's token budget (vLLM's SamplingParams.max_tokens), at most the engine's max_new_tokens; 0: that.
  // A sequence that reaches it ends with finish_reason "length", noticed at the next check as a stop is (the budget
  // alone does not make the host wait: up to check_every - 1 more rows are computed and discarded).
  int64_t max_tokens = 0;
};

enum class FinishReason { kStop, kLength };
// "stop", "length" (vLLM's and OpenAI's names)
inline const char* finish_reason_name(FinishReason reason) {
  return reason == FinishReason::kStop ? "stop" : "length";
}

struct EngineSequence {
  int64_t request = 0;            // the request's index in the order the source gave them
  int64_t sample = 0;             // in [0, n)
  std::vector<int64_t> tokens{};  // generated, the stop token included
  std::vector<float> logprobs{};  // log softmax(logits / temperature) of each token; empty unless return_logprobs
  FinishReason finish_reason = FinishReason::kLength;
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
  int64_t host_reads = 0;      // device -> host reads (model/host_door.hpp): the host's waits for the device on a GPU
  int64_t host_fetches = 0;    // device -> host copies taken a step later, without a wait for the device's queue
  int64_t host_copies = 0;     // host -> device copies
};

// The next request, or nullopt when there is none now: the source is asked again at the next check, and the run ends
// when it has none and no sequence is in flight. Called only when a slot is free for it.
using RequestSource = std::function<std::optional<EngineRequest>()>;
// Takes each finished sequence; returns false to stop the run (sequences in flight are dropped).
using SequenceSink = std::function<bool(EngineSequence&&)>;

}  // namespace qwen
