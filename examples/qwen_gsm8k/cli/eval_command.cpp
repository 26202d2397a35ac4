// `qwen_gsm8k eval`: the greedy accuracy a training run's evaluation computes (greedy_correct with the trainer's
// prompt, budget, stop ids and rewards), for any model directory or checkpoint.
#include <cstdio>

#include "qwen_gsm8k/cli/commands.hpp"
#include "qwen_gsm8k/cli/options.hpp"
#include "qwen_gsm8k/model/device_check.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/rollout.hpp"

namespace qwen::cli {

void add_eval_command(CLI::App& app, EvalCommand& command) {
  CLI::App* sub = app.add_subcommand(
      "eval", "Greedy accuracy on GSM8K JSON lines, as training's evaluations compute it (one JSON line on stdout)");
  sub->add_option("--model", command.model_dir, "Model directory or checkpoint: config.json, safetensors, tokenizer")
      ->required()
      ->check(CLI::ExistingDirectory);
  sub->add_option("--test", command.test_file, "GSM8K JSON lines")->required()->check(CLI::ExistingFile);
  sub->add_option("--max-new-tokens", command.options.max_new_tokens, "The length budget, as in training")
      ->capture_default_str()
      ->check(positive());
  sub->add_option("--eval-problems", command.problems, "The first K problems of the file; 0: all")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--max-num-seqs,--max-rollout-rows", command.options.max_rollout_rows,
                  "The generation engine's slots; 0: every problem at once")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--data-preset", command.data_preset,
                  "The data's layout: gsm8k (question, answer \"... #### N\"), gsm8k_chinese (question_zh-cn, "
                  "answer_only), verl (prompt as chat messages, reward_model.ground_truth)")
      ->capture_default_str()
      ->check(CLI::IsMember({"gsm8k", "gsm8k_chinese", "verl"}));
  sub->add_option("--question-field", command.fields.question, "JSON field of the question")
      ->default_str("the preset's");
  sub->add_option("--answer-field", command.fields.answer, "JSON field of the answer")->default_str("the preset's");
  sub->add_option("--answer-format", command.answer_format, "gsm8k (\"... #### N\") or number")
      ->default_str("the preset's")
      ->check(CLI::IsMember({"gsm8k", "number"}));
  sub->add_flag("--lenient-answers", command.lenient_answers, "Read answers leniently (-7, 1,080)");
  sub->add_flag("--skip-bad-lines", command.skip_bad_lines, "Skip (and count) malformed data lines");
  sub->add_option("--device", command.device, "cpu, cuda or cuda:N")->capture_default_str();
  sub->add_option("--dtype", command.dtype, "float32 or bfloat16 weights")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  command.app = sub;
}

nlohmann::json evaluate(EvalCommand command) {
  const torch::Device device = usable_device(command.device, "eval");  // before any work
  command.fields = data_fields(command.data_preset, command.fields, command.answer_format);
  const auto data =
      load_problems(command.test_file, command.fields, command.skip_bad_lines ? BadLines::kSkip : BadLines::kError);
  std::vector<Problem> problems = data.problems;
  if (command.problems > 0 && static_cast<std::size_t>(command.problems) < problems.size()) {
    problems.resize(static_cast<std::size_t>(command.problems));
  }
  TrainOptions options = command.options;
  if (command.lenient_answers) options.rewards.answer_mode = dapo::gsm8k::AnswerMode::kLenient;
  const Tokenizer tokenizer = Tokenizer::from_directory(command.model_dir);
  auto model = load_model(command.model_dir, command.dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat32, device);
  model->eval();
  const int64_t correct =
      greedy_correct(model, tokenizer, problems, rollout_options(options, tokenizer), [](int64_t done, int64_t total) {
        std::fprintf(stderr, "eval: %lld/%lld\n", static_cast<long long>(done), static_cast<long long>(total));
      });
  const auto count = static_cast<int64_t>(problems.size());
  const double accuracy = count > 0 ? static_cast<double>(correct) / static_cast<double>(count) : 0.0;
  nlohmann::json record{{"model", command.model_dir},
                        {"test", command.test_file},
                        {"problems", count},
                        {"correct", correct},
                        {"accuracy", accuracy},
                        {"skipped_lines", data.skipped_lines},
                        {"max_new_tokens", options.max_new_tokens}};
  return record;
}

int run_eval_command(const EvalCommand& command) {
  std::printf("%s\n", evaluate(command).dump().c_str());
  return 0;
}

}  // namespace qwen::cli
