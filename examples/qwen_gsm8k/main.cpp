// qwen_gsm8k: the command-line driver. Subcommands: demo (the built-in tiny run), train (a Hugging Face Qwen2.5 model
// on GSM8K JSON lines), compare (charts of several runs), tokenize (JSON lines in, token ids out); see cli/.
#include <CLI/CLI.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>
#include <tuple>

#include "qwen_gsm8k/cli/commands.hpp"
#include "qwen_gsm8k/cli/runtime.hpp"
#include "qwen_gsm8k/text/tokenize_command.hpp"

int main(int argc, char** argv) {
  qwen::use_passive_thread_pools(argv);
  CLI::App app{"qwen_gsm8k: DAPO training of Qwen2.5 on GSM8K with the dapo library"};
  app.require_subcommand(1);
  // Under a launcher, the ranks on this machine share its cores.
  int local_ranks = 1;
  if (const char* local_world = std::getenv("LOCAL_WORLD_SIZE")) local_ranks = std::max(1, std::atoi(local_world));
  int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local_ranks);
  app.add_option("--threads", threads, "CPU threads for LibTorch (default: the cores, shared among local ranks)")
      ->capture_default_str()
      ->check(qwen::cli::positive());
  qwen::cli::DemoCommand demo;
  qwen::cli::TrainCommand train;
  qwen::cli::CompareCommand compare;
  qwen::cli::TokenizeCommand tokenize;
  qwen::cli::add_demo_command(app, demo);
  qwen::cli::add_train_command(app, train);
  qwen::cli::add_compare_command(app, compare);
  qwen::cli::add_tokenize_command(app, tokenize);
  CLI11_PARSE(app, argc, argv);

  // --print-config: the settings as parsed (and checked), nothing run.
  for (const auto& [parsed, printed, command] : {std::tuple{demo.app->parsed(), demo.print_config, demo.app},
                                                 std::tuple{train.app->parsed(), train.print_config, train.app}}) {
    if (parsed && printed) {
      std::cout << qwen::cli::effective_config(*command);
      return 0;
    }
  }

  qwen::DistributedConfig distributed;
  try {
    // Before any rank starts, once: by this process alone, the launcher, or rank 0 of a torchrun-style launch.
    if (qwen::cli::prepares_output_here()) {
      if (demo.app->parsed()) qwen::cli::prepare_demo_output(demo);
      if (train.app->parsed()) qwen::cli::prepare_train_output(train);
    }
    const qwen::cli::LaunchSettings& launch = train.app->parsed() ? train.launch : demo.launch;
    if (const auto launched = qwen::cli::launch_or_join(launch, argc, argv, distributed)) return *launched;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "qwen_gsm8k: %s\n", error.what());
    return 2;
  }
  at::set_num_threads(threads);
  try {
    if (tokenize.app->parsed()) return qwen::run_tokenize(tokenize.tokenizer_dir, std::cin, std::cout, std::cerr);
    if (compare.app->parsed()) return qwen::cli::run_compare_command(compare);
    if (demo.app->parsed()) return qwen::cli::run_demo_command(demo, distributed);
    if (train.app->parsed()) return qwen::cli::run_train_command(train, distributed);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "qwen_gsm8k: %s\n", error.what());
    std::fflush(stderr);
    // With peers, leave at once: tearing down a process group whose peers are gone can block.
    if (distributed.world_size > 1) std::_Exit(1);
    return 1;
  }
  return 0;
}
