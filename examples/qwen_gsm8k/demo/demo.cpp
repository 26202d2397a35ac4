// The built-in demo: tiny model, byte tokenizer, generated problems, warm start, then DAPO (or GRPO).
#include "qwen_gsm8k/demo/demo.hpp"

#include <torch/cuda.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

#include "qwen_gsm8k/common/atomic_file.hpp"
#include "qwen_gsm8k/common/run_directory.hpp"
#include "qwen_gsm8k/demo/demo_problems.hpp"
#include "qwen_gsm8k/model/device_check.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/text/chat.hpp"
#include "qwen_gsm8k/train/batch.hpp"
#include "qwen_gsm8k/train/rollout.hpp"

namespace qwen {
namespace {

// Short, so the byte-level prompt stays short; the same format the seed's system prompt asks for.
constexpr const char* kDemoSystemPrompt = "Answer with <think> then <answer>.";

// Qwen2.5's chat template (the prompts are rendered in its format) and its NFC normalisation, so that the checkpoints'
// tokenizer files say so and transformers, which reads a qwen2 directory's tokenizer as Qwen2Tokenizer, encodes as we
// do.
Tokenizer demo_tokenizer() {
  return Tokenizer::byte_level({"<|endoftext|>", "<|im_start|>", "<|im_end|>"},
                               {.chat_template = std::string(qwen25_chat_template()), .nfc = true});
}

struct WarmStart {
  int64_t steps = 0;
  double check_accuracy = 0.0;  // on the training-form check problems, at the end
  bool stopped = false;         // by options.stop_request
};

// Supervised warm start: teacher forcing on prompt + worked solution + <|im_end|>, mean NLL over the answer tokens,
// until the check accuracy is reached (see DemoOptions). Data parallel like the trainer: each rank takes its share
// of every batch and of the check problems; the loss is each rank's part of the mean over the batch's answer tokens.
WarmStart warm_start(Qwen2ForCausalLM& model, const Tokenizer& tokenizer, const std::vector<Problem>& train,
                     const DemoOptions& options, const TrainOptions& train_options, Communicator& communicator) {
  const std::string& system_prompt = train_options.system_prompt;
  std::vector<Problem> check;
  ProblemSampler check_sampler(train.size(), options.seed ^ 0xC4ECull);
  {
    const auto indices = check_sampler.next(static_cast<std::size_t>(options.sft_check_problems));
    const auto [begin, end] = communicator.shard(static_cast<int64_t>(indices.size()));
    for (int64_t i = begin; i < end; ++i) check.push_back(train[indices[static_cast<std::size_t>(i)]]);
  }
  WarmStart result;
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(options.sft_lr).weight_decay(0.0));
  ProblemSampler sampler(train.size(), options.seed ^ 0x5F7ull);
  const int64_t end_id = *tokenizer.token_to_id("<|im_end|>"), pad_id = *tokenizer.pad_token_id();
  model->train();
  for (int64_t step = 0; step < options.sft_steps; ++step) {
    std::vector<BatchRow> rows;
    const auto indices = sampler.next(static_cast<std::size_t>(options.sft_batch));
    const auto [begin, end] = communicator.shard(static_cast<int64_t>(indices.size()));
    for (int64_t i = begin; i < end; ++i) {
      const auto index = indices[static_cast<std::size_t>(i)];
      BatchRow row{prompt_ids(tokenizer, system_prompt, train[index].question), 0, true};
      row.prompt_length = static_cast<int64_t>(row.tokens.size());
      for (const int32_t id : tokenizer.encode(demo_solution(train[index]))) row.tokens.push_back(id);
      row.tokens.push_back(end_id);
      rows.push_back(std::move(row));
    }
    const PaddedBatch batch = pad_rows(rows, pad_id);  // built on the CPU; target_logprobs copies it to the device
    const torch::Tensor logp = target_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask, {}).logp;
    torch::Tensor loss;
    if (communicator.world_size() == 1) {
      loss = -logp.mean();
    } else {
      const double tokens = communicator.all_reduce_sum({static_cast<double>(logp.numel())})[0];
      loss = -logp.sum() / tokens;
    }
    optimizer.zero_grad();
    loss.backward();
    communicator.all_reduce_gradients(model->parameters());
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    optimizer.step();
    result.steps = step + 1;
    // As the trainer does: summed over the ranks, so that every rank leaves the loop after the same update.
    const bool asked = options.stop_request && options.stop_request();
    if (communicator.all_reduce_sum({asked ? 1.0 : 0.0})[0] > 0) {
      result.stopped = true;
      return result;
    }
    const bool close = result.check_accuracy >= options.sft_target_accuracy - 0.15;
    const int64_t every = close ? std::min<int64_t>(5, options.sft_check_every) : options.sft_check_every;
    if (result.steps >= options.sft_min_steps && result.steps % every == 0) {
      const auto correct =
          static_cast<double>(greedy_correct(model, tokenizer, check, rollout_options(train_options, tokenizer)));
      result.check_accuracy =
          communicator.all_reduce_sum({correct})[0] / static_cast<double>(options.sft_check_problems);
      model->train();
      if (!options.quiet && communicator.is_root()) {
        std::printf("warm start %lld | nll %.4f | greedy accuracy on %lld training problems %.3f\n",
                    static_cast<long long>(result.steps), -logp.mean().item<double>(),  // rank 0's share
                    static_cast<long long>(options.sft_check_problems), result.check_accuracy);
        std::fflush(stdout);
      }
      if (result.check_accuracy >= options.sft_target_accuracy) break;
    }
  }
  return result;
}

// summary.json: the before/after accuracies, the warm start, timings and every setting.
nlohmann::json demo_summary(const DemoOptions& options, const TrainOptions& train_options,
                            const std::vector<nlohmann::json>& evals, int ranks, torch::Device device,
                            const WarmStart& warm, double warm_seconds, double wall) {
  nlohmann::json summary{{"algorithm", options.algorithm == Algorithm::kDapo ? "dapo" : "grpo"},
                         {"seed", options.seed},
                         {"ranks", ranks},
                         {"device", device.str()},
                         {"sft_accuracy", evals.front().at("accuracy")},
                         {"final_accuracy", evals.back().at("accuracy")},
                         {"best_accuracy", 0.0},
                         {"eval_problems", options.eval_problems},
                         {"warm_start_seconds", warm_seconds},
                         {"warm_start_steps", warm.steps},
                         {"warm_start_check_accuracy", warm.check_accuracy},
                         {"wall_seconds", wall},
                         {"evals", evals},
                         {"settings",
                          {{"sft_max_steps", options.sft_steps},
                           {"sft_min_steps", options.sft_min_steps},
                           {"sft_target_accuracy", options.sft_target_accuracy},
                           {"sft_batch", options.sft_batch},
                           {"sft_lr", options.sft_lr},
                           {"rl_steps", options.rl_steps},
                           {"rl_lr", options.rl_lr},
                           {"rl_warmup_steps", options.rl_warmup_steps},
                           {"rl_groups", options.rl_groups},
                           {"rl_mini_groups", options.rl_mini_groups},
                           {"rollout_n", options.rollout_n},
                           {"ppo_epochs", options.ppo_epochs},
                           {"cosine_schedule", options.cosine_schedule},
                           {"model", demo_model_config().to_json()},
                           {"train", train_options.to_json()}}}};
  for (const auto& eval : evals)
    summary["best_accuracy"] = std::max(summary["best_accuracy"].get<double>(), eval.at("accuracy").get<double>());
  return summary;
}

void print_demo_table(const DemoOptions& options, const nlohmann::json& summary) {
  const double before = summary["sft_accuracy"].get<double>(), after = summary["final_accuracy"].get<double>();
  std::printf("\n%-28s %10s\n", "greedy accuracy (held out)", "value");
  std::printf("%-28s %10.3f\n", "after warm start", before);
  std::printf("%-28s %10.3f\n", options.algorithm == Algorithm::kDapo ? "after DAPO" : "after GRPO", after);
  std::printf("%-28s %+10.3f\n", "change", after - before);
  std::printf("%-28s %9.0fs\n", "wall time", summary["wall_seconds"].get<double>());
  std::printf("report: %s\n", RunDirectory{options.output_dir}.report().string().c_str());
}

}  // namespace

void check_demo_device(torch::Device device) {
  check_device(device, "demo");
}

Config demo_model_config() {
  return Config::from_json({{"model_type", "qwen2"},
                            {"vocab_size", 259},
                            {"hidden_size", 64},
                            {"intermediate_size", 192},
                            {"num_hidden_layers", 3},
                            {"num_attention_heads", 4},
                            {"num_key_value_heads", 2},
                            {"max_position_embeddings", 512},
                            {"rms_norm_eps", 1e-6},
                            {"rope_theta", 10000.0},
                            {"tie_word_embeddings", true},
                            {"bos_token_id", 257},
                            {"eos_token_id", 258},
                            {"pad_token_id", 256}},
                           "the built-in demo model");
}

TrainOptions demo_train_options(const DemoOptions& options) {
  TrainOptions train;
  train.total_steps = options.rl_steps;
  train.train_batch_size = options.rl_groups;
  train.gen_batch_size = options.rl_groups;
  train.rollout_n = options.rollout_n;
  train.ppo_mini_batch_size = options.rl_mini_groups;  // several updates per step: all but the first are off-policy
  train.ppo_epochs = options.ppo_epochs;
  train.cosine_schedule = options.cosine_schedule;
  train.max_num_gen_batches = options.max_num_gen_batches;
  train.max_new_tokens = 64;
  train.rewards.overlong_cache = 8;  // answers are ~50 tokens; shaping starts at 56
  train.sampling.temperature = 1.0;
  train.system_prompt = kDemoSystemPrompt;
  train.lr = options.rl_lr;  // a 165K-parameter model, not an LLM
  train.weight_decay = 0.0;
  train.warmup_steps = options.rl_warmup_steps;
  train.shared_prompt = options.shared_prompt;
  train.eval_every = options.eval_every;
  train.eval_problems = options.eval_problems;
  train.save_every = 0;
  train.seed = options.seed;
  train.output_dir = options.output_dir;
  train.quiet = options.quiet;
  train.loggers = options.loggers;
  train.log_rollouts = options.log_rollouts;
  if (options.algorithm == Algorithm::kGrpo) train.use_grpo_baseline();
  train.loss.mode = options.policy_loss;
  train.loss.tau_pos = options.tau_pos;
  train.loss.tau_neg = options.tau_neg;
  train.loss.dro_beta = options.dro_beta;
  train.loss.aggregation = dapo::verl_aggregation(options.policy_loss, train.loss.aggregation);
  // Each loss with its published clip: GSPO's on the sequence ratio (3e-4 / 4e-4, the GSPO paper's and verl's
  // recipe; DAPO's 0.2 / 0.28 hardly binds a mean log-ratio, and four updates a step then collapse the demo model);
  // CISPO's upper bound only (MiniMax-M1: the IS weight is truncated from above), at DAPO's 0.28.
  if (options.policy_loss == dapo::PolicyLossMode::kGspo) {
    train.loss.clip_low = 3e-4;
    train.loss.clip_high = 4e-4;
  } else if (options.policy_loss == dapo::PolicyLossMode::kCispo) {
    train.loss.clip_low = 1.0;
  }
  train.adv_estimator = options.adv_estimator;
  train.extras = options.extras;
  return train;
}

nlohmann::json run_demo(const DemoOptions& options, std::shared_ptr<Communicator> communicator) {
  const auto started = std::chrono::steady_clock::now();
  check_demo_device(options.device);
  if (communicator == nullptr) communicator = Communicator::create({}, options.device);
  const bool root = communicator->is_root();
  if (options.sft_batch < communicator->world_size() || options.sft_check_problems < communicator->world_size()) {
    throw std::invalid_argument("demo: sft batch and check problems must be at least the number of ranks");
  }
  if (root) {
    std::filesystem::create_directories(options.output_dir);
    const RunDirectory directory{options.output_dir};
    for (const auto& stale : {directory.metrics(), directory.eval()}) std::filesystem::remove(stale);
  }
  torch::manual_seed(static_cast<int64_t>(options.seed));
  const DemoProblems problems =
      make_demo_problems({.test_count = static_cast<std::size_t>(options.eval_problems), .seed = options.seed});
  const Tokenizer tokenizer = demo_tokenizer();
  Qwen2ForCausalLM model(demo_model_config());
  initialize_weights(model);  // on the CPU's generator, whatever the device: the same model everywhere
  model->to(options.device);
  // "cuda" resolves to the current GPU here; the trainer and everything below take the device from the weights.
  const torch::Device device = model->lm_head_weight().device();

  TrainOptions train_options = demo_train_options(options);
  if (!root) train_options.quiet = true;
  if (!options.quiet && root) {
    std::printf(
        "qwen_gsm8k demo: %s on generated arithmetic word problems (%zu train, %zu held out), tiny Qwen2 "
        "(%lld parameters), byte-level tokenizer%s%s\n",
        options.algorithm == Algorithm::kDapo ? "DAPO" : "GRPO", problems.train.size(), problems.test.size(),
        static_cast<long long>([&] {
          int64_t count = 0;
          for (const auto& p : model->parameters()) count += p.numel();
          return count;
        }()),
        communicator->world_size() > 1
            ? (", " + std::to_string(communicator->world_size()) + " data-parallel ranks").c_str()
            : "",
        device.is_cpu() ? "" : (", on " + device.str()).c_str());
    std::fflush(stdout);
  }
  const WarmStart warm = warm_start(model, tokenizer, problems.train, options, train_options, *communicator);
  if (warm.stopped) return {{"stopped", true}, {"step", 0}, {"checkpoint", ""}};
  const double warm_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  Trainer trainer(model, tokenizer, problems.train, problems.test, train_options, communicator);
  if (options.stop_request) trainer.set_stop_request(options.stop_request);
  // Evaluates first (the warm-started model), then trains, evaluating every eval_every steps.
  const RunResult outcome = trainer.run();
  if (outcome.stopped) {
    return {{"stopped", true}, {"step", outcome.step}, {"checkpoint", outcome.checkpoint.string()}};
  }

  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const nlohmann::json summary = demo_summary(options, train_options, trainer.evals(), communicator->world_size(),
                                              device, warm, warm_seconds, wall);
  if (!root) return summary;
  write_file_atomically(RunDirectory{options.output_dir}.summary(), summary.dump(2) + "\n");
  if (!options.quiet) print_demo_table(options, summary);
  return summary;
}

}  // namespace qwen
