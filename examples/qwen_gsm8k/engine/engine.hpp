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
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qwen_gsm8k/engine/request.hpp"
#include "qwen_gsm8k/model/model.hpp"
#include "qwen_gsm8k/model/sampling.hpp"

namespace qwen {

// The engine's profiler scopes (RECORD_USER_SCOPE; free unless LibTorch's profiler is on): an admission (prefills,
// forks, first tokens), one decode step (a graph replay where graphs are on), a check of the finished flags.
// benchmarks/profile_bench attributes the device's kernels to them.
inline constexpr const char* kAdmitScope = "qwen::engine_admit";
inline constexpr const char* kDecodeStepScope = "qwen::engine_decode_step";
inline constexpr const char* kCheckScope = "qwen::engine_check";

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

  void validate() const;  // throws std::invalid_argument naming the option
};

// What may change from one run of an engine to the next: how it samples (vLLM takes these per request; here per run,
// so that one engine, its pool and its graphs serve a training run's rollouts and its greedy evaluations alike).
struct RunOptions {
  SamplingOptions sampling;
  bool return_logprobs = false;
  bool operator==(const RunOptions&) const = default;
};

class ModelRunner;
class GraphRecorder;

// One engine serves any number of runs: its model runner (the slot pool, the per-slot state, the compute copy of the
// weights and the decode step's CUDA graphs) is made by the first run and kept, so a training run that keeps its engine
// captures each step shape once and later rollouts only replay (vLLM's engine keeps its graphs the same way). The
// runner is made anew only when a run's autocast dtype differs from the pool's.
class GenerationEngine {
 public:
  // `recorder`: how decode steps are captured as graphs (null: CUDA graphs where the build and device have them);
  // tests give one that records on the CPU.
  GenerationEngine(Qwen2ForCausalLM& model, EngineOptions options, std::shared_ptr<GraphRecorder> recorder = nullptr);
  ~GenerationEngine();
  GenerationEngine(const GenerationEngine&) = delete;
  GenerationEngine& operator=(const GenerationEngine&) = delete;
  GenerationEngine(GenerationEngine&&) = delete;  // the runner refers to the engine's options
  GenerationEngine& operator=(GenerationEngine&&) = delete;

  // Generates until the source is empty and every sequence is handed over, or the sink says stop, sampling as the
  // options say (or as `sampling` says). Under NoGradGuard; autocast as the caller set it. Throws std::invalid_argument
  // for a bad request (naming its index) or bad sampling settings. A run of other sampling settings than earlier runs
  // captures its own graphs (the settings are constants of the step's kernels).
  EngineStats run(const RequestSource& source, const SequenceSink& sink);
  EngineStats run(const RequestSource& source, const SequenceSink& sink, const RunOptions& sampling);
  const EngineOptions& options() const { return options_; }
  // What the kept runner holds on the device between runs: the slot pool and the compute copy (0 before a run).
  int64_t kept_bytes() const;

 private:
  Qwen2ForCausalLM model_;
  EngineOptions options_;
  std::shared_ptr<GraphRecorder> recorder_;
  std::unique_ptr<ModelRunner> runner_;
};

// Every request's sequences, [request][sample], with max_prompt_tokens taken from the requests when it is 0.
std::vector<std::vector<EngineSequence>> generate_requests(Qwen2ForCausalLM& model,
                                                           const std::vector<EngineRequest>& requests,
                                                           EngineOptions options, EngineStats* stats = nullptr);
// The same through a kept engine (its max_prompt_tokens must hold every prompt), sampling as `sampling` says when
// given, else as the engine's options say.
std::vector<std::vector<EngineSequence>> generate_requests(GenerationEngine& engine,
                                                           const std::vector<EngineRequest>& requests,
                                                           EngineStats* stats = nullptr,
                                                           const std::optional<RunOptions>& sampling = std::nullopt);

}  // namespace qwen
