// The engine's loop, as nano-vllm's llm_engine: the scheduler decides (scheduler.hpp), the model runner does it on the
// device (model_runner.hpp). Admit (prefill, fork, first token), decode all live slots until a check is due; at the
// check, read the finished flags (the one wait), queue the finished rows' outputs for the host and compact the pool;
// decode one step while those outputs come back, hand them over, admit again.
#include "qwen_gsm8k/engine/engine.hpp"

#include <ATen/record_function.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "qwen_gsm8k/engine/model_runner.hpp"
#include "qwen_gsm8k/engine/scheduler.hpp"
#include "qwen_gsm8k/model/host_door.hpp"

namespace qwen {

void EngineOptions::validate() const {
  sampling.validate();
  const auto positive = [](int64_t value, const char* name) {
    if (value <= 0) {
      throw std::invalid_argument(std::string("engine: ") + name + " is " + std::to_string(value) + ", expected > 0");
    }
  };
  positive(max_num_seqs, "max_num_seqs");
  positive(max_prompt_tokens, "max_prompt_tokens");
  positive(max_new_tokens, "max_new_tokens");
  positive(check_every, "check_every");
}

namespace {

SchedulerOptions scheduler_options(const EngineOptions& options, int64_t vocab_size, bool rounded_shapes) {
  return {.max_num_seqs = options.max_num_seqs,
          .max_prompt_tokens = options.max_prompt_tokens,
          .max_new_tokens = options.max_new_tokens,
          .vocab_size = vocab_size,
          .shared_prefill = options.shared_prefill,
          .continuous = options.continuous,
          .rounded_shapes = rounded_shapes};
}

class Run {
 public:
  Run(ModelRunner& runner, const EngineOptions& options, const RunOptions& run, int64_t vocab_size,
      const RequestSource& source, const SequenceSink& sink)
      : options_(options),
        run_(run),
        sink_(sink),
        runner_(runner),
        scheduler_(scheduler_options(options, vocab_size, runner_.rounded_shapes()), source, stats_) {}

  EngineStats run() {
    torch::NoGradGuard no_grad;
    const host_door::Counts start = host_door::counts();
    runner_.begin(stats_, run_);
    // A compute copy computes in autocast's dtype itself: autocast's float32 policies would cast its activations up.
    const AutocastOff autocast_off(runner_.device(), runner_.has_compute_copy());
    const int64_t captures = runner_.graph_captures(), replays = runner_.graph_replays();
    admit();
    int64_t since_check = 0;  // decode steps
    while (!scheduler_.idle()) {
      for (; since_check < options_.check_every && !scheduler_.at_budget(); ++since_check) decode();
      Handover handover = check();
      since_check = 0;
      if (!handover.released.empty() && scheduler_.step_before_hand_over()) {
        decode();
        since_check = 1;
      }
      if (!hand_over(handover)) break;
      admit();
    }
    runner_.end();
    stats_.graph_captures = runner_.graph_captures() - captures;
    stats_.graph_replays = runner_.graph_replays() - replays;
    stats_.host_reads = host_door::counts().reads - start.reads;
    stats_.host_fetches = host_door::counts().fetches - start.fetches;
    stats_.host_copies = host_door::counts().copies - start.copies;
    return stats_;
  }

 private:
  void admit() {
    const Admission admission = scheduler_.admit();
    if (admission.empty()) return;
    RECORD_USER_SCOPE(kAdmitScope);  // the profile's admissions: those that place sequences
    runner_.admit(admission);
  }

  void decode() {
    RECORD_USER_SCOPE(kDecodeStepScope);
    const StepShape shape = scheduler_.next_step();
    runner_.decode(shape);
    scheduler_.stepped(shape);
  }

  struct Handover {  // the sequences a check released, in (request, sample) order, and their outputs' fetch
    std::vector<Released> released;
    ModelRunner::Outputs outputs;
  };

  // Reads the finished flags (the check's one wait), queues the finished rows' tokens and log-probs for the host,
  // releases those rows and compacts the pool (after the gather, in the device's order).
  Handover check() {
    RECORD_USER_SCOPE(kCheckScope);
    const std::vector<Finished> done = scheduler_.finished(runner_.finished_flags(scheduler_.rows()));
    Handover handover;
    if (!done.empty()) {
      std::vector<int64_t> rows;
      for (const Finished& d : done) rows.push_back(d.row);
      handover.outputs = runner_.fetch_outputs(rows);
      handover.released = scheduler_.release(done);
    }
    runner_.move(scheduler_.compact());
    return handover;
  }

  // Gives the released sequences to the sink in order, their outputs taken from the host when their copy has run.
  // False when the sink stopped the run.
  bool hand_over(Handover& handover) {
    if (handover.released.empty()) return true;
    const torch::Tensor tokens = handover.outputs.tokens.get(), logprobs = handover.outputs.logprobs.get();
    for (std::size_t i = 0; i < handover.released.size(); ++i) {
      const Released& done = handover.released[i];
      EngineSequence sequence{.request = done.request, .sample = done.sample, .finish_reason = done.reason};
      const int64_t* ids = tokens[static_cast<int64_t>(i)].data_ptr<int64_t>();
      sequence.tokens.assign(ids, ids + done.length);
      if (logprobs.defined()) {
        const float* values = logprobs[static_cast<int64_t>(i)].data_ptr<float>();
        sequence.logprobs.assign(values, values + done.length);
      }
      scheduler_.hand_over(done);
      if (!sink_(std::move(sequence))) {
        scheduler_.stopped();
        return false;
      }
    }
    return true;
  }

  const EngineOptions& options_;
  const RunOptions& run_;
  const SequenceSink& sink_;
  EngineStats stats_;
  ModelRunner& runner_;
  Scheduler scheduler_;
};

}  // namespace

GenerationEngine::GenerationEngine(Qwen2ForCausalLM& model, EngineOptions options,
                                   std::shared_ptr<GraphRecorder> recorder)
    : model_(model), options_(std::move(options)), recorder_(std::move(recorder)) {
  options_.validate();
}

GenerationEngine::~GenerationEngine() = default;

EngineStats GenerationEngine::run(const RequestSource& source, const SequenceSink& sink) {
  return run(source, sink, {.sampling = options_.sampling, .return_logprobs = options_.return_logprobs});
}

EngineStats GenerationEngine::run(const RequestSource& source, const SequenceSink& sink, const RunOptions& sampling) {
  sampling.sampling.validate();
  // Keys and values in the dtype the projections produce: autocast's when it is on, else the weights'.
  const torch::Device device = model_->lm_head_weight().device();
  const torch::ScalarType dtype = active_autocast_dtype(device).value_or(model_->lm_head_weight().scalar_type());
  if (!runner_ || runner_->cache_dtype() != dtype) {
    runner_.reset();  // the old pool goes before the new one is made
    runner_ = std::make_unique<ModelRunner>(model_, options_, dtype, recorder_);
  }
  return Run(*runner_, options_, sampling, model_->config().vocab_size, source, sink).run();
}

int64_t GenerationEngine::kept_bytes() const {
  return runner_ ? runner_->kept_bytes() : 0;
}

std::vector<std::vector<EngineSequence>> generate_requests(Qwen2ForCausalLM& model,
                                                           const std::vector<EngineRequest>& requests,
                                                           EngineOptions options, EngineStats* stats) {
  if (options.max_prompt_tokens == 0) {
    for (const auto& request : requests) {
      options.max_prompt_tokens =
          std::max<int64_t>(options.max_prompt_tokens, static_cast<int64_t>(request.prompt.size()));
    }
  }
  GenerationEngine engine(model, std::move(options));
  return generate_requests(engine, requests, stats);
}

std::vector<std::vector<EngineSequence>> generate_requests(GenerationEngine& engine,
                                                           const std::vector<EngineRequest>& requests,
                                                           EngineStats* stats,
                                                           const std::optional<RunOptions>& sampling) {
  std::vector<std::vector<EngineSequence>> out(requests.size());
  for (std::size_t r = 0; r < requests.size(); ++r) {
    out[r].resize(static_cast<std::size_t>(std::max<int64_t>(requests[r].n, 0)));
  }
  std::size_t next = 0;
  const RequestSource source = [&]() -> std::optional<EngineRequest> {
    if (next == requests.size()) return std::nullopt;
    return requests[next++];
  };
  const SequenceSink sink = [&](EngineSequence&& sequence) {
    out[static_cast<std::size_t>(sequence.request)][static_cast<std::size_t>(sequence.sample)] = std::move(sequence);
    return true;
  };
  const EngineStats result = sampling ? engine.run(source, sink, *sampling) : engine.run(source, sink);
  if (stats != nullptr) *stats = result;
  return out;
}

}  // namespace qwen
