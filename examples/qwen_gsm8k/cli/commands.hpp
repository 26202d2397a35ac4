// The qwen_gsm8k subcommands: each registers its options on the command line and runs from what was parsed.
//   demo      the built-in tiny run (the README's main job)
//   train     a Hugging Face Qwen2.5 model on GSM8K JSON lines
//   compare   charts of several runs side by side
//   tokenize  JSON lines in, token ids out
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "qwen_gsm8k/cli/options.hpp"
#include "qwen_gsm8k/data/data.hpp"
#include "qwen_gsm8k/demo/demo.hpp"
#include "qwen_gsm8k/train/train_options.hpp"

namespace qwen::cli {

struct DemoCommand {
  DemoOptions options;
  std::string output = "demo-output", algorithm = "dapo";
  LaunchSettings launch;
  CLI::App* app = nullptr;
};
void add_demo_command(CLI::App& app, DemoCommand& command);
int run_demo_command(const DemoCommand& command, const DistributedConfig& distributed);

struct TrainCommand {
  TrainOptions options;
  std::string model_dir, train_file, test_file, output = "train-output", device = "cpu", dtype = "float32";
  std::string autocast = "off", resume, aggregation, algorithm = "dapo", answer_format = "gsm8k";
  DataFields fields;
  bool skip_bad_lines = false, lenient_answers = false;
  LaunchSettings launch;
  CLI::App* app = nullptr;
};
void add_train_command(CLI::App& app, TrainCommand& command);
int run_train_command(TrainCommand command, const DistributedConfig& distributed);

struct CompareCommand {
  std::string output = "compare-output";
  std::vector<std::string> runs;
  CLI::App* app = nullptr;
};
void add_compare_command(CLI::App& app, CompareCommand& command);
int run_compare_command(const CompareCommand& command);

struct TokenizeCommand {
  std::string tokenizer_dir;
  CLI::App* app = nullptr;
};
void add_tokenize_command(CLI::App& app, TokenizeCommand& command);

}  // namespace qwen::cli
