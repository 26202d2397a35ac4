// The memory plan of a training run (memory_plan.hpp): bytes per phase from the config and the options.
#include "qwen_gsm8k/train/memory_plan.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "qwen_gsm8k/train/optimizer.hpp"

namespace qwen {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

std::string gib_text(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / kGiB);
  return text;
}

int64_t MemoryPhase::bytes() const {
  int64_t total = 0;
  for (const auto& item : items) total += item.bytes;
  return total;
}

const MemoryPhase& MemoryPlan::peak_phase() const {
  if (phases.empty()) throw std::logic_error("memory plan: no phases");
  return *std::max_element(phases.begin(), phases.end(),
                           [](const MemoryPhase& a, const MemoryPhase& b) { return a.bytes() < b.bytes(); });
}

ParameterCounts count_parameters(const Config& config) {
  const int64_t H = config.hidden_size, I = config.intermediate_size, V = config.vocab_size;
  const int64_t kv = config.num_key_value_heads * config.head_dim();
  ParameterCounts counts;
  // q, k, v with biases; o without; gate, up, down.
  counts.layer_linear = (H * H + H) + 2 * (H * kv + kv) + H * H + 3 * H * I;
  const int64_t layer = counts.layer_linear + 2 * H;  // and its two RMS norms
  counts.total = V * H + config.num_hidden_layers * layer + H + (config.tie_word_embeddings ? 0 : V * H);
  return counts;
}

int64_t activation_bytes_per_token(const Config& config, bool autocast, bool eager_attention, bool cuda, int64_t T) {
  const int64_t H = config.hidden_size, I = config.intermediate_size, heads = config.num_attention_heads;
  const bool eager = !cuda && eager_attention;
  if (autocast) return 20 * H + 6 * I + 8 + (eager ? 6 * heads * T : 4 * heads);  // the fused training operators
  return 4 * (12 * H + 4 * I + 2) + (eager ? 4 * heads * T : 4 * heads);
}

MemoryPlan plan_memory(const MemoryPlanInput& input) {
  const Config& c = input.config;
  const TrainOptions& o = input.options;
  if (input.max_prompt_tokens < 1) throw std::invalid_argument("memory plan: max_prompt_tokens must be >= 1");
  if (input.world_size < 1) throw std::invalid_argument("memory plan: world_size must be >= 1");
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, L = c.num_hidden_layers;
  const int64_t D = c.head_dim(), KV = c.num_key_value_heads, heads = c.num_attention_heads;
  const int64_t wb = input.weight_bytes;
  const bool autocast = o.autocast.has_value();
  const int64_t ab = autocast ? 2 : wb;  // the forward's dtype: the autocast one, or the weights'
  const ParameterCounts params = count_parameters(c);
  const int64_t T = input.max_prompt_tokens + o.max_new_tokens;  // the longest row: prompt + response
  const int64_t n = o.rollout_n;
  const auto world = static_cast<int64_t>(input.world_size);

  MemoryPlan plan;
  // Resident in every phase: the weights, AdamW's two moments (in the weights' dtype, from the first update on), the
  // KL reference (its layers' linear weights in the autocast dtype under autocast).
  std::vector<MemoryItem> resident{{"weights", params.total * wb}, {"AdamW state", 2 * params.total * wb}};
  if (input.process_bytes > 0)
    resident.insert(resident.begin(), {"process (LibTorch, tokenizer, data)", input.process_bytes});
  if (o.extras.kl_loss_coef > 0.0) {
    const int64_t linear = L * params.layer_linear;
    resident.push_back({"KL reference", (params.total - linear) * wb + linear * ab});
  }
  const auto phase = [&](std::string name, std::vector<MemoryItem> items) {
    MemoryPhase out{std::move(name), resident};
    out.items.insert(out.items.end(), items.begin(), items.end());
    return out;
  };

  // Rollout: one generate call of this rank's rows; the KV cache at the round's size, in the forward's dtype.
  const int64_t round_prompts = o.gen_batch_size > 0 ? o.gen_batch_size : o.train_batch_size;
  int64_t rows = ceil_div(round_prompts, world) * n;
  if (o.max_rollout_rows > 0) rows = std::min(rows, o.max_rollout_rows);
  const int64_t P = input.max_prompt_tokens;
  const bool eager = !input.cuda && input.eager_attention;
  const int64_t prefill =  // one layer's work on the prompts: the MLP's three I-wide tensors, attention's scores
      rows * P * (3 * I * ab + 6 * H * 4) + (eager ? 2 * rows * heads * P * P * 4 : 0);
  const int64_t sampling = rows * V * 4 * 3 + 2 * rows * T * 8;  // logits, scores, probabilities; ids and mask
  const int64_t compute_copy = autocast && wb != ab ? params.total * ab : 0;
  plan.phases.push_back(phase("rollout", {{"KV cache", L * 2 * rows * KV * T * D * ab},
                                          {"prefill work (one layer)", prefill},
                                          // float32 weights under autocast: the engine computes in a copy in its dtype
                                          {"compute copy of the weights (autocast)", compute_copy},
                                          {"sampling buffers", sampling}}));
  // The engine is kept for the run (its CUDA graphs with it) unless free_cache_engine: its pool and its compute copy
  // stay through the phases that follow.
  if (!o.free_cache_engine) {
    resident.push_back({"rollout engine kept (KV cache, compute copy)", L * 2 * rows * KV * T * D * ab + compute_copy});
  }

  // The micro-batches: this rank's share of a mini-batch, whole groups or a token budget; the worst case is rows of
  // the longest length.
  const int64_t share_groups = ceil_div(o.ppo_mini_batch_size, world);
  const int64_t micro_groups =
      std::min(o.ppo_micro_batch_size > 0 ? o.ppo_micro_batch_size : o.ppo_mini_batch_size, share_groups);
  const int64_t share_tokens = share_groups * n * T;
  int64_t update_tokens = micro_groups * n * T, logprob_tokens = update_tokens;
  if (o.use_dynamic_bsz) {
    update_tokens = std::min(o.ppo_max_token_len_per_gpu, share_tokens);
    const int64_t budget =
        o.log_prob_max_token_len_per_gpu > 0 ? o.log_prob_max_token_len_per_gpu : o.ppo_max_token_len_per_gpu;
    logprob_tokens = std::min(budget, share_tokens);
  }
  const int64_t per_token = activation_bytes_per_token(c, autocast, input.eager_attention, input.cuda, T);
  // The lm-head's log-probs run over the response tokens in chunks of logprob_chunk rows: one [chunk, V] buffer of
  // logits in the forward's dtype, which the backward turns into their gradient in place (dapo::linear_logprobs'
  // kernels on the CPU and, with dapo::cuda, on CUDA: no other buffer).
  const auto lm_head_chunk = [&](int64_t tokens) {
    const int64_t targets = tokens / T * o.max_new_tokens + std::min(tokens % T, o.max_new_tokens);
    return std::min(o.logprob_chunk, targets) * V * ab;
  };

  // Under autocast every weight matrix is cast once per optimizer step and the casts are kept until its last backward
  // (WeightCastScope): the no-grad passes before the first update read the first update's.
  const int64_t weight_casts = autocast ? (L * params.layer_linear + V * H) * 2 : 0;

  // The no-grad log-prob passes: one layer's work at a time, the lm-head's chunk of logits.
  plan.phases.push_back(phase("log-probs", {{"hidden states", logprob_tokens * H * 4 * 2},
                                            {"one layer's work", logprob_tokens * per_token},
                                            {"lm-head chunk", lm_head_chunk(logprob_tokens)},
                                            {"weight casts (autocast)", weight_casts}}));

  // The update's forward and backward, at the start of the backward, where the tracking allocator finds its peak:
  // what the forward kept, the lm-head's chunk, and the lm-head weight's gradient (in the forward's dtype), the first
  // one made. The layers' gradients come as their activations go (a layer's activations outweigh its gradients from
  // about 800 tokens on at the 1.5B shape); all of them together are the next phases'.
  const int64_t gradients = params.total * wb;
  const int64_t activations = o.gradient_checkpointing
                                  ? L * update_tokens * 4 * H + update_tokens * per_token  // inputs, one layer again
                                  : L * update_tokens * per_token;
  plan.phases.push_back(phase("update", {{"lm-head weight gradient", V * H * ab},
                                         {"activations", activations},
                                         {"weight casts (autocast)", weight_casts},
                                         {"embedding and final norm", update_tokens * 16 * H},
                                         {"lm-head chunk", lm_head_chunk(update_tokens)}}));
  // The end of the backward: with tied embeddings, the embedding lookup's gradient beside the gradients (a
  // vocabulary-sized tensor; counted exactly by memory_bench). In float32 the lm-head's part is another, the two added
  // out of place; under autocast the lm-head's cast adds its part into the gradient itself (block_cast) and the
  // lookup's is added to it in place. The weight casts are still there: they go after the optimizer step's last
  // backward, before AdamW's step.
  if (c.tie_word_embeddings) {
    const int64_t parts = autocast ? 1 : 2;
    plan.phases.push_back(phase("update: tied embedding gradient", {{"gradients", gradients},
                                                                    {"embedding gradient parts", parts * V * H * wb},
                                                                    {"weight casts (autocast)", weight_casts}}));
  } else if (autocast) {
    plan.phases.push_back(
        phase("update: end of backward", {{"gradients", gradients}, {"weight casts (autocast)", weight_casts}}));
  }
  // AdamW's step (train/optimizer.hpp). ATen's fused kernel (LibTorch 2.4 and later) updates in place. Parameter by
  // parameter (1.13), the denominator sqrt(v) / sqrt(1 - beta2^t) + eps takes two temporaries of the parameter's size,
  // the largest parameter's being the embedding's.
  std::vector<MemoryItem> step{{"gradients", gradients}};
  if (!ClippedAdamW::fused()) step.push_back({"AdamW work (largest parameter)", 2 * V * H * wb});
  plan.phases.push_back(phase("optimizer step", step));

  plan.rollout_rows = rows;
  plan.longest_row = T;
  plan.update_tokens = update_tokens;
  plan.logprob_tokens = logprob_tokens;
  plan.activation_bytes_per_token = per_token;
  return plan;
}

std::vector<std::string> settings_that_fit(const MemoryPlanInput& input, int64_t available_bytes) {
  const auto fits = [&](const MemoryPlanInput& candidate) {
    return plan_memory(candidate).peak_bytes() <= available_bytes;
  };
  std::vector<std::string> found;
  const TrainOptions& o = input.options;
  const MemoryPlan current = plan_memory(input);  // the settings as given: what each candidate is compared with
  const int64_t longest = input.max_prompt_tokens + o.max_new_tokens;
  for (const bool autocast : {o.autocast.has_value(), true}) {
    for (const bool checkpointing : {o.gradient_checkpointing, true}) {
      MemoryPlanInput candidate = input;
      if (autocast && !o.autocast) candidate.options.autocast = torch::kBFloat16;
      candidate.options.gradient_checkpointing = checkpointing;
      std::string flags = std::string(autocast && !o.autocast ? " --autocast bfloat16" : "") +
                          (checkpointing && !o.gradient_checkpointing ? " --gradient-checkpointing" : "");
      if (!flags.empty() && fits(candidate)) {
        found.push_back(flags.substr(1));
        continue;
      }
      // The largest power-of-two token budget that fits, no smaller than the longest row.
      candidate.options.use_dynamic_bsz = true;
      for (int64_t budget = int64_t{1} << 40; budget >= longest; budget /= 2) {
        candidate.options.ppo_max_token_len_per_gpu = budget;
        candidate.options.log_prob_max_token_len_per_gpu = 0;
        if (budget < current.update_tokens && fits(candidate)) {
          found.push_back(
              (flags + " --use-dynamic-bsz --ppo-max-token-len-per-gpu " + std::to_string(budget)).substr(1));
          break;
        }
      }
    }
  }
  // Where the kept engine tips a later phase over: free it after each step's rollouts (its graphs captured again).
  if (!o.free_cache_engine) {
    MemoryPlanInput freed = input;
    freed.options.free_cache_engine = true;
    if (fits(freed)) found.push_back("--free-cache-engine");
  }
  // Where the rollout is what does not fit: fewer rows per generate call.
  MemoryPlanInput candidate = input;
  const int64_t rows = current.rollout_rows;
  for (int64_t limit = rows / 2; limit >= 1; limit /= 2) {
    candidate.options.max_rollout_rows = limit;
    const MemoryPlan plan = plan_memory(candidate);
    if (plan.phases.front().bytes() <= available_bytes) {
      if (plan.peak_bytes() <= available_bytes) found.push_back("--max-num-seqs " + std::to_string(limit));
      break;
    }
  }
  // Each once, in order.
  std::vector<std::string> unique;
  for (const auto& flags : found) {
    if (std::find(unique.begin(), unique.end(), flags) == unique.end()) unique.push_back(flags);
  }
  return unique;
}

std::vector<std::pair<std::string, int64_t>> MemoryPlan::assumed() const {
  return {{"rollout_rows", rollout_rows},
          {"longest_row_tokens", longest_row},
          {"update_micro_batch_tokens", update_tokens},
          {"logprob_micro_batch_tokens", logprob_tokens},
          {"activation_bytes_per_token_per_layer", activation_bytes_per_token}};
}

std::string MemoryPlan::table() const {
  std::string out;
  const MemoryPhase& peak = peak_phase();
  char line[160];
  for (const auto& phase : phases) {
    std::snprintf(line, sizeof line, "%-36s %12s%s\n", phase.name.c_str(), gib_text(phase.bytes()).c_str(),
                  &phase == &peak ? "  <- peak" : "");
    out += line;
    for (const auto& item : phase.items) {
      if (item.bytes == 0) continue;
      std::snprintf(line, sizeof line, "  %-34s %12s\n", item.name.c_str(), gib_text(item.bytes).c_str());
      out += line;
    }
  }
  out += "assumed:\n";
  for (const auto& [name, value] : assumed()) {
    std::snprintf(line, sizeof line, "  %-34s %12lld\n", name.c_str(), static_cast<long long>(value));
    out += line;
  }
  return out;
}

nlohmann::json MemoryPlan::to_json() const {
  nlohmann::json phases_json = nlohmann::json::array();
  for (const auto& phase : phases) {
    nlohmann::json items = nlohmann::json::object();
    for (const auto& item : phase.items) items[item.name] = item.bytes;
    phases_json.push_back({{"name", phase.name}, {"bytes", phase.bytes()}, {"items", items}});
  }
  nlohmann::json assumed_json = nlohmann::json::object();
  for (const auto& [name, value] : assumed()) assumed_json[name] = value;
  return {{"peak_bytes", peak_bytes()},
          {"peak_phase", peak_phase().name},
          {"phases", phases_json},
          {"assumed", assumed_json}};
}

}  // namespace qwen
