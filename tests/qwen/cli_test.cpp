// The demo and train command lines as the program parses them: defaults in --help, one option per setting (aliases
// included), --algo as defaults that explicit settings override, refusals (bfloat16 weights, a used --output, values
// out of range, each naming its flag), and --print-config read back by --config.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "qwen_gsm8k/cli/commands.hpp"
#include "support/qwen_fixtures.hpp"

namespace {

namespace fs = std::filesystem;

// A scratch directory with what `train` requires: a model directory and a training file.
struct TrainInputs {
  dapo::test::ScratchDir scratch;
  fs::path model = scratch.path() / "model";
  fs::path train = scratch.path() / "train.jsonl";
  TrainInputs() {
    fs::create_directories(model);
    std::ofstream(train) << "\n";
  }
  std::vector<std::string> required() const { return {"train", "--model", model.string(), "--train", train.string()}; }
};

// CLI11 takes the words last first, without argv[0].
void parse(CLI::App& app, std::vector<std::string> words) {
  std::reverse(words.begin(), words.end());
  app.parse(words);
}

struct Train {
  CLI::App app;
  qwen::cli::TrainCommand command;
  Train() { qwen::cli::add_train_command(app, command); }
  qwen::TrainOptions options() const { return qwen::cli::resolved_options(command); }
};

struct Demo {
  CLI::App app;
  qwen::cli::DemoCommand command;
  Demo() { qwen::cli::add_demo_command(app, command); }
};

std::vector<std::string> plus(std::vector<std::string> words, const std::vector<std::string>& more) {
  words.insert(words.end(), more.begin(), more.end());
  return words;
}

// The message of the CLI11 error that parsing `words` throws, or "" if it parses.
std::string parse_error(const std::vector<std::string>& words, bool demo = false) {
  try {
    if (demo) {
      Demo d;
      parse(d.app, words);
    } else {
      Train t;
      parse(t.app, words);
    }
  } catch (const CLI::ParseError& error) {
    return error.what();
  }
  return "";
}

// Where the option's own line of a --help text starts: its first name after fewer than 20 spaces, then a space, a
// comma, "=" (CLI11 2.1's default) or the line's end (CLI11 2.6 indents long names to column 10, separates names with
// ", " where 2.1 has ",", and wraps descriptions at column 30, where a continued description may start with another
// option's name).
std::size_t option_line(const std::string& help, const std::string& name) {
  for (std::size_t start = 0; start < help.size();) {
    const std::size_t end = std::min(help.find('\n', start), help.size());
    const std::string line = help.substr(start, end - start);
    const std::size_t text = line.find_first_not_of(' ');
    if (text < 20 && line.compare(text, name.size(), name) == 0 &&
        (text + name.size() == line.size() || std::string(" ,=").find(line[text + name.size()]) != std::string::npos)) {
      return start;
    }
    start = end + 1;
  }
  return std::string::npos;
}

}  // namespace

TEST_CASE("cli: --help shows the default of every option that has one") {
  Train train;
  Demo demo;
  for (CLI::App* command : {train.command.app, demo.command.app}) {
    const std::string help = command->help();
    for (const CLI::Option* option : command->get_options()) {
      const std::string name = option->get_name();
      if (name == "--help" || name == "--config" || name == "--print-config") continue;
      INFO(command->get_name() << " " << name);
      if (name == "--model" || name == "--train" || name == "--test" || name == "--resume") continue;  // none
      REQUIRE_FALSE(option->get_default_str().empty());
      // The option's line in the help: its names, type and validator, then "=default" (CLI11 2.1, Debian 12) or
      // " [default]" (CLI11 2.4, Debian 13; 2.6, Debian sid).
      const auto line = option_line(help, name);
      REQUIRE(line != std::string::npos);
      const std::string shown = help.substr(line, help.find('\n', line) - line);
      const std::string value = option->get_default_str();
      CHECK_MESSAGE(
          (shown.find("=" + value) != std::string::npos || shown.find(" [" + value + "]") != std::string::npos), shown);
    }
  }
  // Spot checks of the values themselves.
  CHECK(train.command.app->get_option("--lr")->get_default_str() == "1e-06");
  CHECK(train.command.app->get_option("--clip-ratio-high")->get_default_str() == "0.28");
  CHECK(train.command.app->get_option("--loss-agg-mode")->get_default_str() == "token-mean");
  CHECK(train.command.app->get_option("--max-shard-size")->get_default_str() == "5GB");
  CHECK(train.command.app->get_option("--logger")->get_default_str() == "console,jsonl,tensorboard");
  CHECK(demo.command.app->get_option("--steps")->get_default_str() == "60");
  CHECK(demo.command.app->get_option("--warmup-steps")->get_default_str() == "16");
  CHECK(train.command.app->get_option("--warmup-steps")->get_default_str() == "0");
  CHECK(train.command.app->get_option("--cuda-graphs")->get_default_str() == "true");
  CHECK(train.command.app->get_option("--shared-prompt")->get_default_str() == "true");
  CHECK(demo.command.app->get_option("--shared-prompt")->get_default_str() == "true");
  CHECK(demo.command.app->get_option("--lr")->get_default_str() == "6e-04");
  CHECK(demo.command.app->get_option("--device")->get_default_str() == "cpu");
  CHECK(demo.command.app->get_option("--cosine")->get_default_str() == "true");
  CHECK(train.command.app->get_option("--cosine")->get_default_str() == "false");
}

TEST_CASE("cli: demo and train share names; old demo names and TRL names are aliases of the same option") {
  TrainInputs inputs;
  for (const auto& [primary, alias] :
       std::vector<std::pair<std::string, std::string>>{{"--steps", "--rl-steps"},
                                                        {"--lr", "--rl-lr"},
                                                        {"--train-batch-size", "--rl-groups"},
                                                        {"--ppo-mini-batch-size", "--rl-mini-groups"},
                                                        {"--rollout-n", "--num-generations"},
                                                        {"--ppo-epochs", "--num-iterations"}}) {
    Demo demo;
    Train train;
    INFO(primary << " / " << alias);
    REQUIRE(demo.command.app->get_option_no_throw(alias) != nullptr);
    CHECK(demo.command.app->get_option_no_throw(alias) == demo.command.app->get_option_no_throw(primary));
    CHECK(train.command.app->get_option_no_throw(alias) == train.command.app->get_option_no_throw(primary));
  }
  for (const auto& [primary, alias] :
       std::vector<std::pair<std::string, std::string>>{{"--max-new-tokens", "--max-completion-length"},
                                                        {"--grad-clip", "--max-grad-norm"},
                                                        {"--save-every", "--save-steps"},
                                                        {"--mask-truncated", "--mask-truncated-completions"}}) {
    Train train;
    INFO(primary << " / " << alias);
    REQUIRE(train.command.app->get_option_no_throw(alias) != nullptr);
    CHECK(train.command.app->get_option_no_throw(alias) == train.command.app->get_option_no_throw(primary));
  }

  // The values land in the same fields.
  Demo old_names;
  parse(old_names.app, {"demo", "--rl-steps", "7", "--rl-lr", "0.001", "--rl-groups", "8", "--rl-mini-groups", "4"});
  Demo new_names;
  parse(new_names.app,
        {"demo", "--steps", "7", "--lr", "0.001", "--train-batch-size", "8", "--ppo-mini-batch-size", "4"});
  for (const qwen::DemoOptions* demo : {&old_names.command.options, &new_names.command.options}) {
    CHECK(demo->rl_steps == 7);
    CHECK(demo->rl_lr == 0.001);
    CHECK(demo->rl_groups == 8);
    CHECK(demo->rl_mini_groups == 4);
  }
  Train trl;
  parse(trl.app, plus(inputs.required(), {"--num-generations", "6", "--max-completion-length", "99", "--num-iterations",
                                          "3", "--max-grad-norm", "0.5", "--save-steps", "11",
                                          "--mask-truncated-completions", "--save-total-limit", "4"}));
  const qwen::TrainOptions options = trl.options();
  CHECK(options.rollout_n == 6);
  CHECK(options.max_new_tokens == 99);
  CHECK(options.ppo_epochs == 3);
  CHECK(options.grad_clip == 0.5);
  CHECK(options.save_every == 11);
  CHECK(options.mask_truncated);
  CHECK(options.keep_checkpoints == 4);
}

TEST_CASE("cli: new settings: --logger, --log-rollouts, --max-shard-size, --chat-template") {
  TrainInputs inputs;
  Train train;
  parse(train.app, plus(inputs.required(), {"--logger", "jsonl,console", "--log-rollouts", "5", "--max-shard-size",
                                            "2GiB", "--chat-template", "builtin"}));
  CHECK(train.command.options.loggers == std::vector<std::string>{"jsonl", "console"});
  CHECK(train.command.options.log_rollouts == 5);
  CHECK(train.command.options.max_shard_bytes == (int64_t{2} << 30));
  CHECK(train.command.chat_template == "builtin");
  Demo demo;
  parse(demo.app, {"demo", "--logger", "tensorboard", "--log-rollouts", "0"});
  CHECK(demo.command.options.loggers == std::vector<std::string>{"tensorboard"});
  CHECK(demo.command.options.log_rollouts == 0);

  CHECK(qwen::cli::parse_byte_size("5GB") == 5'000'000'000);
  CHECK(qwen::cli::parse_byte_size("500MB") == 500'000'000);
  CHECK(qwen::cli::parse_byte_size("2GiB") == 2'147'483'648);
  CHECK(qwen::cli::parse_byte_size("1kib") == 1024);
  CHECK(qwen::cli::parse_byte_size("123") == 123);
  for (const char* bad : {"", "GB", "0", "-5GB", "5 GB", "5XB", "1.5GB", "99999999999GB"}) {
    INFO(bad);
    CHECK_THROWS_AS(qwen::cli::parse_byte_size(bad), std::invalid_argument);
  }
  for (const int64_t bytes : {int64_t{5'000'000'000}, int64_t{2} << 30, int64_t{123}, int64_t{1536}}) {
    CHECK(qwen::cli::parse_byte_size(qwen::cli::byte_size_text(bytes)) == bytes);
  }
  CHECK(qwen::cli::byte_size_text(int64_t{2} << 30) == "2GiB");
}

TEST_CASE("cli: --data-preset names the data's fields; --question-field, --answer-field, --answer-format win") {
  TrainInputs inputs;
  const auto fields_of = [&](const std::vector<std::string>& arguments) {
    Train train;
    parse(train.app, plus(inputs.required(), arguments));
    return qwen::cli::data_fields(train.command.data_preset, train.command.fields, train.command.answer_format);
  };
  const qwen::DataFields plain = fields_of({});
  CHECK(plain.question == "question");
  CHECK(plain.answer == "answer");
  CHECK(plain.format == qwen::AnswerFormat::kGsm8k);
  const qwen::DataFields verl = fields_of({"--data-preset", "verl"});
  CHECK(verl.question == "prompt");
  CHECK(verl.answer == "reward_model.ground_truth");
  CHECK(verl.format == qwen::AnswerFormat::kNumber);
  const qwen::DataFields chinese = fields_of({"--data-preset", "gsm8k_chinese", "--question-field", "question"});
  CHECK(chinese.question == "question");
  CHECK(chinese.answer == "answer_only");
  CHECK(chinese.format == qwen::AnswerFormat::kNumber);
  CHECK(fields_of({"--data-preset", "verl", "--answer-format", "gsm8k"}).format == qwen::AnswerFormat::kGsm8k);
  Train train;
  CHECK_THROWS_AS(parse(train.app, plus(inputs.required(), {"--data-preset", "openai"})), CLI::ValidationError);
}

TEST_CASE("cli: the loss family and the advantage estimators by verl's names") {
  TrainInputs inputs;
  Train train;
  parse(train.app, plus(inputs.required(), {"--policy-loss", "sapo", "--tau-neg", "1.5", "--adv-estimator", "rloo",
                                            "--loss-agg-mode", "token-sum"}));
  const qwen::TrainOptions& o = train.command.options;
  CHECK(o.loss.mode == dapo::PolicyLossMode::kSapo);
  CHECK(o.loss.tau_neg == 1.5);
  CHECK(o.adv_estimator == dapo::AdvantageEstimator::kRloo);
  CHECK(o.loss.aggregation == dapo::LossAggregation::kTokenSum);
  CHECK(o.to_json().at("policy_loss") == "sapo");
  CHECK(o.to_json().at("adv_estimator") == "rloo");
  const std::string dro = parse_error(plus(inputs.required(), {"--policy-loss", "dro"}));
  INFO(dro);
  CHECK(dro.find("--dro-beta is 0, expected a finite value > 0 for the dro loss") != std::string::npos);
}

TEST_CASE("cli: TRL's --loss-type, the KL loss, the entropy term and rollout correction") {
  TrainInputs inputs;
  Train train;
  parse(train.app,
        plus(inputs.required(), {"--loss-type", "dr_grpo", "--beta", "0.05", "--kl-loss-type", "k3+", "--entropy-coeff",
                                 "0.001", "--rollout-is", "sequence", "--rollout-is-threshold", "0.5_2.0",
                                 "--rollout-rs", "token_k1,seq_max_k2", "--rollout-rs-threshold", "1.5"}));
  const qwen::TrainOptions& o = train.command.options;
  CHECK(o.loss.mode == dapo::PolicyLossMode::kVanilla);
  CHECK(o.loss.aggregation == dapo::LossAggregation::kSeqMeanTokenSumNorm);
  CHECK(o.extras.kl_loss_coef == 0.05);
  CHECK(o.extras.kl_loss_type == "k3+");
  CHECK(o.extras.entropy_coeff == 0.001);
  REQUIRE(o.extras.rollout_is_options().has_value());
  CHECK(o.extras.rollout_is_options()->level == dapo::RolloutIsLevel::kSequence);
  CHECK(o.extras.rollout_is_options()->lower == 0.5);
  CHECK(o.extras.rollout_rs_options().size() == 2);
  Train sapo;
  parse(sapo.app, plus(inputs.required(), {"--loss-type", "sapo", "--rollout-is", "none"}));
  CHECK(sapo.command.options.loss.mode == dapo::PolicyLossMode::kSapo);
  CHECK(sapo.command.options.loss.aggregation == dapo::LossAggregation::kSeqMeanTokenMean);
  CHECK_FALSE(sapo.command.options.extras.rollout_correction());
  const std::string kl = parse_error(plus(inputs.required(), {"--kl-loss-type", "k4"}));
  INFO(kl);
  CHECK(kl.find("--kl-loss-type: dapo::parse_kl_penalty: kl_penalty is 'k4'") != std::string::npos);
  CHECK(parse_error(plus(inputs.required(), {"--loss-type", "vespo"})).find("--loss-type") != std::string::npos);
}

TEST_CASE("cli: --algo grpo sets defaults; settings given on the command line or in --config win") {
  TrainInputs inputs;
  qwen::TrainOptions grpo;
  grpo.use_grpo_baseline();

  SUBCASE("alone: exactly the GRPO baseline") {
    Train train;
    parse(train.app, plus(inputs.required(), {"--algo", "grpo"}));
    CHECK(train.command.options.to_json() == grpo.to_json());
  }
  SUBCASE("explicit settings kept, before or after --algo") {
    for (const bool algo_first : {true, false}) {
      std::vector<std::string> explicit_settings = {"--clip-ratio-high", "0.28",      "--overlong-buffer-len", "64",
                                                    "--loss-agg-mode",   "token-mean"};
      std::vector<std::string> words = inputs.required();
      if (algo_first) words = plus(words, {"--algo", "grpo"});
      words = plus(words, explicit_settings);
      if (!algo_first) words = plus(words, {"--algo", "grpo"});
      Train train;
      parse(train.app, words);
      const qwen::TrainOptions& o = train.command.options;
      INFO("algo first: " << algo_first);
      CHECK(o.algorithm == qwen::Algorithm::kGrpo);
      CHECK(o.loss.clip_high == 0.28);
      CHECK(o.rewards.overlong_cache == 64);
      CHECK(o.loss.aggregation == dapo::LossAggregation::kTokenMean);
      CHECK(o.loss.clip_low == grpo.loss.clip_low);  // the ones not given: the preset's
      CHECK_FALSE(o.dynamic_sampling);
    }
  }
  SUBCASE("a setting from --config counts as given") {
    const fs::path config = inputs.scratch.path() / "run.toml";
    std::ofstream(config) << "clip-ratio-high = 0.28\ndynamic-sampling = true\n";
    Train train;
    parse(train.app, plus(inputs.required(), {"--algo", "grpo", "--config", config.string()}));
    CHECK(train.command.options.loss.clip_high == 0.28);
    CHECK(train.command.options.dynamic_sampling);
    CHECK(train.command.options.loss.aggregation == dapo::LossAggregation::kSeqMeanTokenMean);
  }
  SUBCASE("--algo grpo from --config applies the preset too") {
    const fs::path config = inputs.scratch.path() / "run.toml";
    std::ofstream(config) << "algo = \"grpo\"\n";
    Train train;
    parse(train.app, plus(inputs.required(), {"--config", config.string(), "--clip-ratio-low", "0.1"}));
    CHECK(train.command.options.algorithm == qwen::Algorithm::kGrpo);
    CHECK(train.command.options.loss.clip_high == 0.2);
    CHECK(train.command.options.loss.clip_low == 0.1);
  }
}

TEST_CASE("cli: bfloat16 weights are refused for training unless --allow-bf16-weights") {
  TrainInputs inputs;
  const std::string refused = parse_error(plus(inputs.required(), {"--dtype", "bfloat16"}));
  CHECK(refused.find("--dtype") != std::string::npos);
  CHECK(refused.find("--autocast bfloat16") != std::string::npos);
  CHECK(refused.find("--allow-bf16-weights") != std::string::npos);
  CHECK(parse_error(plus(inputs.required(), {"--dtype", "bfloat16", "--allow-bf16-weights"})).empty());
  CHECK(parse_error(plus(inputs.required(), {"--dtype", "bfloat16", "--steps", "0"})).empty());  // evaluation only
  CHECK(parse_error(plus(inputs.required(), {"--autocast", "bfloat16"})).empty());
}

TEST_CASE("cli: --dummy-accuracy needs --load-format dummy, and lies in [0, 1)") {
  TrainInputs inputs;
  const std::string refused = parse_error(plus(inputs.required(), {"--dummy-accuracy", "0.7"}));
  CHECK(refused.find("--dummy-accuracy") != std::string::npos);
  CHECK(refused.find("--load-format dummy") != std::string::npos);
  CHECK(parse_error(plus(inputs.required(), {"--load-format", "dummy", "--dummy-accuracy", "0.7"})).empty());
  CHECK(parse_error(plus(inputs.required(), {"--load-format", "dummy"})).empty());
  CHECK(parse_error(plus(inputs.required(), {"--load-format", "dummy", "--dummy-accuracy", "1"}))
            .find("--dummy-accuracy must lie in [0, 1)") != std::string::npos);
  CHECK(parse_error(plus(inputs.required(), {"--load-format", "pt"})).find("--load-format") != std::string::npos);
}

TEST_CASE("cli: an --output that holds a run is refused unless --resume or --overwrite") {
  TrainInputs inputs;
  const fs::path run = inputs.scratch.path() / "run";
  auto make_run = [&run] {
    fs::create_directories(run / "checkpoints" / "step-000001");
    fs::create_directories(run / "rollouts");
    std::ofstream(run / "metrics.jsonl") << "{}\n";
    std::ofstream(run / "events.out.tfevents.1.host") << "x";
    std::ofstream(run / "notes.txt") << "the user's own file\n";
  };
  auto train_with = [&](const std::vector<std::string>& more) {
    auto train = std::make_unique<Train>();
    parse(train->app, plus(plus(inputs.required(), {"--output", run.string()}), more));
    return train;
  };

  SUBCASE("a new or empty directory is fine") {
    CHECK_NOTHROW(qwen::cli::prepare_train_output(train_with({})->command));
    fs::create_directories(run);
    CHECK_NOTHROW(qwen::cli::prepare_train_output(train_with({})->command));
  }
  SUBCASE("train: refused, with what is there and the way out") {
    make_run();
    try {
      qwen::cli::prepare_train_output(train_with({})->command);
      FAIL("a used --output was accepted");
    } catch (const std::invalid_argument& error) {
      const std::string message = error.what();
      CHECK(message.find(run.string()) != std::string::npos);
      CHECK(message.find("metrics.jsonl") != std::string::npos);
      CHECK(message.find("checkpoints/") != std::string::npos);
      CHECK(message.find("--resume") != std::string::npos);
      CHECK(message.find("--overwrite") != std::string::npos);
    }
    CHECK(fs::exists(run / "metrics.jsonl"));
  }
  SUBCASE("train --resume: accepted, nothing removed") {
    make_run();
    CHECK_NOTHROW(qwen::cli::prepare_train_output(train_with({"--resume", (run / "checkpoints").string()})->command));
    CHECK(fs::exists(run / "metrics.jsonl"));
    CHECK(fs::exists(run / "checkpoints"));
  }
  SUBCASE("--overwrite removes the run's files and only those") {
    make_run();
    qwen::cli::prepare_train_output(train_with({"--overwrite"})->command);
    CHECK(qwen::RunDirectory{run}.files_present().empty());
    CHECK_FALSE(fs::exists(run / "rollouts"));
    CHECK_FALSE(fs::exists(run / "events.out.tfevents.1.host"));
    CHECK(fs::exists(run / "notes.txt"));
  }
  SUBCASE("--overwrite and --resume together are refused") {
    CHECK_THROWS_AS(train_with({"--overwrite", "--resume", run.string()}), CLI::ExcludesError);
  }
  SUBCASE("demo: refused without --overwrite, replaced with it") {
    make_run();
    std::ofstream(run / "summary.json") << "{}\n";
    Demo refused;
    parse(refused.app, {"demo", "--output", run.string()});
    CHECK_THROWS_WITH_AS(qwen::cli::prepare_demo_output(refused.command), doctest::Contains("--overwrite"),
                         std::invalid_argument);
    Demo overwriting;
    parse(overwriting.app, {"demo", "--output", run.string(), "--overwrite"});
    qwen::cli::prepare_demo_output(overwriting.command);
    CHECK(qwen::RunDirectory{run}.files_present().empty());
    CHECK(fs::exists(run / "notes.txt"));
  }
}

TEST_CASE("cli: --print-config's output read back with --config gives the same settings") {
  TrainInputs inputs;
  const fs::path config = inputs.scratch.path() / "printed.toml";

  SUBCASE("train") {
    Train first;
    parse(first.app, plus(inputs.required(), {"--algo",
                                              "grpo",
                                              "--clip-ratio-high",
                                              "0.28",
                                              "--lr",
                                              "3.3333333333333335e-07",
                                              "--no-dynamic-sampling",
                                              "--no-shared-prompt",
                                              "--mask-truncated",
                                              "--logger",
                                              "jsonl,console",
                                              "--max-shard-size",
                                              "2GiB",
                                              "--system-prompt",
                                              "Think, then answer.",
                                              "--question-field",
                                              "problem",
                                              "--lenient-answers",
                                              "--constant-lr",
                                              "--save-total-limit",
                                              "0",
                                              "--chat-template",
                                              "builtin",
                                              "--output",
                                              "runs/x",
                                              "--print-config"}));
    CHECK(first.command.print_config);
    const std::string printed = qwen::cli::effective_config(*first.command.app);
    std::ofstream(config) << printed;
    for (const char* action : {"\nprint-config", "\nconfig", "\noverwrite", "\nhelp"}) {  // actions, not settings
      CHECK(printed.find(action) == std::string::npos);
    }

    Train second;
    parse(second.app, {"train", "--config", config.string()});
    CHECK(second.options().to_json() == first.options().to_json());
    CHECK(second.command.options.loggers == first.command.options.loggers);
    CHECK(second.command.options.max_shard_bytes == first.command.options.max_shard_bytes);
    CHECK(second.command.options.keep_checkpoints == 0);
    CHECK(second.command.options.system_prompt == "Think, then answer.");
    CHECK(second.command.options.lr == 3.3333333333333335e-07);  // written exactly
    CHECK(second.command.fields.question == "problem");
    CHECK(second.command.model_dir == inputs.model.string());
    CHECK(second.command.output == "runs/x");
    CHECK(second.command.chat_template == "builtin");
    CHECK(second.command.lenient_answers);
    CHECK_FALSE(second.command.options.shared_prompt);
    CHECK(qwen::cli::effective_config(*second.command.app) == printed);  // a fixed point
  }
  SUBCASE("train with the default system prompt: left out (it has newlines), the default comes back") {
    Train first;
    parse(first.app, plus(inputs.required(), {"--print-config"}));
    const std::string printed = qwen::cli::effective_config(*first.command.app);
    CHECK(printed.find("# system-prompt: not written") != std::string::npos);
    std::ofstream(config) << printed;
    Train second;
    parse(second.app, {"train", "--config", config.string()});
    CHECK(second.options().to_json() == first.options().to_json());
    CHECK(second.command.options.system_prompt == qwen::kSeedSystemPrompt);
  }
  SUBCASE("demo") {
    Demo first;
    parse(first.app, {"demo", "--algo", "grpo", "--rl-groups", "64", "--rl-mini-groups", "32", "--seed", "3",
                      "--constant-lr", "--quiet", "--output", "somewhere"});
    std::ofstream(config) << qwen::cli::effective_config(*first.command.app);
    Demo second;
    parse(second.app, {"demo", "--config", config.string()});
    const qwen::DemoOptions& a = first.command.options;
    const qwen::DemoOptions& b = second.command.options;
    CHECK(second.command.algorithm == "grpo");
    CHECK(second.command.output == "somewhere");
    CHECK(b.rl_groups == 64);
    CHECK(b.rl_mini_groups == 32);
    CHECK(b.seed == 3);
    CHECK_FALSE(b.cosine_schedule);
    CHECK(b.quiet);
    CHECK(b.rl_lr == a.rl_lr);
    CHECK(b.sft_target_accuracy == a.sft_target_accuracy);
    CHECK(b.device == a.device);
    CHECK(qwen::cli::effective_config(*second.command.app) == qwen::cli::effective_config(*first.command.app));
  }
  SUBCASE("the command line wins over the file; unknown names and actions in the file are errors") {
    std::ofstream(config) << "# a comment\nlr = 0.5\nrollout-n = 8\n";
    Train train;
    parse(train.app, plus(inputs.required(), {"--config", config.string(), "--lr", "0.25"}));
    CHECK(train.command.options.lr == 0.25);
    CHECK(train.command.options.rollout_n == 8);

    std::ofstream(config) << "learning-rate = 0.5\n";
    CHECK(parse_error(plus(inputs.required(), {"--config", config.string()})).find("learning-rate") !=
          std::string::npos);
    std::ofstream(config) << "overwrite = true\n";
    CHECK(parse_error(plus(inputs.required(), {"--config", config.string()})).find("overwrite") != std::string::npos);
    std::ofstream(config) << "lr = -1\n";  // validated like the command line
    CHECK(parse_error(plus(inputs.required(), {"--config", config.string()})).find("--lr") != std::string::npos);
    CHECK(parse_error(plus(inputs.required(), {"--config", (inputs.scratch.path() / "missing.toml").string()}))
              .find("--config") != std::string::npos);
  }
}

TEST_CASE("cli: out-of-range values are refused with the flag named") {
  TrainInputs inputs;
  const std::vector<std::pair<std::vector<std::string>, std::string>> train_cases = {
      {{"--lr", "0"}, "--lr"},
      {{"--lr", "-1e-6"}, "--lr"},
      {{"--lr", "nan"}, "--lr"},
      {{"--lr", "inf"}, "--lr"},
      {{"--steps", "-1"}, "--steps"},
      {{"--rollout-n", "1"}, "--rollout-n"},
      {{"--num-generations", "0"}, "--rollout-n"},
      {{"--train-batch-size", "0"}, "--train-batch-size"},
      {{"--ppo-mini-batch-size", "0"}, "--ppo-mini-batch-size"},
      {{"--ppo-mini-batch-size", "3"}, "--ppo-mini-batch-size 3 must divide --train-batch-size 16"},  // together
      {{"--ppo-epochs", "0"}, "--ppo-epochs"},
      {{"--max-new-tokens", "0"}, "--max-new-tokens"},
      {{"--overlong-buffer-len", "-1"}, "--overlong-buffer-len"},
      {{"--max-new-tokens", "16", "--overlong-buffer-len", "32"}, "--overlong-buffer-len 32 must lie in"},
      {{"--clip-ratio-low", "1.5"}, "--clip-ratio-low"},
      {{"--clip-ratio-high", "nan"}, "--clip-ratio-high"},
      {{"--clip-ratio-c", "0.5"}, "--clip-ratio-c"},
      {{"--temperature", "-0.1"}, "--temperature"},
      {{"--top-p", "0"}, "--top-p"},
      {{"--top-k", "-1"}, "--top-k"},
      {{"--weight-decay", "nan"}, "--weight-decay"},
      {{"--grad-clip", "0"}, "--grad-clip"},
      {{"--max-grad-norm", "nan"}, "--grad-clip"},
      {{"--min-lr-ratio", "2"}, "--min-lr-ratio"},
      {{"--warmup-steps", "-1"}, "--warmup-steps"},
      {{"--eval-every", "-1"}, "--eval-every"},
      {{"--save-every", "-2"}, "--save-every"},  // -1: no checkpoint at all
      {{"--save-total-limit", "-1"}, "--save-total-limit"},
      {{"--log-rollouts", "-1"}, "--log-rollouts"},
      {{"--logger", "wandb"}, "--logger"},
      {{"--max-shard-size", "0"}, "--max-shard-size"},
      {{"--max-shard-size", "5XB"}, "--max-shard-size"},
      {{"--loss-agg-mode", "mean"}, "--loss-agg-mode"},
      {{"--policy-loss", "ppo"}, "--policy-loss"},
      {{"--policy-loss", "kl_cov"}, "--policy-loss"},
      {{"--adv-estimator", "gae"}, "--adv-estimator"},
      {{"--tau-neg", "0"}, "--tau-neg"},
      {{"--seed", "-1"}, "--seed"},
      {{"--logprob-chunk", "0"}, "--logprob-chunk"},
      {{"--correctness-weight", "nan"}, "--correctness-weight"},
      {{"--nproc", "0"}, "--nproc"},
      {{"--dist-timeout", "0"}, "--dist-timeout"},
      {{"--chat-template", "auto"}, "--chat-template"},
  };
  for (const auto& [words, flag] : train_cases) {
    const std::string error = parse_error(plus(inputs.required(), words));
    INFO(words.front() << " " << words.back() << ": " << error);
    CHECK(error.find(flag) != std::string::npos);
  }
  const std::vector<std::pair<std::vector<std::string>, std::string>> demo_cases = {
      {{"--rl-steps", "-1"}, "--steps"},
      {{"--rl-groups", "0"}, "--train-batch-size"},
      {{"--rl-lr", "nan"}, "--lr"},
      {{"--sft-target", "1.5"}, "--sft-target"},
      {{"--sft-lr", "0"}, "--sft-lr"},
      {{"--sft-min-steps", "700"}, "--sft-min-steps"},
      {{"--eval-problems", "0"}, "--eval-problems"},
      {{"--rl-mini-groups", "5"}, "--ppo-mini-batch-size 5 must divide --train-batch-size 32"},
  };
  for (const auto& [words, flag] : demo_cases) {
    const std::string error = parse_error(plus({"demo"}, words), true);
    INFO(words.front() << " " << words.back() << ": " << error);
    CHECK(error.find(flag) != std::string::npos);
  }
  // And the defaults themselves pass.
  CHECK(parse_error(inputs.required()).empty());
  CHECK(parse_error({"demo"}, true).empty());
}
