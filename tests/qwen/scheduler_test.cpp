// The engine's scheduler with no model: a fake device that mirrors each slot's decode state, where sequence
// (request, sample) emits its stop token as its length(request, sample)-th token, drives it through the engine's loop
// (admit; decode until a check is due; release what finished and compact; one more step; hand over; admit).
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "qwen_gsm8k/engine/scheduler.hpp"

namespace {

using Length = std::function<int64_t(int64_t request, int64_t sample)>;

struct Slot {  // what the model runner holds per slot, reduced to what finishing needs
  int64_t request = -1, sample = -1, generated = 0, finished_at = -1;
};

struct Trace {
  std::vector<qwen::EngineSequence> handed;  // in hand-over order
  std::vector<qwen::Admission> admissions;   // the non-empty ones (their `source` pointers are stale afterwards)
  std::vector<qwen::StepShape> steps;
  int64_t checks = 0, stopped_after = -1;
  std::vector<int64_t> steps_at_hand_over, steps_at_admission;  // decode steps run before each
  qwen::EngineStats stats;
};

struct FakeRun {
  qwen::SchedulerOptions options;
  std::vector<qwen::EngineRequest> requests;
  Length length{};
  int64_t check_every = 4;
  std::function<bool(const qwen::EngineSequence&)> keep_going = [](const qwen::EngineSequence&) { return true; };

  Trace run() {
    Trace trace;
    std::size_t next = 0;
    const qwen::RequestSource source = [&]() -> std::optional<qwen::EngineRequest> {
      if (next == requests.size()) return std::nullopt;
      return requests[next++];
    };
    qwen::Scheduler scheduler(options, source, trace.stats);
    std::vector<Slot> slots(static_cast<std::size_t>(options.max_num_seqs));
    const auto admit = [&] {
      const qwen::Admission admission = scheduler.admit();
      if (admission.empty()) return;
      for (const auto& placed : admission.placed) {
        REQUIRE(placed.slot < options.max_num_seqs);
        const int64_t stop = length(placed.request, placed.sample);
        slots[static_cast<std::size_t>(placed.slot)] = {placed.request, placed.sample, 1, stop == 1 ? 0 : -1};
      }
      trace.admissions.push_back(admission);
      trace.steps_at_admission.push_back(static_cast<int64_t>(trace.steps.size()));
    };
    const auto step = [&] {
      const qwen::StepShape shape = scheduler.next_step();
      if (shape.reset_padding) {  // as the model runner resets the padding rows' token indices (and positions)
        for (int64_t r = shape.live; r < shape.rows; ++r) slots[static_cast<std::size_t>(r)].generated = 0;
      }
      for (int64_t r = 0; r < shape.rows; ++r) {  // the padding rows step too; their results are read by nobody
        Slot& slot = slots[static_cast<std::size_t>(r)];
        CHECK(slot.generated < options.max_new_tokens);  // the token index the step writes stays in the row
        ++slot.generated;
        if (r < shape.live && slot.finished_at < 0 && slot.generated == length(slot.request, slot.sample)) {
          slot.finished_at = slot.generated - 1;
        }
      }
      scheduler.stepped(shape);
      trace.steps.push_back(shape);
    };
    admit();
    int64_t since_check = 0;
    while (!scheduler.idle()) {
      for (; since_check < check_every && !scheduler.at_budget(); ++since_check) step();
      ++trace.checks;
      std::vector<int64_t> flags;
      for (int64_t r = 0; r < scheduler.rows(); ++r) flags.push_back(slots[static_cast<std::size_t>(r)].finished_at);
      const std::vector<qwen::Finished> done = scheduler.finished(flags);
      for (const qwen::Finished& d : done) {
        const qwen::Sequence& row = scheduler.row(d.row);
        const Slot& slot = slots[static_cast<std::size_t>(d.row)];
        CHECK(slot.request == row.request);  // the scheduler's row is the device's slot
        CHECK(slot.sample == row.sample);
      }
      const std::vector<qwen::Released> released = scheduler.release(done);
      REQUIRE(released.size() == done.size());
      const qwen::Compaction moves = scheduler.compact();
      for (std::size_t i = 0; i < moves.to.size(); ++i) {
        CHECK(moves.to[i] < moves.from[i]);  // live rows move down into freed slots
        slots[static_cast<std::size_t>(moves.to[i])] = slots[static_cast<std::size_t>(moves.from[i])];
      }
      since_check = 0;
      if (!released.empty() && scheduler.step_before_hand_over()) {  // the released outputs' copy runs under it
        step();
        since_check = 1;
      }
      bool stop = false;
      for (const qwen::Released& sequence : released) {
        qwen::EngineSequence handed{
            .request = sequence.request, .sample = sequence.sample, .finish_reason = sequence.reason};
        handed.tokens.assign(static_cast<std::size_t>(sequence.length), 7);
        scheduler.hand_over(sequence);
        trace.handed.push_back(handed);
        trace.steps_at_hand_over.push_back(static_cast<int64_t>(trace.steps.size()));
        if (!keep_going(handed)) {
          scheduler.stopped();
          trace.stopped_after = static_cast<int64_t>(trace.handed.size());
          stop = true;
          break;
        }
      }
      if (stop) break;
      admit();
    }
    return trace;
  }
};

std::vector<qwen::EngineRequest> make_requests(int64_t count, int64_t n) {
  std::vector<qwen::EngineRequest> requests;
  for (int64_t r = 0; r < count; ++r) {
    requests.push_back({.prompt = std::vector<int64_t>(static_cast<std::size_t>(3 + r % 4), 1 + r), .n = n});
  }
  return requests;
}

qwen::SchedulerOptions options_of(int64_t slots) {
  return {.max_num_seqs = slots, .max_prompt_tokens = 8, .max_new_tokens = 16, .vocab_size = 100};
}

}  // namespace

TEST_CASE("scheduler: every sequence ends once, at its own length or the budget, in slots [0, rows)") {
  for (const int64_t slots : {1, 3, 5, 64}) {
    CAPTURE(slots);
    FakeRun run{.options = options_of(slots), .requests = make_requests(7, 3)};
    run.length = [](int64_t request, int64_t sample) { return 1 + (request * 7 + sample * 5) % 20; };  // some > 16
    // The graphs' rounded shapes: padding rows, stale where a sequence was released, reset before they step.
    run.options.rounded_shapes = true;
    CHECK(run.run().stats.sequences == 21);
    run.options.rounded_shapes = false;
    const Trace trace = run.run();
    std::set<std::pair<int64_t, int64_t>> seen;
    for (const auto& sequence : trace.handed) {
      CHECK(seen.insert({sequence.request, sequence.sample}).second);
      const int64_t wanted = run.length(sequence.request, sequence.sample);
      if (wanted <= 16) {
        CHECK(static_cast<int64_t>(sequence.tokens.size()) == wanted);
        CHECK(sequence.finish_reason == qwen::FinishReason::kStop);
      } else {
        CHECK(sequence.tokens.size() == 16);
        CHECK(sequence.finish_reason == qwen::FinishReason::kLength);
      }
    }
    CHECK(seen.size() == 21);
    CHECK(trace.stats.requests == 7);
    CHECK(trace.stats.sequences == 21);
    CHECK(trace.stats.dropped == 0);
    for (const auto& step : trace.steps) {
      CHECK(step.live <= slots);
      CHECK(step.rows == step.live);  // exact shapes
    }
    // Decode rows: each sequence's tokens after its first (from the prefill), plus at most check_every - 1 steps past
    // its stop before the check that notices it.
    int64_t needed = 0;
    for (const auto& sequence : trace.handed) needed += static_cast<int64_t>(sequence.tokens.size()) - 1;
    CHECK(trace.stats.rows_computed >= needed);
    CHECK(trace.stats.rows_computed <= needed + 21 * (run.check_every - 1));
  }
}

TEST_CASE("scheduler: a request's max_tokens ends its sequences with \"length\" at its budget, noticed at a check") {
  for (const int64_t slots : {1, 3, 64}) {
    CAPTURE(slots);
    FakeRun run{.options = options_of(slots), .requests = make_requests(6, 3)};
    for (std::size_t r = 0; r < run.requests.size(); ++r) run.requests[r].max_tokens = static_cast<int64_t>(r) * 3;
    // Stops at 5 + sample: before some budgets (0, 3, 6, 9, 12, 15; 0 is max_new_tokens 16), after others.
    run.length = [](int64_t, int64_t sample) { return 5 + sample; };
    const Trace trace = run.run();
    CHECK(trace.handed.size() == 18);
    for (const auto& sequence : trace.handed) {
      CAPTURE(sequence.request);
      CAPTURE(sequence.sample);
      const int64_t budget = sequence.request == 0 ? 16 : sequence.request * 3;
      const int64_t stop = 5 + sequence.sample;
      if (stop <= budget) {
        CHECK(static_cast<int64_t>(sequence.tokens.size()) == stop);
        CHECK(sequence.finish_reason == qwen::FinishReason::kStop);
      } else {
        CHECK(static_cast<int64_t>(sequence.tokens.size()) == budget);
        CHECK(sequence.finish_reason == qwen::FinishReason::kLength);
      }
    }
  }
  // A budget makes no check of its own: a sequence that never stops, with budget 6, is noticed at the second check
  // (after 8 decode steps, 3 of them past its budget), as a stop token would be.
  FakeRun alone{.options = options_of(1), .requests = {{.prompt = {1, 2}, .max_tokens = 6}}};
  alone.length = [](int64_t, int64_t) { return 100; };
  const Trace trace = alone.run();
  REQUIRE(trace.handed.size() == 1);
  CHECK(trace.handed[0].tokens.size() == 6);
  CHECK(trace.handed[0].finish_reason == qwen::FinishReason::kLength);
  CHECK(trace.checks == 2);
  CHECK(trace.stats.rows_computed == 8);
}

TEST_CASE("scheduler: a check's finished sequences reach the sink after one more step of the rows left") {
  // Two slots, a check every 4 steps; request 0 stops at its 2nd token, request 1 at its 10th, request 2 at its 3rd.
  FakeRun run{.options = options_of(2), .requests = make_requests(3, 1)};
  const std::vector<int64_t> lengths = {2, 10, 3};
  run.length = [&lengths](int64_t request, int64_t) { return lengths[static_cast<std::size_t>(request)]; };
  const Trace trace = run.run();
  REQUIRE(trace.handed.size() == 3);
  CHECK(trace.handed[0].request == 0);
  // The first check (after 4 steps) releases request 0; one step of request 1 alone runs while its outputs come back;
  // then it is handed over and request 2 admitted into the freed slot.
  REQUIRE(trace.steps.size() > 4);
  CHECK(trace.steps[3].live == 2);
  CHECK(trace.steps[4].live == 1);
  CHECK(trace.steps_at_hand_over[0] == 5);
  REQUIRE(trace.steps_at_admission.size() == 2);
  CHECK(trace.steps_at_admission[1] == 5);
  CHECK(trace.admissions[1].placed.front().request == 2);
  CHECK(trace.steps[5].live == 2);
  // That step counts towards the next check, four steps after the first: request 2 (3 tokens) is released there.
  CHECK(trace.checks >= 2);
  CHECK(trace.handed[1].request == 2);
  CHECK(trace.steps_at_hand_over[1] == 9);
  // The last check releases every row left: nothing to step, handed over at once.
  CHECK(trace.steps_at_hand_over[2] == static_cast<int64_t>(trace.steps.size()));
  CHECK(trace.steps.size() == 12);
  CHECK(trace.stats.rows_computed == 4 * 2 + 1 + 3 * 2 + 1 + 3 * 1);
}

TEST_CASE("scheduler: one prefill per request; a half-admitted request's is kept for its later samples, then let go") {
  FakeRun run{.options = options_of(3), .requests = make_requests(2, 5)};
  run.length = [](int64_t request, int64_t sample) { return 2 + request + sample; };
  const Trace trace = run.run();
  CHECK(trace.stats.sequences == 10);
  int64_t prefills = 0, from_kept = 0;
  std::vector<int64_t> kept, released;
  for (const auto& admission : trace.admissions) {
    prefills += static_cast<int64_t>(admission.prefill.size());
    for (const auto& placed : admission.placed) {
      from_kept += placed.prefill_row < 0 ? 1 : 0;
      if (placed.prefill_row >= 0) CHECK(placed.prefill_row < static_cast<int64_t>(admission.prefill.size()));
    }
    for (const auto& keep : admission.keep) kept.push_back(keep.request);
    released.insert(released.end(), admission.release.begin(), admission.release.end());
  }
  CHECK(prefills == 2);   // each prompt once
  CHECK(from_kept == 6);  // request 0: 3 from its prefill, 2 kept; request 1: 1 + 4 kept
  CHECK(kept == std::vector<int64_t>{0, 1});
  CHECK(released == std::vector<int64_t>{0, 1});
  // The first admission fills all 3 slots with request 0, its first prefill row.
  REQUIRE(!trace.admissions.empty());
  CHECK(trace.admissions.front().placed.size() == 3);
  for (const auto& placed : trace.admissions.front().placed) CHECK(placed.prefill_row == 0);

  run.options.shared_prefill = false;  // then one prefill row per sequence, nothing kept
  const Trace unshared = run.run();
  int64_t rows = 0;
  for (const auto& admission : unshared.admissions) {
    rows += static_cast<int64_t>(admission.prefill.size());
    CHECK(admission.keep.empty());
  }
  CHECK(rows == 10);
}

TEST_CASE("scheduler: a sink that stops the run leaves the sequences in flight counted as dropped") {
  FakeRun run{.options = options_of(4), .requests = make_requests(6, 2)};
  run.length = [](int64_t request, int64_t) { return 3 + request % 3; };
  int64_t taken = 0;
  run.keep_going = [&taken](const qwen::EngineSequence&) { return ++taken < 5; };
  const Trace trace = run.run();
  CHECK(trace.stopped_after == 5);
  CHECK(trace.stats.sequences == 5);
  CHECK(trace.stats.dropped > 0);
  CHECK(trace.stats.dropped <= 4);  // at most the pool
  // Hand-over order within a check is (request, sample).
  for (std::size_t i = 1; i < trace.handed.size(); ++i) {
    if (trace.handed[i].request == trace.handed[i - 1].request)
      CHECK(trace.handed[i].sample > trace.handed[i - 1].sample);
  }
}

TEST_CASE("scheduler: static batches admit only when the pool is empty") {
  FakeRun run{.options = options_of(4), .requests = make_requests(5, 2)};
  run.options.continuous = false;
  run.length = [](int64_t request, int64_t sample) { return 2 + (request + sample) % 6; };
  const Trace trace = run.run();
  CHECK(trace.stats.sequences == 10);
  for (const auto& admission : trace.admissions) CHECK(admission.placed.front().slot == 0);
  CHECK(trace.admissions.size() == 3);  // 4 + 4 + 2 sequences
}

TEST_CASE("scheduler: rounded shapes for CUDA graphs: powers of two, the padding reset after each admission") {
  FakeRun run{.options = options_of(6), .requests = make_requests(3, 1)};
  run.options.rounded_shapes = true;
  run.options.max_prompt_tokens = 100;                                    // capacity 116
  run.length = [](int64_t request, int64_t) { return 3 + 4 * request; };  // 3 live rows, then 2, then 1
  const Trace trace = run.run();
  CHECK(trace.stats.sequences == 3);
  int64_t padded = 0;
  for (const auto& step : trace.steps) {
    CHECK(step.rows >= step.live);
    CHECK(((step.rows & (step.rows - 1)) == 0 || step.rows == 6));  // a power of two, or all the slots
    CHECK(step.window == 64);  // contexts of at most 6 + 16 positions: the smallest window
    if (step.reset_padding) CHECK(step.rows > step.live);
    padded += step.rows > step.live ? 1 : 0;
  }
  CHECK(padded > 0);  // some steps ran with padding rows
  CHECK(trace.steps.front().reset_padding == (trace.steps.front().rows > trace.steps.front().live));

  run.options.max_prompt_tokens = 30;  // capacity 46: a window never exceeds it
  run.requests = {{.prompt = std::vector<int64_t>(30, 1), .n = 2}};
  run.length = [](int64_t, int64_t) { return 16; };
  for (const auto& step : run.run().steps) CHECK(step.window == 46);  // 64 rounded down to the capacity
}

TEST_CASE("scheduler: bad requests are refused naming their index") {
  const auto refused = [](qwen::EngineRequest request) {
    FakeRun run{.options = options_of(2), .requests = {{.prompt = {1, 2}}, std::move(request)}};
    run.length = [](int64_t, int64_t) { return 2; };
    try {
      run.run();
    } catch (const std::invalid_argument& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  CHECK(refused({.prompt = {}}).find("request 1 has an empty prompt") != std::string::npos);
  CHECK(refused({.prompt = {1}, .n = 0}).find("request 1 asks for n = 0") != std::string::npos);
  CHECK(refused({.prompt = {1, 100}}).find("request 1 holds token 100, outside the vocabulary [0, 100)") !=
        std::string::npos);
  CHECK(refused({.prompt = std::vector<int64_t>(9, 1)}).find("more than max_prompt_tokens 8") != std::string::npos);
  CHECK(refused({.prompt = {1}, .max_tokens = 17})
            .find("request 1 asks for max_tokens = 17, outside [0, "
                  "max_new_tokens = 16]") != std::string::npos);
  CHECK(refused({.prompt = {1}, .max_tokens = -1}).find("request 1 asks for max_tokens = -1") != std::string::npos);
}
