// The engine's loop: admit (prefill, fork, first token), decode all live slots until a check is due, hand over what
// finished, compact the pool, admit again.
#include "qwen_gsm8k/engine/engine.hpp"

#include <ATen/record_function.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <stdexcept>
#include <utility>

#include "qwen_gsm8k/engine/decode_graphs.hpp"
#include "qwen_gsm8k/engine/sequence_random.hpp"
#include "qwen_gsm8k/engine/slot_cache.hpp"
#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/kv_cache.hpp"

namespace qwen {

const char* finish_reason_name(FinishReason reason) {
  return reason == FinishReason::kStop ? "stop" : "length";
}

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

constexpr float kLowest = std::numeric_limits<float>::lowest();
constexpr int64_t kSmallestWindow = 64;  // rounded windows: 64, 128, 256, ... positions

// A live row's host-side facts: everything the loop decides from without reading the device.
struct Row {
  int64_t request = 0, sample = 0, prompt_length = 0;
  int64_t generated = 0;  // tokens sampled so far; the last one is fed by the next decode step
  int64_t oracle = 0;
  bool handed_over = false;  // static batches: finished and given to the sink, computed until its batch ends
};

// A request some of whose samples wait for slots. With the shared prefill its keys, values and last logits are kept
// from its prefill until every sample is admitted (at most one request is half admitted at a time).
struct Waiting {
  int64_t index = 0;
  EngineRequest request;
  int64_t next = 0;                         // samples [next, n) are not admitted yet
  std::vector<torch::Tensor> keys, values;  // per layer [1, KV, P, D], once prefilled
  torch::Tensor logits;                     // [1, V], once prefilled
};

// One token per row: the argmax, or the inverse of the row's CDF at its own uniform. The CDF is summed in float64
// (151,936 probabilities); searchsorted's right side never lands on a token of probability 0.
torch::Tensor draw(const torch::Tensor& scores, const torch::Tensor& uniforms, const SamplingOptions& sampling) {
  if (sampling.greedy()) return scores.argmax(-1);
  const torch::Tensor cdf = scores.softmax(-1).to(torch::kFloat64).cumsum(-1);  // [R, V]
  const torch::Tensor target = (uniforms * cdf.select(1, cdf.size(1) - 1)).unsqueeze(1);
  return torch::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true).squeeze(1).clamp_max(cdf.size(1) - 1);
}

class Run {
 public:
  Run(Qwen2ForCausalLM& model, const EngineOptions& options, const RequestSource& source, const SequenceSink& sink)
      : model_(model),
        options_(options),
        source_(source),
        sink_(sink),
        device_(model->lm_head_weight().device()),
        vocab_(model->config().vocab_size),
        slots_(options.max_num_seqs),
        capacity_(options.max_prompt_tokens + options.max_new_tokens),
        // Keys and values in the dtype the projections produce: autocast's when it is on, else the weights'.
        cache_dtype_(active_autocast_dtype(device_).value_or(model->lm_head_weight().scalar_type())),
        cache_(model->config(), slots_, capacity_, model->lm_head_weight().options().dtype(cache_dtype_)),
        graphs_(device_, options.cuda_graphs),
        rounded_shapes_(options.graph_shapes || graphs_.active()) {
    const auto longs = torch::TensorOptions().dtype(torch::kInt64).device(device_);
    const int64_t width = options.max_new_tokens;
    next_token_ = torch::zeros({slots_}, longs);
    positions_ = torch::zeros({slots_}, longs);
    generated_index_ = torch::zeros({slots_}, longs);
    finished_at_ = torch::full({slots_}, -1, longs);
    tokens_ = torch::zeros({slots_, width}, longs);
    per_row_ = {&next_token_, &positions_, &generated_index_, &finished_at_, &tokens_};
    if (options.return_logprobs) {
      logprobs_ = torch::zeros({slots_, width}, longs.dtype(torch::kFloat32));
      per_row_.push_back(&logprobs_);
    }
    if (options.sampling.repetition_penalty != 1.0) {
      seen_ = torch::zeros({slots_, capacity_}, longs);
      per_row_.push_back(&seen_);
    }
    if (!options.sampling.greedy()) {
      uniforms_ = torch::zeros({slots_, width}, longs.dtype(torch::kFloat64));
      per_row_.push_back(&uniforms_);
    }
    stop_ids_ = torch::tensor(options.stop_ids.empty() ? std::vector<int64_t>{-1} : options.stop_ids, longs);
    stats_.cache_bytes = cache_.bytes();
  }

  EngineStats run() {
    torch::NoGradGuard no_grad;
    admit();
    while (!rows_.empty()) {
      for (int64_t since = 0; since < options_.check_every && !at_budget(); ++since) decode();
      if (!check()) break;
      admit();
      reset_padding_ = true;
    }
    stats_.graph_captures = graphs_.captures();
    stats_.graph_replays = graphs_.replays();
    return stats_;
  }

 private:
  bool at_budget() const {
    return std::any_of(rows_.begin(), rows_.end(),
                       [&](const Row& row) { return row.generated >= options_.max_new_tokens; });
  }

  // The next request from the source, checked; false when it has none now.
  bool pull() {
    std::optional<EngineRequest> request = source_();
    if (!request) return false;
    const int64_t index = stats_.requests++;
    const auto where = [&] { return "engine: request " + std::to_string(index) + " "; };
    if (request->n <= 0) throw std::invalid_argument(where() + "asks for n = " + std::to_string(request->n));
    const auto length = static_cast<int64_t>(request->prompt.size());
    if (length == 0) throw std::invalid_argument(where() + "has an empty prompt");
    if (length > options_.max_prompt_tokens) {
      throw std::invalid_argument(where() + "has a prompt of " + std::to_string(length) +
                                  " tokens, more than max_prompt_tokens " + std::to_string(options_.max_prompt_tokens));
    }
    for (const int64_t id : request->prompt) {
      if (id < 0 || id >= vocab_) {
        throw std::invalid_argument(where() + "holds token " + std::to_string(id) + ", outside the vocabulary [0, " +
                                    std::to_string(vocab_) + ")");
      }
    }
    Waiting entry;
    entry.index = index;
    entry.request = std::move(*request);
    waiting_.push_back(std::move(entry));
    return true;
  }

  // Prefills prompts (right-padded into one batch, positions from 0): the keys and values [P, KV, L, D] per layer and
  // the logits [P, V] at each prompt's last position.
  struct Prefill {
    std::vector<torch::Tensor> keys, values;
    torch::Tensor logits;
  };
  Prefill prefill(const std::vector<const std::vector<int64_t>*>& prompts) {
    const auto count = static_cast<int64_t>(prompts.size());
    int64_t longest = 0;
    for (const auto* prompt : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(prompt->size()));
    // Padding with token 0, which every vocabulary has (a tokenizer's pad id may lie past a small model's): masked,
    // and its keys and values are overwritten by the sequence's own tokens.
    torch::Tensor ids = torch::zeros({count, longest}, torch::kInt64);
    torch::Tensor mask = torch::zeros({count, longest}, torch::kInt64);
    std::vector<int64_t> last;
    for (int64_t p = 0; p < count; ++p) {
      const auto& prompt = *prompts[static_cast<std::size_t>(p)];
      const auto length = static_cast<int64_t>(prompt.size());
      ids[p].narrow(0, 0, length).copy_(torch::tensor(prompt, torch::kInt64));
      mask[p].narrow(0, 0, length).fill_(1);
      last.push_back(length - 1);
      stats_.prefill_tokens += length;
    }
    ids = ids.to(device_);
    mask = mask.to(device_);
    KVCache cache(model_->config(), count, longest, model_->lm_head_weight().options().dtype(cache_dtype_));
    const torch::Tensor hidden = model_->model->forward(ids, mask, position_ids_from_mask(mask), &cache);
    const torch::Tensor rows = torch::arange(count, ids.options());
    const torch::Tensor last_hidden = hidden.index({rows, torch::tensor(last, ids.options())});  // [P, H]
    Prefill out;
    out.logits = model_->logits(last_hidden);
    for (int64_t layer = 0; layer < model_->config().num_hidden_layers; ++layer) {
      out.keys.push_back(cache.layer_keys(layer));
      out.values.push_back(cache.layer_values(layer));
    }
    ++stats_.prefill_calls;
    stats_.prefill_rows += count;
    return out;
  }

  // Fills free slots from the waiting requests and the source: prefills, forks, draws each new sequence's first token.
  void admit() {
    if (!options_.continuous && !rows_.empty()) return;
    RECORD_USER_SCOPE(kAdmitScope);
    int64_t open = slots_ - static_cast<int64_t>(rows_.size());
    std::vector<std::pair<std::size_t, int64_t>> chosen;  // (waiting entry, sample)
    for (std::size_t w = 0; open > 0;) {
      if (w == waiting_.size() && !pull()) break;
      Waiting& entry = waiting_[w];
      while (open > 0 && entry.next < entry.request.n) {
        chosen.emplace_back(w, entry.next++);
        --open;
      }
      if (entry.next == entry.request.n) ++w;
    }
    if (chosen.empty()) return;

    // Which prefill row each chosen sequence reads: a new prefill's row, or a half-admitted request's kept one.
    std::vector<const std::vector<int64_t>*> prompts;
    std::vector<int64_t> source_row(chosen.size(), -1);
    std::vector<int64_t> entry_row(waiting_.size(), -1);
    for (std::size_t c = 0; c < chosen.size(); ++c) {
      Waiting& entry = waiting_[chosen[c].first];
      if (options_.shared_prefill && entry.logits.defined()) continue;  // kept from an earlier admission
      if (options_.shared_prefill && entry_row[chosen[c].first] >= 0) {
        source_row[c] = entry_row[chosen[c].first];
        continue;
      }
      source_row[c] = static_cast<int64_t>(prompts.size());
      entry_row[chosen[c].first] = source_row[c];
      prompts.push_back(&entry.request.prompt);
    }
    Prefill fresh;
    if (!prompts.empty()) fresh = prefill(prompts);

    const auto start = static_cast<int64_t>(rows_.size());
    const auto count = static_cast<int64_t>(chosen.size());
    const auto longs = torch::TensorOptions().dtype(torch::kInt64);
    std::vector<torch::Tensor> first_logits;
    std::vector<int64_t> fresh_slots, fresh_rows, kept_slots;
    const Waiting* kept = nullptr;  // the half-admitted request whose kept prefill fills kept_slots (one at a time)
    for (std::size_t c = 0; c < chosen.size(); ++c) {
      const Waiting& entry = waiting_[chosen[c].first];
      const int64_t slot = start + static_cast<int64_t>(c);
      if (source_row[c] >= 0) {
        fresh_slots.push_back(slot);
        fresh_rows.push_back(source_row[c]);
        first_logits.push_back(fresh.logits.narrow(0, source_row[c], 1));
      } else {
        kept_slots.push_back(slot);
        kept = &entry;
        first_logits.push_back(entry.logits);
      }
    }
    if (!kept_slots.empty()) {
      const auto slots = static_cast<int64_t>(kept_slots.size());
      cache_.fill(torch::tensor(kept_slots, longs).to(device_), kept->keys, kept->values,
                  torch::zeros({slots}, longs).to(device_));
    }
    if (!fresh_slots.empty()) {
      cache_.fill(torch::tensor(fresh_slots, longs).to(device_), fresh.keys, fresh.values,
                  torch::tensor(fresh_rows, longs).to(device_));
    }
    // The half-admitted request keeps its prefill for its later samples.
    for (std::size_t w = 0; w < waiting_.size(); ++w) {
      Waiting& entry = waiting_[w];
      if (!options_.shared_prefill || entry.next == entry.request.n || entry.logits.defined() || entry_row[w] < 0) {
        continue;
      }
      const int64_t row = entry_row[w], length = static_cast<int64_t>(entry.request.prompt.size());
      for (std::size_t layer = 0; layer < fresh.keys.size(); ++layer) {
        entry.keys.push_back(fresh.keys[layer].narrow(0, row, 1).narrow(2, 0, length).clone());
        entry.values.push_back(fresh.values[layer].narrow(0, row, 1).narrow(2, 0, length).clone());
      }
      entry.logits = fresh.logits.narrow(0, row, 1).clone();
    }

    // The new rows' host facts and device state, then their first tokens, drawn from the prefill's logits.
    int64_t longest_prompt = 0;
    for (const auto& [w, sample] : chosen) {
      longest_prompt = std::max<int64_t>(longest_prompt, static_cast<int64_t>(waiting_[w].request.prompt.size()));
    }
    const int64_t width = options_.max_new_tokens;
    torch::Tensor positions = torch::empty({count}, longs);
    torch::Tensor uniforms =
        uniforms_.defined() ? torch::empty({count, width}, longs.dtype(torch::kFloat64)) : torch::Tensor();
    torch::Tensor seen = seen_.defined() ? torch::empty({count, capacity_}, longs) : torch::Tensor();
    for (int64_t c = 0; c < count; ++c) {
      const auto& [w, sample] = chosen[static_cast<std::size_t>(c)];
      const Waiting& entry = waiting_[w];
      const auto length = static_cast<int64_t>(entry.request.prompt.size());
      Row row{.request = entry.index, .sample = sample, .prompt_length = length, .generated = 1};
      if (options_.oracle_length) row.oracle = options_.oracle_length(entry.index, sample);
      rows_.push_back(row);
      positions[c] = length;
      if (uniforms.defined()) {
        const uint64_t seed = sequence_seed(entry.request.seed, sample);
        auto* u = uniforms[c].data_ptr<double>();
        for (int64_t t = 0; t < width; ++t) u[t] = sequence_uniform(seed, t);
      }
      if (seen.defined()) {  // padding past the sequence repeats its first token: the penalty sees only its own
        seen[c].fill_(entry.request.prompt.front());
        seen[c].narrow(0, 0, length).copy_(torch::tensor(entry.request.prompt, longs));
      }
    }
    const torch::Tensor slots = torch::arange(start, start + count, longs).to(device_);
    const torch::Tensor logits = torch::cat(first_logits, 0);  // [M, V]
    if (uniforms.defined()) uniforms_.index_copy_(0, slots, uniforms.to(device_));
    if (seen.defined()) seen = seen.to(device_);
    const torch::Tensor scores =
        process_logits(logits, seen.defined() ? seen.narrow(1, 0, longest_prompt) : seen, options_.sampling);
    const torch::Tensor token =
        draw(scores, uniforms.defined() ? uniforms.select(1, 0).to(device_) : uniforms, options_.sampling);
    positions = positions.to(device_);
    if (seen.defined()) {
      seen.scatter_(1, positions.unsqueeze(1), token.unsqueeze(1));
      seen_.index_copy_(0, slots, seen);
    }
    torch::Tensor tokens = torch::zeros({count, width}, token.options());
    tokens.select(1, 0).copy_(token);
    tokens_.index_copy_(0, slots, tokens);
    if (logprobs_.defined()) {
      torch::Tensor logprobs = torch::zeros({count, width}, logprobs_.options());
      logprobs.select(1, 0).copy_(token_logprobs(logits, token));
      logprobs_.index_copy_(0, slots, logprobs);
    }
    next_token_.index_copy_(0, slots, token);
    positions_.index_copy_(0, slots, positions);
    generated_index_.index_fill_(0, slots, 1);
    finished_at_.index_copy_(0, slots,
                             torch::where(is_stop(token), torch::zeros_like(token), -torch::ones_like(token)));

    while (!waiting_.empty() && waiting_.front().next == waiting_.front().request.n) waiting_.pop_front();
  }

  torch::Tensor is_stop(const torch::Tensor& token) const {
    return (token.unsqueeze(1) == stop_ids_.unsqueeze(0)).any(1);
  }

  torch::Tensor token_logprobs(const torch::Tensor& logits, const torch::Tensor& token) const {
    const double temperature = options_.sampling.greedy() ? 1.0 : options_.sampling.temperature;
    return (logits.to(torch::kFloat32) / temperature).log_softmax(-1).gather(1, token.unsqueeze(1)).squeeze(1);
  }

  // One token for every live row, as a CUDA graph's replay where graphs are on. With rounded shapes the step computes
  // the live rows rounded up (the padding rows are free slots: reset after each check to position 0 and token index 0,
  // they advance at most max_new_tokens - 1 steps before the next check, so every index they write stays in range)
  // over a rounded window.
  void decode() {
    RECORD_USER_SCOPE(kDecodeStepScope);
    const auto live = static_cast<int64_t>(rows_.size());
    int64_t window = 0;
    for (const Row& row : rows_) window = std::max(window, row.prompt_length + row.generated);
    int64_t rows = live;
    if (rounded_shapes_) {
      rows = round_up(live, 1, slots_);
      window = round_up(window, kSmallestWindow, capacity_);
      if (reset_padding_ && rows > live) {
        positions_.narrow(0, live, rows - live).zero_();
        generated_index_.narrow(0, live, rows - live).zero_();
      }
      reset_padding_ = false;
      graphs_.run({rows, window}, [this, rows, window] { decode_step(rows, window); });
    } else {
      decode_step(rows, window);
    }
    for (Row& row : rows_) ++row.generated;
    ++stats_.decode_calls;
    stats_.rows_computed += rows;
  }

  // The smallest power of two from `floor` that holds `value`, at most `ceiling`.
  static int64_t round_up(int64_t value, int64_t floor, int64_t ceiling) {
    int64_t rounded = floor;
    while (rounded < value) rounded *= 2;
    return std::min(rounded, ceiling);
  }

  // The device work of a decode step over slots [0, rows) and positions [0, window): the same operators on the same
  // buffers for the same (rows, window), and no host synchronisation, so that a CUDA graph can replay it.
  void decode_step(int64_t rows, int64_t window) {
    const torch::Tensor positions = positions_.narrow(0, 0, rows), index = generated_index_.narrow(0, 0, rows);
    const torch::Tensor keys = torch::arange(window, positions.options());
    const torch::Tensor mask = torch::zeros({rows, window}, positions.options().dtype(torch::kFloat32))
                                   .masked_fill(keys.unsqueeze(0) > positions.unsqueeze(1), kLowest)
                                   .view({rows, 1, 1, window});
    cache_.set_step(rows, positions, window);
    const torch::Tensor hidden = model_->model->forward_with_mask(next_token_.narrow(0, 0, rows).unsqueeze(1), mask,
                                                                  positions.unsqueeze(1), &cache_);
    const torch::Tensor logits = model_->logits(hidden.select(1, 0));  // [R, V]
    const torch::Tensor seen = seen_.defined() ? seen_.narrow(0, 0, rows).narrow(1, 0, window) : seen_;
    const torch::Tensor scores = process_logits(logits, seen, options_.sampling);
    const torch::Tensor uniforms =
        uniforms_.defined() ? uniforms_.narrow(0, 0, rows).gather(1, index.unsqueeze(1)).squeeze(1) : uniforms_;
    const torch::Tensor token = draw(scores, uniforms, options_.sampling);
    tokens_.narrow(0, 0, rows).scatter_(1, index.unsqueeze(1), token.unsqueeze(1));
    if (logprobs_.defined()) {
      logprobs_.narrow(0, 0, rows).scatter_(1, index.unsqueeze(1), token_logprobs(logits, token).unsqueeze(1));
    }
    if (seen_.defined()) seen_.narrow(0, 0, rows).scatter_(1, (positions + 1).unsqueeze(1), token.unsqueeze(1));
    const torch::Tensor finished = finished_at_.narrow(0, 0, rows);
    finished.copy_(torch::where(finished.lt(0) & is_stop(token), index, finished));
    positions.add_(1);
    index.add_(1);
    next_token_.narrow(0, 0, rows).copy_(token);
  }

  // Reads the finished flags, hands the finished sequences over in (request, sample) order, frees their slots.
  // False when the sink stopped the run.
  bool check() {
    RECORD_USER_SCOPE(kCheckScope);
    ++stats_.checks;
    const auto rows = static_cast<int64_t>(rows_.size());
    const torch::Tensor finished = finished_at_.narrow(0, 0, rows).cpu();
    const auto* finished_at = finished.data_ptr<int64_t>();
    struct Done {
      int64_t row, length;
      FinishReason reason;
    };
    std::vector<Done> done;
    for (int64_t r = 0; r < rows; ++r) {
      const Row& row = rows_[static_cast<std::size_t>(r)];
      if (row.handed_over) continue;
      int64_t length = finished_at[r] >= 0 ? finished_at[r] + 1 : 0;
      if (row.oracle > 0 && row.generated >= row.oracle && (length == 0 || row.oracle < length)) length = row.oracle;
      if (length > 0) {
        done.push_back({r, length, FinishReason::kStop});
      } else if (row.generated >= options_.max_new_tokens) {
        done.push_back({r, options_.max_new_tokens, FinishReason::kLength});
      }
    }
    if (!done.empty()) {
      std::sort(done.begin(), done.end(), [&](const Done& a, const Done& b) {
        const Row &x = rows_[static_cast<std::size_t>(a.row)], &y = rows_[static_cast<std::size_t>(b.row)];
        return std::pair(x.request, x.sample) < std::pair(y.request, y.sample);
      });
      std::vector<int64_t> indices;
      for (const Done& d : done) indices.push_back(d.row);
      const torch::Tensor index = torch::tensor(indices, torch::kInt64).to(device_);
      const torch::Tensor tokens = tokens_.index_select(0, index).cpu();
      const torch::Tensor logprobs = logprobs_.defined() ? logprobs_.index_select(0, index).cpu() : logprobs_;
      for (std::size_t i = 0; i < done.size(); ++i) {
        Row& row = rows_[static_cast<std::size_t>(done[i].row)];
        row.handed_over = true;
        EngineSequence sequence;
        sequence.request = row.request;
        sequence.sample = row.sample;
        sequence.finish_reason = done[i].reason;
        const int64_t* ids = tokens[static_cast<int64_t>(i)].data_ptr<int64_t>();
        sequence.tokens.assign(ids, ids + done[i].length);
        if (logprobs.defined()) {
          const float* values = logprobs[static_cast<int64_t>(i)].data_ptr<float>();
          sequence.logprobs.assign(values, values + done[i].length);
        }
        ++stats_.sequences;
        stats_.useful_tokens += done[i].length;
        if (!sink_(std::move(sequence))) {
          stats_.dropped = std::count_if(rows_.begin(), rows_.end(), [](const Row& r) { return !r.handed_over; });
          return false;
        }
      }
    }
    if (!options_.continuous) {
      if (std::all_of(rows_.begin(), rows_.end(), [](const Row& row) { return row.handed_over; })) rows_.clear();
      return true;
    }
    compact();
    return true;
  }

  // Keeps the live rows in slots [0, rows): each freed slot below the new count takes a live row from above it.
  void compact() {
    const auto rows = static_cast<int64_t>(rows_.size());
    int64_t live = 0;
    for (const Row& row : rows_) live += row.handed_over ? 0 : 1;
    std::vector<int64_t> to, from;
    int64_t above = rows - 1;
    for (int64_t r = 0; r < live; ++r) {
      if (!rows_[static_cast<std::size_t>(r)].handed_over) continue;
      while (rows_[static_cast<std::size_t>(above)].handed_over) --above;
      to.push_back(r);
      from.push_back(above--);
    }
    if (!to.empty()) {
      int64_t width = 0;
      for (const int64_t r : from) {
        const Row& row = rows_[static_cast<std::size_t>(r)];
        width = std::max(width, row.prompt_length + row.generated);
      }
      const auto longs = torch::TensorOptions().dtype(torch::kInt64);
      const torch::Tensor to_index = torch::tensor(to, longs).to(device_);
      const torch::Tensor from_index = torch::tensor(from, longs).to(device_);
      cache_.move(to_index, from_index, std::min(width, capacity_));
      for (torch::Tensor* tensor : per_row_) tensor->index_copy_(0, to_index, tensor->index_select(0, from_index));
      for (std::size_t i = 0; i < to.size(); ++i) {
        rows_[static_cast<std::size_t>(to[i])] = rows_[static_cast<std::size_t>(from[i])];
      }
    }
    rows_.resize(static_cast<std::size_t>(live));
  }

  Qwen2ForCausalLM& model_;
  const EngineOptions& options_;
  const RequestSource& source_;
  const SequenceSink& sink_;
  torch::Device device_;
  int64_t vocab_, slots_, capacity_;
  torch::ScalarType cache_dtype_;
  SlotCache cache_;
  DecodeGraphs graphs_;
  bool rounded_shapes_;        // decode at the graphs' shapes
  bool reset_padding_ = true;  // the padding rows' positions and indices to be zeroed before the next step
  std::vector<Row> rows_;
  std::deque<Waiting> waiting_;
  // Per slot: the token the next step feeds, its position, the index of the next token, the first stop's index (-1),
  // the generated tokens, their log-probs, the tokens seen (repetition penalty) and the draws' uniforms.
  torch::Tensor next_token_, positions_, generated_index_, finished_at_, tokens_, logprobs_, seen_, uniforms_;
  std::vector<torch::Tensor*> per_row_;
  torch::Tensor stop_ids_;
  EngineStats stats_;
};

}  // namespace

GenerationEngine::GenerationEngine(Qwen2ForCausalLM& model, EngineOptions options)
    : model_(model), options_(std::move(options)) {
  options_.validate();
}

EngineStats GenerationEngine::run(const RequestSource& source, const SequenceSink& sink) {
  return Run(model_, options_, source, sink).run();
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
  std::vector<std::vector<EngineSequence>> out(requests.size());
  for (std::size_t r = 0; r < requests.size(); ++r) {
    out[r].resize(static_cast<std::size_t>(std::max<int64_t>(requests[r].n, 0)));
  }
  std::size_t next = 0;
  GenerationEngine engine(model, std::move(options));
  const EngineStats result = engine.run(
      [&]() -> std::optional<EngineRequest> {
        if (next == requests.size()) return std::nullopt;
        return requests[next++];
      },
      [&](EngineSequence&& sequence) {
        out[static_cast<std::size_t>(sequence.request)][static_cast<std::size_t>(sequence.sample)] =
            std::move(sequence);
        return true;
      });
  if (stats != nullptr) *stats = result;
  return out;
}

}  // namespace qwen
