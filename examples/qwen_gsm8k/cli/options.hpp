// Command-line options shared by the subcommands that train (demo, train): one registration per setting, so the same
// flag means the same thing, with the same help, wherever it appears. Option names follow verl where it has one.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "qwen_gsm8k/dist/distributed.hpp"
#include "qwen_gsm8k/train/train_options.hpp"

namespace qwen::cli {

// The settings both `demo` and `train` have; each points into that command's own options.
struct RunSettings {
  uint64_t* seed = nullptr;
  int64_t* rollout_n = nullptr;
  int64_t* ppo_epochs = nullptr;
  bool* cosine_schedule = nullptr;
  int64_t* eval_every = nullptr;
  int64_t* eval_problems = nullptr;
  bool* quiet = nullptr;
};
void add_run_options(CLI::App& command, const RunSettings& settings);

// The trainer's knobs for `train` (the demo fixes most of them for its tiny model).
void add_train_options(CLI::App& command, TrainOptions& options, std::string& aggregation);

// --nproc and --dist-timeout, on every subcommand that trains.
struct LaunchSettings {
  int nproc = 1;
  double dist_timeout = 300;  // seconds
};
void add_launch_options(CLI::App& command, LaunchSettings& settings, const std::string& nproc_help);

// The launcher's or this rank's part: with --nproc > 1, starts the ranks and returns their exit status; otherwise
// fills `distributed` from the environment (torchrun-style variables) and returns nothing. Throws
// std::invalid_argument on inconsistent settings.
std::optional<int> launch_or_join(const LaunchSettings& settings, int argc, char** argv,
                                  DistributedConfig& distributed);

}  // namespace qwen::cli
