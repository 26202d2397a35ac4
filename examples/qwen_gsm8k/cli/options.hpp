// Command-line options shared by the subcommands that train (demo, train): one registration per setting, so the same
// flag means the same thing, with the same help, wherever it appears. Option names follow verl where it has one; TRL's
// names are aliases where they differ. Also: --config / --print-config, the numeric validators, and the check of the
// output directory. Not here: what each subcommand does with its settings (demo_command.cpp, train_command.cpp).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "qwen_gsm8k/common/run_directory.hpp"
#include "qwen_gsm8k/data/data.hpp"
#include "qwen_gsm8k/dist/distributed.hpp"
#include "qwen_gsm8k/train/train_options.hpp"

namespace qwen::cli {

// Validators for numeric options. CLI11 puts the flag's name in front of the message ("--lr: ..."). Unlike
// CLI::PositiveNumber and CLI::Range they refuse NaN and infinity (every comparison with NaN is false, so those let
// it through).
CLI::Validator positive();                                // > 0
CLI::Validator non_negative();                            // >= 0
CLI::Validator at_least(double minimum);                  // >= minimum
CLI::Validator in_range(double minimum, double maximum);  // [minimum, maximum]
CLI::Validator finite();                                  // any finite number

// An option bound to `value` whose --help default and --print-config value are the variable's current value, written
// exactly (floating point in the shortest form that reads back to the same number).
template <typename T>
CLI::Option* add_setting(CLI::App& command, const std::string& names, T& value, const std::string& help);
// A bool flag ("--cosine,!--constant-lr": the first name sets true) whose --help default and --print-config value
// are the variable's current value ("true"/"false", under the first name); given twice, the last one counts.
CLI::Option* add_switch(CLI::App& command, const std::string& names, bool& value, const std::string& help);

// The settings both `demo` and `train` have; each points into that command's own options.
struct RunSettings {
  int64_t* total_steps = nullptr;
  int64_t* train_batch_size = nullptr;
  int64_t* ppo_mini_batch_size = nullptr;
  double* lr = nullptr;
  uint64_t* seed = nullptr;
  int64_t* rollout_n = nullptr;
  int64_t* ppo_epochs = nullptr;
  bool* cosine_schedule = nullptr;
  int64_t* warmup_steps = nullptr;
  bool* shared_prompt = nullptr;
  int64_t* eval_every = nullptr;
  int64_t* eval_problems = nullptr;
  std::vector<std::string>* loggers = nullptr;
  int64_t* log_rollouts = nullptr;
  bool* quiet = nullptr;
};
void add_run_options(CLI::App& command, const RunSettings& settings);

// The loss by verl's name and its options, the advantage estimator, and what verl adds to the loss (--policy-loss,
// --tau-pos, --tau-neg, --dro-beta, --adv-estimator, --kl-loss-coef, --kl-loss-type, --entropy-coeff, --rollout-is,
// --rollout-is-threshold, --rollout-rs, --rollout-rs-threshold), on `demo` and `train`.
struct AlgorithmSettings {
  dapo::PolicyLossMode* mode = nullptr;
  double* tau_pos = nullptr;
  double* tau_neg = nullptr;
  double* dro_beta = nullptr;
  dapo::AdvantageEstimator* adv_estimator = nullptr;
  LossExtras* extras = nullptr;
};
void add_algorithm_options(CLI::App& command, const AlgorithmSettings& settings);

// The trainer's knobs for `train` (the demo fixes most of them for its tiny model).
void add_train_options(CLI::App& command, TrainOptions& options);

// --nproc and --dist-timeout, on every subcommand that trains.
struct LaunchSettings {
  int nproc = 1;
  double dist_timeout = 300;  // seconds
};
void add_launch_options(CLI::App& command, LaunchSettings& settings, const std::string& nproc_help);

// --config FILE and --print-config. Register them first on a subcommand: --config's callback adds the file's values
// to the options the command line left unset, and CLI11 runs option callbacks in registration order, so every option
// registered after it then sees the file's value as given (an --algo preset leaves it alone). The file is TOML as
// CLI11 reads it: `name = value` per line, names as the long flags without dashes (aliases too), an optional [demo] or
// [train] section; relative paths in it are relative to the working directory.
void add_config_options(CLI::App& command, bool& print_config);

// The effective settings of a parsed subcommand (--algo's preset, the command line and --config applied) as TOML that
// --config reads back to the same settings. Options without a value (an unset --test) are left out; a text value the
// reader cannot hold (a newline, '#', or both kinds of quote: the seed's system prompt) is written as a comment.
std::string effective_config(CLI::App& command);

// `message` (from TrainOptions::validate, which names settings as verl does: ppo_mini_batch_size) with each setting
// that is one of `command`'s options written as its flag (--ppo-mini-batch-size), as a CLI::ValidationError.
CLI::ValidationError settings_error(const CLI::App& command, const std::string& message);

// transformers' max_shard_size: "5GB" (10^9), "500MB", "2GiB" (2^30), "100KB", "1KiB", or a byte count; > 0.
// Throws std::invalid_argument naming the text.
int64_t parse_byte_size(const std::string& text);
// The shortest of those spellings that parse_byte_size reads back to `bytes`.
std::string byte_size_text(int64_t bytes);

// Whether this process is the one that prepares the output: a single process, the --nproc launcher, or rank 0 of a
// torchrun-style launch (RANK unset or 0). Other ranks never write the output directory.
bool prepares_output_here();

// The launcher's or this rank's part: with --nproc > 1, starts the ranks and returns their exit status; otherwise
// fills `distributed` from the environment (torchrun-style variables) and returns nothing. Throws
// std::invalid_argument on inconsistent settings.
std::optional<int> launch_or_join(const LaunchSettings& settings, int argc, char** argv,
                                  DistributedConfig& distributed);

// --- template definitions ---------------------------------------------------------------------------------------

// The data fields a command reads: --data-preset's (data_preset), each of --question-field, --answer-field and
// --answer-format given (not empty: `given`'s names, `answer_format` "gsm8k" or "number") taking its place.
DataFields data_fields(const std::string& preset, const DataFields& given, const std::string& answer_format);

std::string exact_number_text(double value);  // shortest round-trip form (std::to_chars)

template <typename T>
CLI::Option* add_setting(CLI::App& command, const std::string& names, T& value, const std::string& help) {
  CLI::Option* option = command.add_option(names, value, help);
  if constexpr (std::is_floating_point_v<T>) {
    option->default_function([&value] { return exact_number_text(static_cast<double>(value)); });
    option->capture_default_str();
  }
  return option;
}

}  // namespace qwen::cli
