// The qwen_gsm8k subcommands: each registers its options on the command line and runs from what was parsed.
//   demo      the built-in tiny run (the README's main job)
//   train     a Hugging Face Qwen2.5 model on GSM8K JSON lines
//   compare   charts of several runs side by side
//   tokenize  JSON lines in, token ids out
//   generate  JSON lines of prompts in, JSON lines of completions out (the generation engine)
//   eval      the greedy accuracy training's evaluations compute, for a model or a checkpoint
// Parsing `demo` or `train` also checks the settings together (CLI::ValidationError naming the flag), so a bad
// command line fails before any rank starts or any file is read.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <istream>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "qwen_gsm8k/cli/options.hpp"
#include "qwen_gsm8k/data/data.hpp"
#include "qwen_gsm8k/demo/demo.hpp"
#include "qwen_gsm8k/model/model.hpp"
#include "qwen_gsm8k/model/sampling.hpp"
#include "qwen_gsm8k/text/tokenizer.hpp"
#include "qwen_gsm8k/train/memory_plan.hpp"
#include "qwen_gsm8k/train/rollout.hpp"
#include "qwen_gsm8k/train/train_options.hpp"

namespace qwen::cli {

struct DemoCommand {
  DemoOptions options;
  std::string output = "demo-output", algorithm = "dapo";
  bool overwrite = false, print_config = false;
  // --memory-plan table|json: print the plan and exit (nothing loaded but config.json, the tokenizer and the data);
  // empty: train. --ignore-memory-plan: train on CUDA even where the plan exceeds the GPU's free memory.
  std::string memory_plan;
  bool ignore_memory_plan = false;
  LaunchSettings launch;
  CLI::App* app = nullptr;
};
void add_demo_command(CLI::App& app, DemoCommand& command);
// Refuses an --output that holds a run unless --overwrite (then removes the old run's files).
void prepare_demo_output(const DemoCommand& command);
int run_demo_command(const DemoCommand& command, const DistributedConfig& distributed);

struct TrainCommand {
  TrainOptions options;  // --algo grpo's preset already applied to the settings not given (see add_train_command)
  std::string model_dir, train_file, test_file, output = "train-output", device = "cpu", dtype = "float32";
  std::string autocast = "off", resume, algorithm = "dapo";
  // --data-preset's fields, each of --question-field, --answer-field, --answer-format given (not empty) taking its
  // place.
  std::string data_preset = "gsm8k", answer_format;
  std::string chat_template = "check";  // check: the model's template must be the one built in; builtin: use ours
  std::string load_format = "auto";     // auto: --model's safetensors; dummy: random weights of its config.json
  DataFields fields{.question = "", .answer = ""};
  bool skip_bad_lines = false, lenient_answers = false, allow_bf16_weights = false;
  bool overwrite = false, print_config = false;
  // --memory-plan table|json: print the plan and exit (nothing loaded but config.json, the tokenizer and the data);
  // empty: train. --ignore-memory-plan: train on CUDA even where the plan exceeds the GPU's free memory.
  std::string memory_plan;
  bool ignore_memory_plan = false;
  LaunchSettings launch;
  CLI::App* app = nullptr;
};
void add_train_command(CLI::App& app, TrainCommand& command);
// The trainer's settings the command implies: TrainOptions plus the flags kept outside it (--lenient-answers,
// --autocast, --output, --model for the tokenizer).
TrainOptions resolved_options(const TrainCommand& command);
// Refuses an --output that holds a run unless --resume or --overwrite (then removes the old run's files).
void prepare_train_output(const TrainCommand& command);
// The memory plan of the command's run (train/memory_plan.hpp) from config.json, the tokenizer and the training data's
// longest prompt; no weight is read.
MemoryPlan train_memory_plan(const TrainCommand& command);
// --memory-plan: prints the plan, as a table or one JSON object, to `out`; returns the exit status.
int run_memory_plan_command(const TrainCommand& command, std::ostream& out);
int run_train_command(TrainCommand command, const DistributedConfig& distributed);

// After a run stopped on SIGTERM / SIGINT (Trainer::set_stop_request): rank 0 prints the line that says at which
// step, where the checkpoint is and `how_to_continue`; returns the exit status a job ended by that signal has,
// 128 + signal (143, 130), as schedulers and shells expect of a preempted job.
int report_stop(bool root, const RunResult& result, const std::string& how_to_continue);

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

struct GenerateOptions {
  int64_t n = 1, max_new_tokens = 512, max_num_seqs = 64;
  SamplingOptions sampling{.temperature = 0.0};
  uint64_t seed = 0;
  bool logprobs = false, skip_bad_lines = false;
  bool cuda_graphs = true;                        // EngineOptions::cuda_graphs
  std::string system_prompt = kSeedSystemPrompt;  // for "question" lines, as in training
};
struct GenerateCommand {
  GenerateOptions options;
  std::string model_dir, input, output, device = "cpu", dtype = "float32";
  CLI::App* app = nullptr;
};
void add_generate_command(CLI::App& app, GenerateCommand& command);
// One input line, read: its prompt's ids, its reference answer (when given), its line number in the file.
struct GenerateLine {
  std::vector<int64_t> prompt;
  std::optional<std::string> answer;
  int64_t line = 0;
};
// Every non-blank line of `in` (named `name` in errors) as a request; a malformed line throws
// std::invalid_argument "name:line: what", or with skip_bad_lines is counted in *skipped.
std::vector<GenerateLine> read_generate_input(std::istream& in, const std::string& name, const Tokenizer& tokenizer,
                                              const GenerateOptions& options, int64_t* skipped = nullptr);
struct GenerateSummary {
  int64_t lines = 0, tokens = 0, scored = 0, correct = 0;
};
// Generates n completions per line and writes one JSON line per input line to `out`, in input order, each flushed as
// soon as it and the lines before it are done: {"index", "line", "prompt_token_ids", "outputs": [{"text",
// "token_ids", "finish_reason", "logprobs"?, "reward"?, "correct"?}]}. progress(lines written, lines) after each.
GenerateSummary generate_lines(Qwen2ForCausalLM& model, const Tokenizer& tokenizer,
                               const std::vector<GenerateLine>& lines, const GenerateOptions& options,
                               std::ostream& out, const std::function<void(int64_t, int64_t)>& progress = {});
int run_generate_command(const GenerateCommand& command);

struct EvalCommand {
  TrainOptions options;  // max_new_tokens, max_rollout_rows, the rewards' answer mode; the rest as training's defaults
  std::string model_dir, test_file, device = "cpu", dtype = "float32";
  std::string data_preset = "gsm8k", answer_format;  // as TrainCommand's
  DataFields fields{.question = "", .answer = ""};
  int64_t problems = 0;
  bool lenient_answers = false, skip_bad_lines = false;
  CLI::App* app = nullptr;
};
void add_eval_command(CLI::App& app, EvalCommand& command);
// The accuracy record: {"model", "test", "problems", "correct", "accuracy", "skipped_lines", "max_new_tokens"}.
nlohmann::json evaluate(EvalCommand command);
int run_eval_command(const EvalCommand& command);  // prints evaluate()'s record as one line

}  // namespace qwen::cli
