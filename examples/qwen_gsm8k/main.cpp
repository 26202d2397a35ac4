// qwen_gsm8k: the command-line driver. Subcommands: demo (the built-in tiny run), train (a Hugging Face Qwen2.5 model
// on GSM8K JSON lines), compare (charts of several runs), tokenize (JSON lines in, token ids out), generate (JSON
// lines of prompts in, completions out), eval (greedy accuracy of a model or checkpoint); see cli/.
#include <CLI/CLI.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <thread>
#include <tuple>

#include "qwen_gsm8k/cli/commands.hpp"
#include "qwen_gsm8k/cli/runtime.hpp"
#include "qwen_gsm8k/demo/demo.hpp"
#include "qwen_gsm8k/model/config.hpp"
#include "qwen_gsm8k/model/device_check.hpp"
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
  int blas_threads = 0;
  app.add_option("--blas-threads", blas_threads,
                 "OpenBLAS's threads for the matrix products (default 0: with LibTorch 2.x one for models of hidden "
                 "size 128 or less, whose products are too small to share, else --threads; with 1.x as OpenBLAS "
                 "starts, one per core; OPENBLAS_NUM_THREADS or OMP_NUM_THREADS, if set, wins)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  qwen::cli::DemoCommand demo;
  qwen::cli::TrainCommand train;
  qwen::cli::CompareCommand compare;
  qwen::cli::TokenizeCommand tokenize;
  qwen::cli::GenerateCommand generate;
  qwen::cli::EvalCommand eval;
  qwen::cli::add_demo_command(app, demo);
  qwen::cli::add_train_command(app, train);
  qwen::cli::add_compare_command(app, compare);
  qwen::cli::add_tokenize_command(app, tokenize);
  qwen::cli::add_generate_command(app, generate);
  qwen::cli::add_eval_command(app, eval);
  CLI11_PARSE(app, argc, argv);

  // --print-config: the settings as parsed (and checked), nothing run.
  for (const auto& [parsed, printed, command] : {std::tuple{demo.app->parsed(), demo.print_config, demo.app},
                                                 std::tuple{train.app->parsed(), train.print_config, train.app}}) {
    if (parsed && printed) {
      std::cout << qwen::cli::effective_config(*command);
      return 0;
    }
  }

  // --memory-plan: the plan, nothing loaded but config.json, the tokenizer and the data; no rank started.
  if (train.app->parsed() && !train.memory_plan.empty()) {
    try {
      return qwen::cli::run_memory_plan_command(train, std::cout);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "qwen_gsm8k: %s\n", error.what());
      return 1;
    }
  }

  qwen::DistributedConfig distributed;
  try {
    // A device this process cannot use is refused before --overwrite removes anything or a rank starts.
    if (train.app->parsed()) qwen::usable_device(train.device, "train");
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
    if (blas_threads == 0) {  // by the model's hidden size; a config that is not there is the train command's to report
      std::int64_t hidden_size = std::numeric_limits<std::int64_t>::max();  // unknown: as a large model
      const std::string model_dir = generate.app->parsed() ? generate.model_dir
                                    : eval.app->parsed()   ? eval.model_dir
                                                           : train.model_dir;
      const std::filesystem::path config = std::filesystem::path(model_dir) / "config.json";
      if (demo.app->parsed()) hidden_size = qwen::demo_model_config().hidden_size;
      if (!demo.app->parsed() && !model_dir.empty() && std::filesystem::is_regular_file(config)) {
        hidden_size = qwen::Config::from_file(config).hidden_size;
      }
      blas_threads = qwen::blas_threads_for(hidden_size, threads);
    }
    qwen::set_blas_threads(blas_threads);
    if (tokenize.app->parsed()) return qwen::run_tokenize(tokenize.tokenizer_dir, std::cin, std::cout, std::cerr);
    if (compare.app->parsed()) return qwen::cli::run_compare_command(compare);
    if (generate.app->parsed()) return qwen::cli::run_generate_command(generate);
    if (eval.app->parsed()) return qwen::cli::run_eval_command(eval);
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
