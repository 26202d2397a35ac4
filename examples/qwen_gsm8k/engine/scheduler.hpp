// The generation engine's scheduler, as nano-vllm's scheduler with its sequence's state: which requests take the free
// slots and which of them need a prefill, the shape of the next decode step, when a check is due, which sequences have
// finished and when they are handed over, and how the live ones are packed back into slots [0, rows). All decided on
// host facts alone, without a tensor, so that it is tested with a fake step and no model
// (tests/qwen/scheduler_test.cpp). The model runner (model_runner.hpp) carries each decision out on the device; the
// loop (engine.cpp) hands one to the other.
//
// Shapes: S = slots (max_num_seqs), R = live rows, C = slot capacity (max_prompt_tokens + max_new_tokens).
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "qwen_gsm8k/engine/request.hpp"

namespace qwen {

struct SchedulerOptions {
  int64_t max_num_seqs = 64, max_prompt_tokens = 0, max_new_tokens = 256;
  int64_t vocab_size = 0;       // prompts' ids must lie in [0, vocab_size)
  bool shared_prefill = true;   // one prefill per request, forked into its n slots
  bool continuous = true;       // false: static batches (a batch is admitted when the pool is empty)
  bool rounded_shapes = false;  // decode at the CUDA graphs' shapes: rows and window rounded up to powers of two

  int64_t capacity() const { return max_prompt_tokens + max_new_tokens; }
};

// One live sequence's host facts: everything the loop decides from without reading the device.
struct Sequence {
  int64_t request = 0, sample = 0, prompt_length = 0;
  int64_t generated = 0;  // tokens sampled so far; the last one is fed by the next decode step
  int64_t budget = 0;     // its request's max_tokens, or max_new_tokens
  bool released = false;  // static batches: finished and on its way to the sink, computed until its batch ends
};

// What one admission decided: new sequences in consecutive slots after the live ones, the prompts to prefill now, and
// the prefills kept for a request's later samples or let go.
struct Admission {
  struct Placed {
    int64_t slot = 0, request = 0, sample = 0;
    const EngineRequest* source = nullptr;  // its request: valid until the next admission
    int64_t prefill_row = -1;               // its row of this admission's prefill; -1: its request's kept prefill
  };
  struct Keep {
    int64_t request = 0, prefill_row = 0, prompt_length = 0;
  };
  std::vector<Placed> placed;
  std::vector<const std::vector<int64_t>*> prefill;  // the prompts to prefill now, in row order
  std::vector<Keep> keep;        // a half-admitted request's prefill row, kept for its later samples
  std::vector<int64_t> release;  // requests whose last samples were placed: their kept prefill is no longer needed
  int64_t longest_prompt = 0;    // of the placed sequences
  bool empty() const { return placed.empty(); }
};

// The shape of one decode step: rows [0, rows) over positions [0, window). `live` of the rows are sequences; the rest,
// with rounded shapes, are free slots whose results nobody reads, and their positions must be reset first when
// reset_padding is set (they advance at most max_new_tokens - 1 steps between checks, so every index stays in range).
struct StepShape {
  int64_t live = 0, rows = 0, window = 0;
  bool reset_padding = false;
};

// A sequence the device's flags say has finished: its row, its tokens' count, why.
struct Finished {
  int64_t row = 0, length = 0;
  FinishReason reason = FinishReason::kLength;
};

// A finished sequence released from its slot, on its way to the sink: its request and sample, its tokens' count, why.
struct Released {
  int64_t request = 0, sample = 0, length = 0;
  FinishReason reason = FinishReason::kLength;
};

// Slot to[i] takes slot from[i]'s state and positions [0, width) (live rows moved into freed slots below them).
struct Compaction {
  std::vector<int64_t> to, from;
  int64_t width = 0;
  bool empty() const { return to.empty(); }
};

class Scheduler {
 public:
  // `stats`: the run's counts the scheduler keeps (requests, decode calls, rows computed, checks, sequences, useful
  // tokens, dropped).
  Scheduler(SchedulerOptions options, const RequestSource& source, EngineStats& stats);

  // Fills the free slots from the requests waiting and the source (asked only while a slot is free); the placed
  // sequences are live from now on, each with its first token counted (it comes from the prefill's logits). Empty
  // with static batches while a batch runs. Throws std::invalid_argument for a bad request, naming its index.
  Admission admit();

  bool idle() const { return rows_.empty(); }
  int64_t rows() const { return static_cast<int64_t>(rows_.size()); }  // live (and, in static batches, handed over)
  // A live sequence has reached max_new_tokens: the check is due now.
  bool at_budget() const;
  StepShape next_step();
  void stepped(const StepShape& shape);  // every live row has one more token

  // The check: the live rows' finished flags (finished_at[r], the index of row r's first stop token, or -1) read from
  // the device. The rows that have finished and are not released yet, in (request, sample) order.
  std::vector<Finished> finished(const std::vector<int64_t>& finished_at);
  const Sequence& row(int64_t row) const { return rows_[static_cast<std::size_t>(row)]; }
  // The check's finished rows leave the pool (compact() frees their slots; static batches compute them until their
  // batch ends). They reach the sink a step later, through hand_over, when their outputs have come to the host.
  std::vector<Released> release(const std::vector<Finished>& done);
  // After a check that released sequences: whether one decode step of the rows left can run before they are handed
  // over (the copy of their outputs to the host runs under it). None when no row is left or one is at max_new_tokens.
  bool step_before_hand_over() const { return !idle() && !at_budget(); }
  void hand_over(const Released& sequence);  // given to the sink
  void stopped();  // the sink stopped the run: what is live or released and not handed over counts as dropped
  // After a check: with static batches the finished batch is cleared; otherwise the live rows are packed into
  // slots [0, live) and the moves returned for the device to make.
  Compaction compact();

 private:
  struct Pending {  // a request some of whose samples wait for slots
    int64_t index = 0;
    EngineRequest request;
    int64_t next = 0;   // samples [next, n) are not placed yet
    bool kept = false;  // its prefill is kept for its later samples (the shared prefill)
  };
  bool pull();  // the source's next request, checked; false when it has none now

  SchedulerOptions options_;
  const RequestSource& source_;
  EngineStats& stats_;
  std::vector<Sequence> rows_;  // the live sequences, row r in slot r
  std::deque<Pending> waiting_;
  bool reset_padding_ = true;  // an admission or a release since the last step: the padding rows' state is stale
  int64_t unhanded_ = 0;       // released and not handed over yet
};

}  // namespace qwen
