// The scheduler's decisions: admission in request order, the step's shape, the check's finished rows, compaction.
#include "qwen_gsm8k/engine/scheduler.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace qwen {
namespace {

constexpr int64_t kSmallestWindow = 64;  // rounded windows: 64, 128, 256, ... positions

// The smallest power of two from `floor` that holds `value`, at most `ceiling`.
int64_t round_up(int64_t value, int64_t floor, int64_t ceiling) {
  int64_t rounded = floor;
  while (rounded < value) rounded *= 2;
  return std::min(rounded, ceiling);
}

}  // namespace

Scheduler::Scheduler(SchedulerOptions options, const RequestSource& source, EngineStats& stats)
    : options_(std::move(options)), source_(source), stats_(stats) {}

bool Scheduler::pull() {
  std::optional<EngineRequest> request = source_();
  if (!request) return false;
  const int64_t index = stats_.requests++;
  const auto where = [&] { return "engine: request " + std::to_string(index) + " "; };
  if (request->n <= 0) throw std::invalid_argument(where() + "asks for n = " + std::to_string(request->n));
  const auto length = static_cast<int64_t>(request->prompt.size());
  if (length == 0) throw std::invalid_argument(where() + "has an empty prompt");
  if (request->max_tokens < 0 || request->max_tokens > options_.max_new_tokens) {
    throw std::invalid_argument(where() + "asks for max_tokens = " + std::to_string(request->max_tokens) +
                                ", outside [0, max_new_tokens = " + std::to_string(options_.max_new_tokens) +
                                "] (0: max_new_tokens)");
  }
  if (length > options_.max_prompt_tokens) {
    throw std::invalid_argument(where() + "has a prompt of " + std::to_string(length) +
                                " tokens, more than max_prompt_tokens " + std::to_string(options_.max_prompt_tokens));
  }
  for (const int64_t id : request->prompt) {
    if (id < 0 || id >= options_.vocab_size) {
      throw std::invalid_argument(where() + "holds token " + std::to_string(id) + ", outside the vocabulary [0, " +
                                  std::to_string(options_.vocab_size) + ")");
    }
  }
  waiting_.push_back(Pending{.index = index, .request = std::move(*request)});
  return true;
}

Admission Scheduler::admit() {
  reset_padding_ = true;
  // Requests whose samples were all placed by the last admission go now (their requests were read until then).
  while (!waiting_.empty() && waiting_.front().next == waiting_.front().request.n) waiting_.pop_front();
  Admission admission;
  if (!options_.continuous && !rows_.empty()) return admission;
  int64_t open = options_.max_num_seqs - static_cast<int64_t>(rows_.size());
  std::vector<std::pair<std::size_t, int64_t>> chosen;  // (waiting entry, sample)
  for (std::size_t w = 0; open > 0;) {
    if (w == waiting_.size() && !pull()) break;
    Pending& entry = waiting_[w];
    while (open > 0 && entry.next < entry.request.n) {
      chosen.emplace_back(w, entry.next++);
      --open;
    }
    if (entry.next == entry.request.n) ++w;
  }
  if (chosen.empty()) return admission;

  // Which prefill row each chosen sequence reads: a new prefill's row, or a half-admitted request's kept one.
  std::vector<int64_t> entry_row(waiting_.size(), -1);
  const auto first_slot = static_cast<int64_t>(rows_.size());
  for (std::size_t c = 0; c < chosen.size(); ++c) {
    const auto [w, sample] = chosen[c];
    Pending& entry = waiting_[w];
    Admission::Placed placed{.slot = first_slot + static_cast<int64_t>(c),
                             .request = entry.index,
                             .sample = sample,
                             .source = &entry.request};
    if (!(options_.shared_prefill && entry.kept)) {  // else kept from an earlier admission
      if (!options_.shared_prefill || entry_row[w] < 0) {
        entry_row[w] = static_cast<int64_t>(admission.prefill.size());
        admission.prefill.push_back(&entry.request.prompt);
      }
      placed.prefill_row = entry_row[w];
    }
    admission.placed.push_back(placed);
    const auto length = static_cast<int64_t>(entry.request.prompt.size());
    admission.longest_prompt = std::max(admission.longest_prompt, length);
    const int64_t budget = entry.request.max_tokens > 0 ? entry.request.max_tokens : options_.max_new_tokens;
    rows_.push_back(
        {.request = entry.index, .sample = sample, .prompt_length = length, .generated = 1, .budget = budget});
  }
  // A half-admitted request keeps its prefill for its later samples; one fully admitted lets its kept one go.
  for (std::size_t w = 0; w < waiting_.size(); ++w) {
    Pending& entry = waiting_[w];
    if (options_.shared_prefill && entry.next < entry.request.n && !entry.kept && entry_row[w] >= 0) {
      admission.keep.push_back({entry.index, entry_row[w], static_cast<int64_t>(entry.request.prompt.size())});
      entry.kept = true;
    } else if (entry.kept && entry.next == entry.request.n) {
      admission.release.push_back(entry.index);
      entry.kept = false;
    }
  }
  return admission;
}

bool Scheduler::at_budget() const {
  return std::any_of(rows_.begin(), rows_.end(),
                     [&](const Sequence& row) { return row.generated >= options_.max_new_tokens; });
}

StepShape Scheduler::next_step() {
  StepShape shape;
  shape.live = static_cast<int64_t>(rows_.size());
  for (const Sequence& row : rows_) shape.window = std::max(shape.window, row.prompt_length + row.generated);
  shape.rows = shape.live;
  if (options_.rounded_shapes) {
    shape.rows = round_up(shape.live, 1, options_.max_num_seqs);
    shape.window = round_up(shape.window, kSmallestWindow, options_.capacity());
    shape.reset_padding = reset_padding_ && shape.rows > shape.live;
    reset_padding_ = false;
  }
  return shape;
}

void Scheduler::stepped(const StepShape& shape) {
  for (Sequence& row : rows_) ++row.generated;
  ++stats_.decode_calls;
  stats_.rows_computed += shape.rows;
}

std::vector<Finished> Scheduler::finished(const std::vector<int64_t>& finished_at) {
  ++stats_.checks;
  std::vector<Finished> done;
  for (std::size_t r = 0; r < rows_.size(); ++r) {
    const Sequence& row = rows_[r];
    if (row.released) continue;
    const int64_t stop = finished_at.at(r) >= 0 ? finished_at[r] + 1 : 0;  // tokens up to the first stop
    if (stop > 0 && stop <= row.budget) {
      done.push_back({static_cast<int64_t>(r), stop, FinishReason::kStop});
    } else if (row.generated >= row.budget) {
      done.push_back({static_cast<int64_t>(r), row.budget, FinishReason::kLength});
    }
  }
  std::sort(done.begin(), done.end(), [&](const Finished& a, const Finished& b) {
    const Sequence &x = rows_[static_cast<std::size_t>(a.row)], &y = rows_[static_cast<std::size_t>(b.row)];
    return std::pair(x.request, x.sample) < std::pair(y.request, y.sample);
  });
  return done;
}

std::vector<Released> Scheduler::release(const std::vector<Finished>& done) {
  std::vector<Released> released;
  for (const Finished& d : done) {
    Sequence& row = rows_.at(static_cast<std::size_t>(d.row));
    row.released = true;
    released.push_back({.request = row.request, .sample = row.sample, .length = d.length, .reason = d.reason});
  }
  unhanded_ += static_cast<int64_t>(released.size());
  // A released row's slot may become a padding row of the next step (the one before the hand-over, with no admission
  // between), with its position and token index where its sequence ended: reset them before that step.
  if (!released.empty()) reset_padding_ = true;
  return released;
}

void Scheduler::hand_over(const Released& sequence) {
  --unhanded_;
  ++stats_.sequences;
  stats_.useful_tokens += sequence.length;
}

void Scheduler::stopped() {
  stats_.dropped =
      unhanded_ + std::count_if(rows_.begin(), rows_.end(), [](const Sequence& row) { return !row.released; });
}

Compaction Scheduler::compact() {
  Compaction moves;
  if (!options_.continuous) {
    if (std::all_of(rows_.begin(), rows_.end(), [](const Sequence& row) { return row.released; })) rows_.clear();
    return moves;
  }
  const auto rows = static_cast<int64_t>(rows_.size());
  int64_t live = 0;
  for (const Sequence& row : rows_) live += row.released ? 0 : 1;
  int64_t above = rows - 1;
  for (int64_t r = 0; r < live; ++r) {
    if (!rows_[static_cast<std::size_t>(r)].released) continue;
    while (rows_[static_cast<std::size_t>(above)].released) --above;
    moves.to.push_back(r);
    moves.from.push_back(above--);
  }
  for (const int64_t r : moves.from) {
    const Sequence& row = rows_[static_cast<std::size_t>(r)];
    moves.width = std::max(moves.width, row.prompt_length + row.generated);
  }
  moves.width = std::min(moves.width, options_.capacity());
  for (std::size_t i = 0; i < moves.to.size(); ++i) {
    rows_[static_cast<std::size_t>(moves.to[i])] = rows_[static_cast<std::size_t>(moves.from[i])];
  }
  rows_.resize(static_cast<std::size_t>(live));
  return moves;
}

}  // namespace qwen
