// Test helper for distributed_test: one rank of a data-parallel run (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from
// the environment; none set: a single process). Not a user tool.
//   distributed_worker train OUT MICRO DTYPE [STEPS [RESUME]]
//       STEPS (3) DAPO steps with fixed rollouts (a KL loss and rollout correction on), after resuming from checkpoint
//       RESUME if given; writes OUT/params-rank<R>.pt, and rank 0 OUT/metrics.json and a checkpoint under
//       OUT/run/checkpoints
//   distributed_worker loop OUT              steps until killed, printing "step N" on stdout after each step
// The rollouts depend on the problem alone (fixed_rollouts), so every number of ranks sees the same ones.
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>

#include "qwen_gsm8k/demo/demo.hpp"
#include "qwen_gsm8k/demo/demo_problems.hpp"
#include "qwen_gsm8k/dist/distributed.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/rollout.hpp"
#include "qwen_gsm8k/train/trainer.hpp"

namespace {

// Responses that depend on the question only: right, wrong or badly formatted by a hash, and some groups where
// every response is wrong (dynamic sampling drops those).
std::vector<qwen::Group> fixed_rollouts(const qwen::Tokenizer& tokenizer, const qwen::TrainOptions& options,
                                        const std::vector<qwen::Problem>& problems) {
  const int64_t end_id = *tokenizer.token_to_id("<|im_end|>");
  std::vector<qwen::Group> groups;
  for (const auto& problem : problems) {
    qwen::Group group;
    group.problem = problem;
    group.prompt = qwen::prompt_ids(tokenizer, options.system_prompt, problem.question);
    const std::size_t hash = std::hash<std::string>{}(problem.question);
    for (int64_t j = 0; j < options.rollout_n; ++j) {
      const std::size_t h = hash / 7 + static_cast<std::size_t>(j) * 2654435761u;
      const bool right = hash % 4 != 0 && h % 3 == 0;
      std::string text = "<think>\n" + std::to_string(h % 97) + "\n</think>\n<answer>\n" +
                         (right ? problem.reference : std::to_string(h % 1000 + 1000)) + "\n</answer>";
      if (h % 5 == 1) text = "the answer is " + std::to_string(h % 13);
      qwen::Response response;
      for (const int32_t id : tokenizer.encode(text)) response.ids.push_back(id);
      response.ids.push_back(end_id);
      // The sampler's log-probs: near the random model's (about -log 259) with a jitter of +-0.4 from the hash, so
      // that rollout correction weights and rejects some tokens.
      for (std::size_t k = 0; k < response.ids.size(); ++k) {
        response.logprobs.push_back(static_cast<float>(-5.55 + 0.1 * static_cast<double>((h / 3 + k * 7) % 9) - 0.4));
      }
      response.text = text;
      response.score = qwen::score_response(text, problem.reference, static_cast<int64_t>(response.ids.size()),
                                            {.max_length = options.max_new_tokens});
      group.responses.push_back(std::move(response));
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (argc < 3 || (mode != "train" && mode != "loop") || (mode == "train" && (argc < 5 || argc > 7))) {
    std::fprintf(stderr,
                 "usage: distributed_worker train OUT MICRO float32|float64 [STEPS [RESUME]] | "
                 "distributed_worker loop OUT\n");
    return 2;
  }
  const std::filesystem::path out = argv[2];
  try {
    at::set_num_threads(1);
    qwen::DistributedConfig config = qwen::DistributedConfig::from_environment();
    config.timeout = std::chrono::seconds(20);
    const auto communicator = qwen::Communicator::create(config, torch::kCPU);

    torch::manual_seed(100 + communicator->rank());  // different on each rank: the trainer must broadcast rank 0's
    qwen::Qwen2ForCausalLM model(qwen::demo_model_config());
    qwen::initialize_weights(model);
    if (mode == "train" && std::string(argv[4]) == "float64") model->to(torch::kFloat64);
    const qwen::Tokenizer tokenizer = qwen::Tokenizer::byte_level({"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
    const qwen::DemoProblems problems = qwen::make_demo_problems({.test_count = 8, .seed = 5});

    qwen::TrainOptions options;
    options.total_steps = mode == "train" ? (argc > 5 ? std::stoll(argv[5]) : 3) : 1000000;
    options.train_batch_size = 4;
    options.rollout_n = 4;
    options.ppo_mini_batch_size = 2;  // 2 updates per epoch
    options.ppo_micro_batch_size = mode == "train" ? std::stoll(argv[3]) : 0;
    options.ppo_epochs = 2;
    options.max_new_tokens = 64;
    options.lr = 1e-3;
    options.weight_decay = 0.1;
    options.warmup_steps = 2;
    options.seed = 11;
    options.quiet = true;
    if (mode == "train") options.output_dir = out / "run";
    options.system_prompt = "Answer with <think> then <answer>.";
    // What verl adds to the loss, all at once: a KL loss against the starting weights (rank 0's, after the
    // broadcast), rollout correction's weights and rejection (over the whole batch: the ranks share old log-probs).
    options.extras.kl_loss_coef = 0.05;
    options.extras.rollout_is = "token";
    options.extras.rollout_rs = "token_k1";
    options.extras.rollout_rs_threshold = "1.5";
    options.fixed_rollouts = [&](const std::vector<qwen::Problem>& batch) {
      return fixed_rollouts(tokenizer, options, batch);
    };
    qwen::Trainer trainer(model, tokenizer, problems.train, problems.test, options, communicator);
    {
      std::vector<torch::Tensor> initial;
      for (const auto& parameter : trainer.model()->parameters()) initial.push_back(parameter.detach().clone());
      torch::save(initial, (out / ("initial-rank" + std::to_string(communicator->rank()) + ".pt")).string());
    }
    if (argc > 6) trainer.resume(argv[6]);
    for (int64_t step = trainer.step_index() + 1; step <= options.total_steps; ++step) {
      trainer.step();
      if (mode == "loop") {
        std::printf("step %lld\n", static_cast<long long>(step));  // the progress distributed_test waits for
        std::fflush(stdout);
      }
    }
    std::vector<torch::Tensor> parameters;
    for (const auto& parameter : trainer.model()->parameters()) parameters.push_back(parameter.detach().clone());
    torch::save(parameters, (out / ("params-rank" + std::to_string(communicator->rank()) + ".pt")).string());
    if (communicator->is_root()) {
      std::ofstream(out / "metrics.json") << nlohmann::json(trainer.metrics()).dump() << "\n";
      if (mode == "train") trainer.save_checkpoint();
    }
    communicator->barrier();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "distributed_worker: %s\n", error.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
  return 0;
}
