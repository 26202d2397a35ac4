// The DAPO step and everything around it: evaluation, metrics, checkpoints, the report.
#include "qwen_gsm8k/train/trainer.hpp"

#include <dapo/core/sampling.hpp>
#include <dapo/logprob.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <stdexcept>

#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/train/checkpoint.hpp"
#include "qwen_gsm8k/report/report.hpp"
#include "qwen_gsm8k/model/weights.hpp"

namespace qwen {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A seed for each (step, round, purpose), so that every draw depends on the run's seed and its place in the run only:
// a resumed run repeats an uninterrupted one.
uint64_t derived_seed(uint64_t seed, int64_t step, int64_t round, uint64_t purpose) {
  uint64_t x = seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(step + 1)) ^
               (0xBF58476D1CE4E5B9ull * static_cast<uint64_t>(round + 1)) ^ (0x94D049BB133111EBull * (purpose + 1));
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  return x ^ (x >> 32);
}

std::string format_duration(double seconds) {
  const auto total = static_cast<int64_t>(seconds);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof text, "%lldh%02lldm", static_cast<long long>(total / 3600),
                  static_cast<long long>(total % 3600 / 60));
  } else {
    std::snprintf(text, sizeof text, "%lldm%02llds", static_cast<long long>(total / 60),
                  static_cast<long long>(total % 60));
  }
  return text;
}

const char* aggregation_text(dapo::LossAggregation aggregation) {
  return dapo::aggregation_name(aggregation).data();
}

}  // namespace

void TrainOptions::use_grpo_baseline() {
  algorithm = Algorithm::kGrpo;
  loss.clip_low = 0.2;
  loss.clip_high = 0.2;
  loss.aggregation = dapo::LossAggregation::kSeqMeanTokenMean;
  dynamic_sampling = false;
  rewards.overlong_cache = 0;
}

void TrainOptions::validate() const {
  auto require = [](bool condition, const std::string& message) {
    if (!condition) throw std::invalid_argument("train options: " + message);
  };
  require(total_steps >= 0, "total_steps must be >= 0");
  require(train_batch_size >= 1, "train_batch_size must be >= 1 (groups per step)");
  require(gen_batch_size >= 0, "gen_batch_size must be >= 0");
  require(rollout_n >= 2,
          "rollout_n is " + std::to_string(rollout_n) + ", expected >= 2 (group advantages compare responses)");
  require(ppo_mini_batch_size >= 1 && train_batch_size % ppo_mini_batch_size == 0,
          "ppo_mini_batch_size " + std::to_string(ppo_mini_batch_size) + " must divide train_batch_size " +
              std::to_string(train_batch_size));
  const int64_t micro = ppo_micro_batch_size > 0 ? ppo_micro_batch_size : ppo_mini_batch_size;
  require(ppo_mini_batch_size % micro == 0, "ppo_micro_batch_size " + std::to_string(micro) +
                                                " must divide ppo_mini_batch_size " +
                                                std::to_string(ppo_mini_batch_size));
  require(ppo_epochs >= 1, "ppo_epochs must be >= 1");
  require(max_num_gen_batches >= 0, "max_num_gen_batches must be >= 0 (0 = unlimited)");
  require(max_new_tokens >= 1, "max_new_tokens must be >= 1");
  require(rewards.overlong_cache >= 0 && rewards.overlong_cache <= max_new_tokens,
          "overlong_buffer_len " + std::to_string(rewards.overlong_cache) + " must lie in [0, max_new_tokens]");
  require(lr > 0.0 && std::isfinite(lr), "lr must be > 0");
  require(weight_decay >= 0.0, "weight_decay must be >= 0");
  require(grad_clip > 0.0, "grad_clip must be > 0");
  require(warmup_steps >= 0, "warmup_steps must be >= 0");
  require(min_lr_ratio >= 0.0 && min_lr_ratio <= 1.0, "min_lr_ratio must lie in [0, 1]");
  require(eval_problems >= 0 && eval_pass_k >= 0 && eval_every >= 0 && save_every >= 0,
          "eval and save counts must be >= 0");
  require(logprob_chunk >= 1, "logprob_chunk must be >= 1");
  require(!autocast || *autocast == torch::kBFloat16 || *autocast == torch::kHalf,
          "autocast must be bfloat16 or float16 (or off)");
  sampling.validate();
  dapo::detail::check_policy_loss_options(loss, ppo_mini_batch_size * rollout_n, "train options");
}

nlohmann::json TrainOptions::to_json() const {
  return {{"algorithm", algorithm == Algorithm::kDapo ? "dapo" : "grpo"},
          {"total_steps", total_steps},
          {"train_batch_size", train_batch_size},
          {"gen_batch_size", gen_batch_size > 0 ? gen_batch_size : train_batch_size},
          {"rollout_n", rollout_n},
          {"ppo_mini_batch_size", ppo_mini_batch_size},
          {"ppo_micro_batch_size", ppo_micro_batch_size > 0 ? ppo_micro_batch_size : ppo_mini_batch_size},
          {"ppo_epochs", ppo_epochs},
          {"max_num_gen_batches", max_num_gen_batches},
          {"dynamic_sampling", dynamic_sampling},
          {"mask_truncated", mask_truncated},
          {"clip_ratio_low", loss.clip_low},
          {"clip_ratio_high", loss.clip_high},
          {"clip_ratio_c", loss.dual_clip},
          {"loss_agg_mode", aggregation_text(loss.aggregation)},
          {"norm_adv_by_std", advantage.scale_by_std},
          {"max_new_tokens", max_new_tokens},
          {"overlong_buffer_len", rewards.overlong_cache},
          {"overlong_penalty_factor", rewards.overlong_factor},
          {"reward_weights",
           {rewards.correctness_weight, rewards.digit_weight, rewards.format_weight, rewards.mark_weight}},
          {"answer_mode", rewards.answer_mode == dapo::gsm8k::AnswerMode::kSeed ? "seed" : "lenient"},
          {"temperature", sampling.temperature},
          {"top_p", sampling.top_p},
          {"top_k", sampling.top_k},
          {"lr", lr},
          {"weight_decay", weight_decay},
          {"betas", {beta1, beta2}},
          {"warmup_steps", warmup_steps},
          {"lr_schedule", cosine_schedule ? "cosine" : "constant"},
          {"min_lr_ratio", min_lr_ratio},
          {"grad_clip", grad_clip},
          {"autocast", !autocast                       ? "off"
                       : *autocast == torch::kBFloat16 ? "bfloat16"
                                                       : "float16"},
          {"eval_every", eval_every},
          {"eval_problems", eval_problems},
          {"eval_pass_k", eval_pass_k},
          {"save_every", save_every},
          {"seed", seed}};
}

nlohmann::json EvalResult::to_json() const {
  nlohmann::json row{{"step", step}, {"problems", problems}, {"accuracy", accuracy}};
  if (k > 0) {
    row["pass_at_k"] = pass_at_k;
    row["k"] = k;
  }
  return row;
}

RolloutOptions rollout_options(const TrainOptions& options, const Tokenizer& tokenizer) {
  RolloutOptions rollout;
  rollout.group_size = options.rollout_n;
  rollout.generation.max_new_tokens = options.max_new_tokens;
  rollout.generation.sampling = options.sampling;
  rollout.generation.pad_id = tokenizer.pad_token_id().value_or(0);
  for (const char* stop : {"<|im_end|>", "<|endoftext|>"}) {
    if (const auto id = tokenizer.token_to_id(stop)) rollout.generation.stop_ids.push_back(*id);
  }
  rollout.rewards = options.rewards;
  rollout.rewards.max_length = options.max_new_tokens;
  rollout.system_prompt = options.system_prompt;
  rollout.max_batch_rows = options.max_rollout_rows;
  return rollout;
}

Trainer::Trainer(Qwen2ForCausalLM model, Tokenizer tokenizer, std::vector<Problem> train, std::vector<Problem> test,
                 TrainOptions options, std::shared_ptr<Communicator> communicator)
    : model_(std::move(model)),
      tokenizer_(std::move(tokenizer)),
      train_(std::move(train)),
      test_(std::move(test)),
      options_(std::move(options)),
      sampler_(train_.empty() ? 1 : train_.size(), options_.seed),
      communicator_(std::move(communicator)) {
  options_.validate();
  if (train_.empty()) throw std::invalid_argument("trainer: the training set is empty");
  if (communicator_ == nullptr) communicator_ = Communicator::create({}, model_->lm_head_weight().device());
  if (!is_root()) options_.quiet = true;
  if (world_size() > 1) {  // every rank starts from rank 0's weights
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> state;
    for (const auto& parameter : model_->parameters()) state.push_back(parameter);
    for (const auto& buffer : model_->buffers()) state.push_back(buffer);
    communicator_->broadcast(state);
  }
  rollout_options_ = rollout_options(options_, tokenizer_);
  optimizer_ = std::make_unique<torch::optim::AdamW>(model_->parameters(), torch::optim::AdamWOptions(options_.lr)
                                                                               .betas({options_.beta1, options_.beta2})
                                                                               .weight_decay(options_.weight_decay));
  if (!options_.output_dir.empty()) std::filesystem::create_directories(options_.output_dir);
}

std::vector<Group> Trainer::collect_groups(nlohmann::json& metrics) {
  const int64_t target = options_.train_batch_size;
  const int64_t per_round = options_.gen_batch_size > 0 ? options_.gen_batch_size : target;
  RolloutStats stats;
  double reward_sum = 0, reward_squares = 0, correct = 0, responses = 0, length_sum = 0, length_max = 0, truncated = 0;
  double parts[5] = {};  // correctness, digit, format, mark, overlong
  // Metrics describe everything sampled this step, kept or not: that is the policy's current behaviour.
  auto account = [&](const std::vector<Group>& groups, std::vector<double>& accuracy) {
    for (const auto& group : groups) {
      for (const auto& response : group.responses) {
        const double reward = response.score.total;
        reward_sum += reward;
        reward_squares += reward * reward;
        correct += response.score.correct;
        responses += 1;
        length_sum += static_cast<double>(response.ids.size());
        length_max = std::max(length_max, static_cast<double>(response.ids.size()));
        truncated += response.truncated;
        parts[0] += response.score.parts.correctness;
        parts[1] += response.score.parts.digit;
        parts[2] += response.score.parts.hard_format;
        parts[3] += response.score.parts.mark;
        parts[4] += response.score.overlong;
        accuracy.push_back(response.score.correct ? 1.0 : 0.0);
      }
    }
  };
  auto next_groups = [&](int64_t round, int64_t count) {
    std::vector<Problem> problems;
    for (const auto index : sampler_.next(static_cast<std::size_t>(count))) problems.push_back(train_[index]);
    const auto rank = static_cast<uint64_t>(communicator_->rank());
    return round_groups(problems, derived_seed(options_.seed, step_, round, 1 + 16 * rank), stats);
  };
  torch::NoGradGuard no_grad;
  model_->eval();
  std::vector<Group> batch;
  if (options_.dynamic_sampling) {
    // DAPO Eq. 11: draw rounds until train_batch_size groups disagree on accuracy; the surplus is dropped.
    dapo::core::DynamicSampler<Group> sampler(
        {.target_groups = target, .group_size = options_.rollout_n, .max_rounds = options_.max_num_gen_batches});
    for (int64_t round = 0; !sampler.ready(); ++round) {
      std::vector<Group> groups = next_groups(round, per_round);
      std::vector<double> accuracy;
      account(groups, accuracy);
      sampler.add_round(std::move(groups), accuracy);
    }
    batch = sampler.take();
    metrics["gen_rounds"] = sampler.last_rounds();
    metrics["filtered_groups"] = sampler.last_filtered();
    metrics["surplus_groups"] = sampler.last_surplus();
  } else {
    batch = next_groups(0, target);  // GRPO: one round, every group kept
    std::vector<double> accuracy;
    account(batch, accuracy);
    metrics["gen_rounds"] = 1;
    metrics["filtered_groups"] = 0;
    metrics["surplus_groups"] = 0;
  }
  const double mean = reward_sum / responses;
  metrics["reward_mean"] = mean;
  metrics["reward_std"] = std::sqrt(std::max(0.0, reward_squares / responses - mean * mean));
  metrics["reward_correctness"] = parts[0] / responses;
  metrics["reward_digit"] = parts[1] / responses;
  metrics["reward_format"] = parts[2] / responses;
  metrics["reward_mark"] = parts[3] / responses;
  metrics["reward_overlong"] = parts[4] / responses;
  metrics["accuracy"] = correct / responses;
  metrics["response_length_mean"] = length_sum / responses;
  metrics["response_length_max"] = length_max;
  metrics["truncated_fraction"] = truncated / responses;
  metrics["kept_groups"] = static_cast<int64_t>(batch.size());
  metrics["sampled_responses"] = responses;
  // Tokens of all ranks over this rank's generation time (the ranks wait for each other after every round).
  const double generated = communicator_->all_reduce_sum({static_cast<double>(stats.generated_tokens)})[0];
  metrics["rollout_tokens_per_second"] = generated / std::max(stats.seconds, 1e-9);
  metrics["rollout_seconds"] = stats.seconds;
  return batch;
}

std::vector<Group> Trainer::round_groups(const std::vector<Problem>& problems, uint64_t seed, RolloutStats& stats) {
  const auto [begin, end] = communicator_->shard(static_cast<int64_t>(problems.size()));
  const std::vector<Problem> mine(problems.begin() + begin, problems.begin() + end);
  std::vector<Group> own;
  if (options_.fixed_rollouts) {
    own = options_.fixed_rollouts(mine);
  } else if (!mine.empty()) {
    const AutocastGuard autocast(model_->lm_head_weight().device(), options_.autocast);
    own = rollout(model_, tokenizer_, mine, rollout_options_, seed, &stats);
  }
  if (world_size() == 1) return own;
  std::vector<double> packed = encode_groups(own);
  const std::vector<double> lengths = communicator_->all_gather({static_cast<double>(packed.size())});
  const auto longest = static_cast<std::size_t>(*std::max_element(lengths.begin(), lengths.end()));
  packed.resize(longest, 0.0);
  const std::vector<double> all = communicator_->all_gather(packed);
  std::vector<Group> groups;
  for (std::size_t rank = 0; rank < lengths.size(); ++rank) {
    for (auto& group : decode_groups(all.data() + rank * longest, static_cast<std::size_t>(lengths[rank]))) {
      groups.push_back(std::move(group));
    }
  }
  return groups;
}

TrainBatch Trainer::build_batch(const std::vector<Group>& groups) const {
  TrainBatch batch;
  batch.groups = static_cast<int64_t>(groups.size());
  batch.group_size = options_.rollout_n;
  int64_t longest = 0;
  std::vector<double> rewards;
  for (const auto& group : groups) {
    for (const auto& response : group.responses) {
      longest = std::max<int64_t>(longest, static_cast<int64_t>(group.prompt.size() + response.ids.size()));
      rewards.push_back(response.score.total);
    }
  }
  const auto rows = static_cast<int64_t>(rewards.size());
  const int64_t pad = rollout_options_.generation.pad_id;
  batch.input_ids = torch::full({rows, longest}, pad, torch::kInt64);
  batch.attention_mask = torch::zeros({rows, longest}, torch::kInt64);
  batch.loss_mask = torch::zeros({rows, longest - 1}, torch::kBool);
  int64_t row = 0;
  for (const auto& group : groups) {
    const auto prompt = static_cast<int64_t>(group.prompt.size());
    for (const auto& response : group.responses) {
      std::vector<int64_t> sequence = group.prompt;
      sequence.insert(sequence.end(), response.ids.begin(), response.ids.end());
      const auto length = static_cast<int64_t>(sequence.size());
      batch.input_ids[row].narrow(0, 0, length).copy_(torch::tensor(sequence, torch::kInt64));
      batch.attention_mask[row].narrow(0, 0, length).fill_(1);
      const bool counted = !(options_.mask_truncated && response.truncated);
      if (counted && !response.ids.empty()) {
        batch.loss_mask[row].narrow(0, prompt - 1, static_cast<int64_t>(response.ids.size())).fill_(true);
      }
      ++row;
    }
  }
  batch.advantages =
      dapo::group_advantages(torch::tensor(rewards, torch::kFloat64), options_.rollout_n, options_.advantage)
          .to(torch::kFloat32);
  return batch;
}

torch::Tensor Trainer::response_logprobs(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                         const torch::Tensor& loss_mask, double* entropy_sum) {
  const auto device = model_->lm_head_weight().device();
  const torch::Tensor ids = input_ids.to(device), mask = attention_mask.to(device), targets_mask = loss_mask.to(device);
  torch::Tensor hidden;
  {
    const AutocastGuard autocast(device, options_.autocast);
    hidden = model_->hidden_states(ids, mask, position_ids_from_mask(mask));  // [B, L, H]
  }
  const int64_t steps = ids.size(1) - 1;
  torch::Tensor selected = hidden.narrow(1, 0, steps).index({targets_mask});  // [N, H]
  torch::Tensor lm_head = model_->lm_head_weight();
  if (options_.autocast) {  // the lm-head product in the autocast dtype too; linear_logprobs keeps its softmax float32
    selected = selected.to(*options_.autocast);
    lm_head = lm_head.to(*options_.autocast);
  }
  const torch::Tensor targets = ids.narrow(1, 1, steps).index({targets_mask});  // [N]
  const double temperature = options_.sampling.greedy() ? 1.0 : options_.sampling.temperature;
  const auto out = dapo::linear_logprobs(
      selected, lm_head, targets,
      {.chunk_size = options_.logprob_chunk, .temperature = temperature, .with_entropy = entropy_sum != nullptr});
  if (entropy_sum != nullptr) *entropy_sum += out.entropy.sum().item<double>();
  return torch::zeros(targets_mask.sizes(), out.logp.options()).masked_scatter(targets_mask, out.logp);
}

double Trainer::learning_rate(int64_t update) const {
  const double position = static_cast<double>(update + 1);
  const auto warmup = static_cast<double>(options_.warmup_steps);
  if (position <= warmup) return options_.lr * position / warmup;
  if (!options_.cosine_schedule) return options_.lr;
  const double total = static_cast<double>(options_.total_steps * updates_per_step());
  const double progress = std::clamp((position - warmup) / std::max(total - warmup, 1.0), 0.0, 1.0);
  const double cosine = 0.5 * (1.0 + std::cos(3.14159265358979323846 * progress));
  return options_.lr * (options_.min_lr_ratio + (1.0 - options_.min_lr_ratio) * cosine);
}

int64_t Trainer::updates_per_step() const {
  return options_.train_batch_size / options_.ppo_mini_batch_size * options_.ppo_epochs;
}

nlohmann::json Trainer::step() {
  const auto started = Clock::now();
  nlohmann::json metrics{{"step", step_ + 1}};
  const std::vector<Group> groups = collect_groups(metrics);
  TrainBatch batch = build_batch(groups);

  const int64_t group_size = options_.rollout_n;
  const int64_t mini_groups = options_.ppo_mini_batch_size;
  const int64_t micro_groups = options_.ppo_micro_batch_size > 0 ? options_.ppo_micro_batch_size : mini_groups;
  const int64_t minibatches = batch.groups / mini_groups;
  auto rows_of = [&](int64_t first_group, int64_t groups_count) {
    return std::pair<int64_t, int64_t>{first_group * group_size, groups_count * group_size};
  };
  // The micro-batches this rank trains on in mini-batch mb, as (first group, groups): its contiguous share of the
  // mini-batch's groups (all of them in a single process), cut into micro_groups.
  const auto [own_begin, own_end] = communicator_->shard(mini_groups);
  auto micro_batches = [&, own_begin = own_begin, own_end = own_end](int64_t mb) {
    std::vector<std::pair<int64_t, int64_t>> slices;
    for (int64_t g = own_begin; g < own_end; g += micro_groups) {
      slices.emplace_back(mb * mini_groups + g, std::min(micro_groups, own_end - g));
    }
    return slices;
  };
  // The longest real row of a slice: its columns beyond are padding in every row.
  auto trimmed = [&](int64_t first_row, int64_t rows) {
    const torch::Tensor lengths = batch.attention_mask.narrow(0, first_row, rows).sum(1);
    return lengths.max().item<int64_t>();
  };

  // Old log-probs: the training forward without grad, on the same micro-batch slices the updates will use, so that
  // the first update's ratio is exactly 1.
  const auto update_started = Clock::now();
  torch::AutoGradMode enable_grad(true);  // whatever the caller's mode: the updates need gradients
  model_->train();
  double entropy_sum = 0.0;
  // linear_logprobs computes in float32 for float32 and half-precision weights, in float64 for float64 ones.
  const bool float64 = model_->lm_head_weight().scalar_type() == torch::kFloat64;
  batch.old_logp = torch::zeros(batch.loss_mask.sizes(), float64 ? torch::kFloat64 : torch::kFloat32);
  {
    torch::NoGradGuard no_grad;
    for (int64_t mb = 0; mb < minibatches; ++mb) {
      for (const auto& [g, count] : micro_batches(mb)) {
        const auto [first, rows] = rows_of(g, count);
        const int64_t length = trimmed(first, rows);
        const torch::Tensor logp =
            response_logprobs(batch.input_ids.narrow(0, first, rows).narrow(1, 0, length),
                              batch.attention_mask.narrow(0, first, rows).narrow(1, 0, length),
                              batch.loss_mask.narrow(0, first, rows).narrow(1, 0, length - 1), &entropy_sum);
        batch.old_logp.narrow(0, first, rows).narrow(1, 0, length - 1).copy_(logp.cpu());
      }
    }
  }
  const double total_tokens = batch.loss_mask.sum().item<double>();

  // This rank's parts of the step's sums; all-reduced after the updates.
  double dual_clipped = 0, kl = 0, loss_sum = 0, grad_norm_sum = 0;
  std::vector<double> clipped_by_minibatch, tokens_by_minibatch;  // clipped tokens and all tokens, per update
  for (int64_t epoch = 0; epoch < options_.ppo_epochs; ++epoch) {
    for (int64_t mb = 0; mb < minibatches; ++mb) {
      const auto [mb_first, mb_rows] = rows_of(mb * mini_groups, mini_groups);
      const torch::Tensor mb_mask = batch.loss_mask.narrow(0, mb_first, mb_rows);
      const double mb_tokens = mb_mask.sum().item<double>();
      const double mb_nonempty = mb_mask.any(1).sum().item<double>();
      optimizer_->zero_grad();
      double mb_loss = 0, mb_clipped = 0;
      for (const auto& [g, count] : micro_batches(mb)) {
        const auto [first, rows] = rows_of(g, count);
        const int64_t length = trimmed(first, rows);
        const torch::Tensor mask = batch.loss_mask.narrow(0, first, rows).narrow(1, 0, length - 1);
        const torch::Tensor logp =
            response_logprobs(batch.input_ids.narrow(0, first, rows).narrow(1, 0, length),
                              batch.attention_mask.narrow(0, first, rows).narrow(1, 0, length), mask);
        dapo::PolicyLossOptions loss_options = options_.loss;
        loss_options.group_size = group_size;
        // Every micro-batch's loss is its share of the mini-batch's loss.
        double share = 1.0;
        switch (loss_options.aggregation) {
          case dapo::LossAggregation::kTokenMean:
            loss_options.global_token_count = std::max(mb_tokens, 1.0);
            break;
          case dapo::LossAggregation::kGroupTokenMean:
            share = static_cast<double>(count) / static_cast<double>(mini_groups);
            break;
          case dapo::LossAggregation::kSeqMeanTokenMean:
          case dapo::LossAggregation::kSeqMeanTokenSum:
            share = mb_nonempty > 0 ? mask.any(1).sum().item<double>() / mb_nonempty : 0.0;
            break;
          case dapo::LossAggregation::kSeqMeanTokenSumNorm:
            share = static_cast<double>(rows) / static_cast<double>(mb_rows);
            break;
        }
        const auto device = logp.device();
        const auto out =
            dapo::policy_loss(logp, batch.old_logp.narrow(0, first, rows).narrow(1, 0, length - 1).to(device),
                              batch.advantages.narrow(0, first, rows).to(device), mask.to(device), loss_options);
        (out.loss * share).backward();
        const double tokens = mask.sum().item<double>();
        mb_loss += out.loss.item<double>() * share;
        mb_clipped += out.clip_fraction.item<double>() * tokens;
        dual_clipped += out.dual_clip_fraction.item<double>() * tokens;
        kl += out.approx_kl.item<double>() * tokens;
      }
      communicator_->all_reduce_gradients(model_->parameters());  // the sum of the ranks' shares: the mini-batch's
      const double grad_norm = torch::nn::utils::clip_grad_norm_(model_->parameters(), options_.grad_clip);
      const double lr = learning_rate(updates_);
      for (auto& group : optimizer_->param_groups()) {
        static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
      }
      optimizer_->step();
      ++updates_;
      loss_sum += mb_loss;
      grad_norm_sum += grad_norm;
      clipped_by_minibatch.push_back(mb_clipped);
      tokens_by_minibatch.push_back(mb_tokens);
      metrics["lr"] = lr;
    }
  }
  {
    std::vector<double> sums{dual_clipped, kl, loss_sum, entropy_sum};
    sums.insert(sums.end(), clipped_by_minibatch.begin(), clipped_by_minibatch.end());
    sums = communicator_->all_reduce_sum(sums);
    dual_clipped = sums[0], kl = sums[1], loss_sum = sums[2], entropy_sum = sums[3];
    std::copy(sums.begin() + 4, sums.end(), clipped_by_minibatch.begin());
  }
  const double clipped = std::accumulate(clipped_by_minibatch.begin(), clipped_by_minibatch.end(), 0.0);
  std::vector<double> clip_by_minibatch;
  for (std::size_t i = 0; i < clipped_by_minibatch.size(); ++i) {
    clip_by_minibatch.push_back(tokens_by_minibatch[i] > 0 ? clipped_by_minibatch[i] / tokens_by_minibatch[i] : 0.0);
  }
  const double update_seconds = seconds_since(update_started);
  const double counted = std::max(total_tokens * static_cast<double>(options_.ppo_epochs), 1.0);
  metrics["loss"] = loss_sum / static_cast<double>(minibatches * options_.ppo_epochs);
  metrics["clip_fraction"] = clipped / counted;
  metrics["dual_clip_fraction"] = dual_clipped / counted;
  metrics["approx_kl"] = kl / counted;
  metrics["clip_fraction_by_minibatch"] = clip_by_minibatch;
  metrics["entropy"] = total_tokens > 0 ? entropy_sum / total_tokens : 0.0;
  metrics["grad_norm"] = grad_norm_sum / static_cast<double>(minibatches * options_.ppo_epochs);
  metrics["batch_accuracy"] = [&] {
    double correct = 0, count = 0;
    for (const auto& group : groups) {
      for (const auto& response : group.responses) {
        correct += response.score.correct;
        count += 1;
      }
    }
    return correct / count;
  }();
  metrics["update_tokens_per_second"] = batch.attention_mask.sum().item<double>() *
                                        static_cast<double>(options_.ppo_epochs + 1) / std::max(update_seconds, 1e-9);
  metrics["update_seconds"] = update_seconds;
  metrics["step_seconds"] = seconds_since(started);
  ++step_;
  metrics_.push_back(metrics);
  append_jsonl("metrics.jsonl", metrics);
  return metrics;
}

EvalResult Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  model_->eval();
  EvalResult result;
  result.step = step_;
  const auto count = std::min<std::size_t>(static_cast<std::size_t>(options_.eval_problems), test_.size());
  result.problems = static_cast<int64_t>(count);
  if (count == 0) return result;
  // Each rank evaluates its share of the problems; the counts are summed.
  const auto [begin, end] = communicator_->shard(static_cast<int64_t>(count));
  const std::vector<Problem> problems(test_.begin() + begin, test_.begin() + end);
  const AutocastGuard autocast(model_->lm_head_weight().device(), options_.autocast);
  const auto correct = static_cast<double>(greedy_correct(model_, tokenizer_, problems, rollout_options_));
  double passed = 0;
  if (options_.eval_pass_k > 0 && !problems.empty()) {
    RolloutOptions sampled = rollout_options_;
    sampled.group_size = options_.eval_pass_k;
    const auto rank = static_cast<uint64_t>(communicator_->rank());
    for (const auto& group :
         rollout(model_, tokenizer_, problems, sampled, derived_seed(options_.seed, step_, 0, 2 + 16 * rank))) {
      passed += std::any_of(group.responses.begin(), group.responses.end(),
                            [](const Response& response) { return response.score.correct; });
    }
  }
  const std::vector<double> totals = communicator_->all_reduce_sum({correct, passed});
  result.accuracy = totals[0] / static_cast<double>(count);
  if (options_.eval_pass_k > 0) {
    result.k = options_.eval_pass_k;
    result.pass_at_k = totals[1] / static_cast<double>(count);
  }
  evals_.push_back(result.to_json());
  append_jsonl("eval.jsonl", result.to_json());
  return result;
}

void Trainer::run() {
  const auto started = Clock::now();
  auto progress = [&](const std::string& line) {
    if (!options_.quiet) std::printf("%s\n", line.c_str()), std::fflush(stdout);
  };
  // Rank 0 decides (after a resume only it has read the evaluations so far); the others follow.
  if (communicator_->agree(evals_.empty() || evals_.back().at("step") != step_)) {
    const EvalResult eval = evaluate();
    progress("eval  step " + std::to_string(step_) + ": greedy accuracy " + std::to_string(eval.accuracy).substr(0, 5) +
             " on " + std::to_string(eval.problems) + " problems");
  }
  const int64_t first_step = step_;
  while (step_ < options_.total_steps) {
    const nlohmann::json row = step();
    const double elapsed = seconds_since(started);
    const double per_step = elapsed / static_cast<double>(step_ - first_step);
    char line[256];
    std::snprintf(line, sizeof line,
                  "step %lld/%lld | reward %.3f | acc %.3f | len %.1f | clip %.4f | rounds %lld | %.1f s/step | "
                  "left %s",
                  static_cast<long long>(step_), static_cast<long long>(options_.total_steps),
                  row.at("reward_mean").get<double>(), row.at("accuracy").get<double>(),
                  row.at("response_length_mean").get<double>(), row.at("clip_fraction").get<double>(),
                  static_cast<long long>(row.at("gen_rounds").get<int64_t>()), row.at("step_seconds").get<double>(),
                  format_duration(per_step * static_cast<double>(options_.total_steps - step_)).c_str());
    progress(line);
    if (options_.eval_every > 0 && step_ % options_.eval_every == 0 && step_ < options_.total_steps) {
      const EvalResult eval = evaluate();
      progress("eval  step " + std::to_string(step_) + ": greedy accuracy " +
               std::to_string(eval.accuracy).substr(0, 5));
    }
    if (options_.save_every > 0 && step_ % options_.save_every == 0 && step_ < options_.total_steps &&
        !options_.output_dir.empty() && is_root()) {
      save_checkpoint();
    }
  }
  if (communicator_->agree(evals_.empty() || evals_.back().at("step") != step_)) {
    const EvalResult eval = evaluate();
    progress("eval  step " + std::to_string(step_) + ": greedy accuracy " + std::to_string(eval.accuracy).substr(0, 5));
  }
  if (!options_.output_dir.empty() && is_root()) {
    save_checkpoint();
    write_report();
  }
}

void Trainer::append_jsonl(const char* file, const nlohmann::json& row) const {
  if (options_.output_dir.empty() || !is_root()) return;
  std::ofstream out(options_.output_dir / file, std::ios::app);
  out << row.dump() << "\n";
  if (!out) throw std::runtime_error((options_.output_dir / file).string() + ": write failed (disk full?)");
}

void Trainer::write_report() const {
  nlohmann::json summary{{"steps", step_}, {"settings", options_.to_json()}};
  if (!evals_.empty()) {
    summary["first_eval_accuracy"] = evals_.front().at("accuracy");
    summary["final_accuracy"] = evals_.back().at("accuracy");
  }
  qwen::write_report(options_.output_dir, metrics_, evals_, summary);
}

std::filesystem::path Trainer::save_checkpoint() {
  if (options_.output_dir.empty()) throw std::logic_error("save_checkpoint: no output_dir");
  if (!is_root()) throw std::logic_error("save_checkpoint: only rank 0 writes checkpoints");
  char name[32];
  std::snprintf(name, sizeof name, "step-%06lld", static_cast<long long>(step_));
  return commit_checkpoint(
      options_.output_dir / "checkpoints", name,
      [&](const std::filesystem::path& dir) {
        save_model(model_, dir);
        torch::serialize::OutputArchive archive;
        optimizer_->save(archive);
        archive.save_to((dir / "optimizer.pt").string());
        if (!options_.tokenizer_dir.empty()) {
          for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
            if (std::filesystem::exists(options_.tokenizer_dir / file)) {
              std::filesystem::copy_file(options_.tokenizer_dir / file, dir / file);
            }
          }
        }
        const nlohmann::json state{{"step", step_},
                                   {"updates", updates_},
                                   {"sampler", sampler_.state()},
                                   {"options", options_.to_json()},
                                   {"metrics_rows", metrics_.size()},
                                   {"eval_rows", evals_.size()}};
        write_file_atomically(dir / "trainer_state.json", state.dump(2) + "\n");
      },
      options_.keep_checkpoints);
}

void Trainer::resume(const std::filesystem::path& checkpoint) {
  const auto dir = find_checkpoint(checkpoint);
  if (!dir) throw std::runtime_error(checkpoint.string() + ": no checkpoint (no trainer_state.json and no latest)");
  std::ifstream in(*dir / "trainer_state.json");
  const nlohmann::json state = nlohmann::json::parse(in);
  const nlohmann::json saved_options = state.at("options");
  nlohmann::json current = options_.to_json();
  for (const char* volatile_key : {"total_steps", "eval_every", "save_every"}) {  // may change on resume
    current.erase(volatile_key);
  }
  for (const auto& [key, value] : current.items()) {
    if (saved_options.contains(key) && saved_options.at(key) != value) {
      throw std::invalid_argument((*dir / "trainer_state.json").string() + ": option " + key + " was " +
                                  saved_options.at(key).dump() + " in the checkpointed run but is " + value.dump() +
                                  " now; resume with the same settings");
    }
  }
  load_weights(model_, *dir);
  torch::serialize::InputArchive archive;
  archive.load_from((*dir / "optimizer.pt").string());
  optimizer_->load(archive);
  step_ = state.at("step");
  updates_ = state.at("updates");
  sampler_ = ProblemSampler::from_state(state.at("sampler"));
  // Keep the rows the checkpointed run had written; drop those of steps after it.
  metrics_.clear();
  evals_.clear();
  if (!options_.output_dir.empty() && is_root()) {
    const auto rows = [&](const char* file, std::size_t keep, std::vector<nlohmann::json>& into) {
      const auto path = options_.output_dir / file;
      if (!std::filesystem::exists(path)) return;
      auto all = read_json_lines(path);
      if (all.size() > keep) all.resize(keep);
      into = all;
      std::string text;
      for (const auto& row : into) text += row.dump() + "\n";
      write_file_atomically(path, text);
    };
    rows("metrics.jsonl", state.at("metrics_rows").get<std::size_t>(), metrics_);
    rows("eval.jsonl", state.at("eval_rows").get<std::size_t>(), evals_);
  }
}

}  // namespace qwen
