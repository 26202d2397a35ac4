// The model runner: prefills and first tokens, the decode step, the check's reads and compaction's moves.
#include "qwen_gsm8k/engine/model_runner.hpp"

#include <algorithm>
#include <limits>
#include <utility>

#include "qwen_gsm8k/engine/sequence_random.hpp"
#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/fused_ops.hpp"
#include "qwen_gsm8k/model/host_door.hpp"
#include "qwen_gsm8k/model/kv_cache.hpp"

namespace qwen {

ModelRunner::ModelRunner(Qwen2ForCausalLM& model, const EngineOptions& options, torch::ScalarType compute_dtype,
                         std::shared_ptr<GraphRecorder> recorder)
    : model_(model),
      options_(options),
      device_(model->lm_head_weight().device()),
      slots_(options.max_num_seqs),
      capacity_(options.max_prompt_tokens + options.max_new_tokens),
      cache_dtype_(compute_dtype),
      cache_(model->config(), slots_, capacity_, model->lm_head_weight().options().dtype(cache_dtype_)),
      copy_(model->lm_head_weight().scalar_type() == compute_dtype
                ? nullptr
                : std::make_unique<ComputeCopy>(model, compute_dtype)),
      graphs_(device_, options.cuda_graphs, std::move(recorder)) {
  const auto longs = torch::TensorOptions().dtype(torch::kInt64).device(device_);
  const int64_t width = options.max_new_tokens;
  next_token_ = torch::zeros({slots_}, longs);
  positions_ = torch::zeros({slots_}, longs);
  generated_index_ = torch::zeros({slots_}, longs);
  finished_at_ = torch::full({slots_}, -1, longs);
  tokens_ = torch::zeros({slots_, width}, longs);
  stop_ids_ = host_door::to_device(options.stop_ids.empty() ? std::vector<int64_t>{-1} : options.stop_ids, device_);
}

void ModelRunner::begin(EngineStats& stats, const RunOptions& run) {
  stats_ = &stats;
  run_ = run;
  variant_ = std::find(variants_.begin(), variants_.end(), run) - variants_.begin();
  if (variant_ == static_cast<int64_t>(variants_.size())) variants_.push_back(run);
  const auto buffer = [&](const char* name, bool wanted, std::vector<int64_t> shape, torch::ScalarType dtype) {
    if (!wanted) return torch::Tensor();
    torch::Tensor& kept = kept_buffers_[name];
    if (!kept.defined()) kept = torch::zeros(shape, torch::TensorOptions().dtype(dtype).device(device_));
    return kept;
  };
  const int64_t width = options_.max_new_tokens;
  logprobs_ = buffer("logprobs", run.return_logprobs, {slots_, width}, torch::kFloat32);
  seen_ = buffer("seen", run.sampling.repetition_penalty != 1.0, {slots_, capacity_}, torch::kInt64);
  uniforms_ = buffer("uniforms", !run.sampling.greedy(), {slots_, width}, torch::kFloat32);
  per_row_ = {&next_token_, &positions_, &generated_index_, &finished_at_, &tokens_};
  for (torch::Tensor* optional : {&logprobs_, &seen_, &uniforms_}) {
    if (optional->defined()) per_row_.push_back(optional);
  }
  stats_->cache_bytes = cache_.bytes();
  kept_.clear();
  // Free slots as a fresh pool's: the padding rows of a rounded step read them (positions stay in range).
  positions_.zero_();
  generated_index_.zero_();
  finished_at_.fill_(-1);
  if (copy_) copy_->refresh();
  // The graphs read the weights where they were at the end of the last run: a weight replaced since then (not
  // changed in place) means capturing again. Reading the addresses also makes RoPE's table for every position a slot
  // holds, before any step.
  if (weight_addresses() != weight_addresses_) graphs_.clear();
}

void ModelRunner::end() {
  weight_addresses_ = weight_addresses();
}

std::vector<const void*> ModelRunner::weight_addresses() {
  std::vector<const void*> addresses;
  for (const auto& parameter : compute()->parameters()) addresses.push_back(parameter.data_ptr());
  // RoPE's table too: a longer one asked for elsewhere (a generate() call on the same model) replaces it.
  const auto [cos, sin] = compute()->model->rotary_emb->table(capacity_, cache_dtype_);
  addresses.push_back(cos.data_ptr());
  addresses.push_back(sin.data_ptr());
  return addresses;
}

// Prompts right-padded into one batch, positions from 0.
ModelRunner::Prefill ModelRunner::prefill(const std::vector<const std::vector<int64_t>*>& prompts) {
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
    stats_->prefill_tokens += length;
  }
  ids = host_door::to_device(ids, device_);
  mask = host_door::to_device(mask, device_);
  KVCache cache(model_->config(), count, longest, model_->lm_head_weight().options().dtype(cache_dtype_));
  const torch::Tensor hidden = compute()->model->forward(ids, mask, position_ids_from_mask(mask), &cache);
  const torch::Tensor rows = torch::arange(count, ids.options());
  const torch::Tensor last_hidden = hidden.index({rows, host_door::to_device(last, device_)});  // [P, H]
  Prefill out;
  out.logits = compute()->logits(last_hidden);  // in the compute dtype, as the decode step's
  for (int64_t layer = 0; layer < model_->config().num_hidden_layers; ++layer) {
    out.keys.push_back(cache.layer_keys(layer));
    out.values.push_back(cache.layer_values(layer));
  }
  ++stats_->prefill_calls;
  stats_->prefill_rows += count;
  return out;
}

void ModelRunner::admit(const Admission& admission) {
  Prefill fresh;
  if (!admission.prefill.empty()) fresh = prefill(admission.prefill);
  const auto longs = torch::TensorOptions().dtype(torch::kInt64);
  std::vector<torch::Tensor> first_logits;
  std::vector<int64_t> fresh_slots, fresh_rows, kept_slots;
  const Prefill* kept = nullptr;  // the half-admitted request's kept prefill (one such request at a time)
  for (const Admission::Placed& placed : admission.placed) {
    if (placed.prefill_row >= 0) {
      fresh_slots.push_back(placed.slot);
      fresh_rows.push_back(placed.prefill_row);
      first_logits.push_back(fresh.logits.narrow(0, placed.prefill_row, 1));
    } else {
      kept_slots.push_back(placed.slot);
      kept = &kept_.at(placed.request);
      first_logits.push_back(kept->logits);
    }
  }
  if (!kept_slots.empty()) {
    const auto slots = static_cast<int64_t>(kept_slots.size());
    cache_.fill(host_door::to_device(kept_slots, device_), kept->keys, kept->values,
                torch::zeros({slots}, longs.device(device_)));
  }
  if (!fresh_slots.empty()) {
    cache_.fill(host_door::to_device(fresh_slots, device_), fresh.keys, fresh.values,
                host_door::to_device(fresh_rows, device_));
  }
  for (const Admission::Keep& keep : admission.keep) {
    Prefill& saved = kept_[keep.request];
    for (std::size_t layer = 0; layer < fresh.keys.size(); ++layer) {
      saved.keys.push_back(fresh.keys[layer].narrow(0, keep.prefill_row, 1).narrow(2, 0, keep.prompt_length).clone());
      saved.values.push_back(
          fresh.values[layer].narrow(0, keep.prefill_row, 1).narrow(2, 0, keep.prompt_length).clone());
    }
    saved.logits = fresh.logits.narrow(0, keep.prefill_row, 1).clone();
  }
  draw_first_tokens(admission, first_logits);
  for (const int64_t request : admission.release) kept_.erase(request);
}

// The placed sequences' device state, then their first tokens, drawn from their prompts' last logits.
void ModelRunner::draw_first_tokens(const Admission& admission, const std::vector<torch::Tensor>& first_logits) {
  const auto longs = torch::TensorOptions().dtype(torch::kInt64);
  const auto count = static_cast<int64_t>(admission.placed.size());
  const int64_t width = options_.max_new_tokens;
  torch::Tensor positions = torch::empty({count}, longs);
  torch::Tensor uniforms =
      uniforms_.defined() ? torch::empty({count, width}, longs.dtype(torch::kFloat32)) : torch::Tensor();
  torch::Tensor seen = seen_.defined() ? torch::empty({count, capacity_}, longs) : torch::Tensor();
  for (int64_t c = 0; c < count; ++c) {
    const Admission::Placed& placed = admission.placed[static_cast<std::size_t>(c)];
    const EngineRequest& request = *placed.source;
    const auto length = static_cast<int64_t>(request.prompt.size());
    positions[c] = length;
    if (uniforms.defined()) {
      const uint64_t seed = sequence_seed(request.seed, placed.sample);
      auto* u = uniforms[c].data_ptr<float>();
      for (int64_t t = 0; t < width; ++t) u[t] = sequence_uniform(seed, t);
    }
    if (seen.defined()) {  // padding past the sequence repeats its first token: the penalty sees only its own
      seen[c].fill_(request.prompt.front());
      seen[c].narrow(0, 0, length).copy_(torch::tensor(request.prompt, longs));
    }
  }
  const int64_t start = admission.placed.front().slot;
  const torch::Tensor slots = torch::arange(start, start + count, longs.device(device_));
  const torch::Tensor logits = torch::cat(first_logits, 0);  // [M, V]
  if (uniforms.defined()) {
    uniforms = host_door::to_device(uniforms, device_);
    uniforms_.index_copy_(0, slots, uniforms);
  }
  if (seen.defined()) seen = host_door::to_device(seen, device_);
  // The first uniforms as one contiguous column: what the sampler's CUDA kernel takes.
  const auto [token, logprob] = draw(logits, seen.defined() ? seen.narrow(1, 0, admission.longest_prompt) : seen,
                                     uniforms.defined() ? uniforms.select(1, 0).contiguous() : uniforms);
  positions = host_door::to_device(positions, device_);
  if (seen.defined()) {
    seen.scatter_(1, positions.unsqueeze(1), token.unsqueeze(1));
    seen_.index_copy_(0, slots, seen);
  }
  torch::Tensor tokens = torch::zeros({count, width}, token.options());
  tokens.select(1, 0).copy_(token);
  tokens_.index_copy_(0, slots, tokens);
  if (logprobs_.defined()) {
    torch::Tensor logprobs = torch::zeros({count, width}, logprobs_.options());
    logprobs.select(1, 0).copy_(logprob);
    logprobs_.index_copy_(0, slots, logprobs);
  }
  next_token_.index_copy_(0, slots, token);
  positions_.index_copy_(0, slots, positions);
  generated_index_.index_fill_(0, slots, 1);
  finished_at_.index_copy_(0, slots, torch::where(is_stop(token), torch::zeros_like(token), -torch::ones_like(token)));
}

torch::Tensor ModelRunner::is_stop(const torch::Tensor& token) const {
  return (token.unsqueeze(1) == stop_ids_.unsqueeze(0)).any(1);
}

// With no processor but the temperature (the trainer's rollouts, the greedy runs), one fused operator draws from the
// logits and gives the log-prob from the same reads; with a repetition penalty, top-k or top-p it draws from the
// processed scores, and the log-prob takes its own pass over the logits.
std::pair<torch::Tensor, torch::Tensor> ModelRunner::draw(const torch::Tensor& logits, const torch::Tensor& seen,
                                                          const torch::Tensor& uniforms) const {
  const SamplingOptions& sampling = run_.sampling;
  const double temperature = sampling.greedy() ? 1.0 : sampling.temperature;
  if (!sampling.filtered()) {
    auto [token, logprob] = fused::sample_tokens(logits, uniforms, temperature);
    return {std::move(token), logprobs_.defined() ? std::move(logprob) : torch::Tensor()};
  }
  torch::Tensor token = fused::sample_tokens(process_logits(logits, seen, sampling), uniforms, 1.0).first;
  if (!logprobs_.defined()) return {std::move(token), torch::Tensor()};
  // No division where the temperature is 1: x / 1 is x, so the same bits with one pass fewer.
  const torch::Tensor x = logits.to(torch::kFloat32);
  const torch::Tensor scaled = temperature == 1.0 ? x : x / temperature;
  torch::Tensor logprob = scaled.log_softmax(-1).gather(1, token.unsqueeze(1)).squeeze(1);
  return {std::move(token), std::move(logprob)};
}

void ModelRunner::decode(const StepShape& shape) {
  if (shape.reset_padding) {
    positions_.narrow(0, shape.live, shape.rows - shape.live).zero_();
    generated_index_.narrow(0, shape.live, shape.rows - shape.live).zero_();
  }
  if (rounded_shapes()) {
    graphs_.run({shape.rows, shape.window, variant_}, [this, shape] { decode_step(shape.rows, shape.window); });
  } else {
    decode_step(shape.rows, shape.window);
  }
}

// Over slots [0, rows) and positions [0, window): the same operators on the same buffers for the same (rows, window),
// and no host synchronisation, so that a CUDA graph can replay it.
void ModelRunner::decode_step(int64_t rows, int64_t window) {
  const torch::Tensor positions = positions_.narrow(0, 0, rows), index = generated_index_.narrow(0, 0, rows);
  const torch::Tensor keys = torch::arange(window, positions.options());
  // In the dtype the attention takes it in (no cast in the step).
  const torch::Tensor mask = torch::zeros({rows, window}, positions.options().dtype(cache_dtype_))
                                 .masked_fill(keys.unsqueeze(0) > positions.unsqueeze(1), mask_lowest(cache_dtype_))
                                 .view({rows, 1, 1, window});
  cache_.set_step(rows, positions, window);
  const torch::Tensor hidden = compute()->model->forward_with_mask(next_token_.narrow(0, 0, rows).unsqueeze(1), mask,
                                                                   positions.unsqueeze(1), &cache_);
  // [R, V] in the compute dtype: the sampler reads it as it is (no cast of the logits).
  const torch::Tensor logits = compute()->logits(hidden.select(1, 0));
  const torch::Tensor seen = seen_.defined() ? seen_.narrow(0, 0, rows).narrow(1, 0, window) : seen_;
  const torch::Tensor uniforms =
      uniforms_.defined() ? uniforms_.narrow(0, 0, rows).gather(1, index.unsqueeze(1)).squeeze(1) : uniforms_;
  const auto [token, logprob] = draw(logits, seen, uniforms);
  tokens_.narrow(0, 0, rows).scatter_(1, index.unsqueeze(1), token.unsqueeze(1));
  if (logprobs_.defined()) logprobs_.narrow(0, 0, rows).scatter_(1, index.unsqueeze(1), logprob.unsqueeze(1));
  if (seen_.defined()) seen_.narrow(0, 0, rows).scatter_(1, (positions + 1).unsqueeze(1), token.unsqueeze(1));
  const torch::Tensor finished = finished_at_.narrow(0, 0, rows);
  finished.copy_(torch::where(finished.lt(0) & is_stop(token), index, finished));
  positions.add_(1);
  index.add_(1);
  next_token_.narrow(0, 0, rows).copy_(token);
}

std::vector<int64_t> ModelRunner::finished_flags(int64_t rows) const {
  const torch::Tensor finished = host_door::read(finished_at_.narrow(0, 0, rows));
  const auto* values = finished.data_ptr<int64_t>();
  return {values, values + rows};
}

ModelRunner::Outputs ModelRunner::fetch_outputs(const std::vector<int64_t>& rows) const {
  const torch::Tensor index = host_door::to_device(rows, device_);
  Outputs out;
  out.tokens = host_door::Fetch(tokens_.index_select(0, index));
  if (logprobs_.defined()) out.logprobs = host_door::Fetch(logprobs_.index_select(0, index));
  return out;
}

void ModelRunner::move(const Compaction& moves) {
  if (moves.empty()) return;
  const torch::Tensor to_index = host_door::to_device(moves.to, device_);
  const torch::Tensor from_index = host_door::to_device(moves.from, device_);
  cache_.move(to_index, from_index, moves.width);
  for (torch::Tensor* tensor : per_row_) tensor->index_copy_(0, to_index, tensor->index_select(0, from_index));
}

}  // namespace qwen
