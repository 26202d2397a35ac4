// The shared command-line options, --config / --print-config, the output directory's check, and the --nproc
// launcher's entry.
#include "qwen_gsm8k/cli/options.hpp"

#include <dapo/core/trl_loss_type.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "qwen_gsm8k/common/joined.hpp"
#include "qwen_gsm8k/logging/metric_log.hpp"

namespace qwen::cli {
namespace {

// argv without the launcher's own option (--nproc N or --nproc=N): what each rank runs.
std::vector<std::string> rank_arguments(int argc, char** argv) {
  std::vector<std::string> arguments;
  for (int i = 0; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument == "--nproc") {
      ++i;
      continue;
    }
    if (argument.rfind("--nproc=", 0) == 0) continue;
    arguments.push_back(argument);
  }
  return arguments;
}

std::optional<double> number_of(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return std::nullopt;
  return value;
}

// A validator of numbers: `description` shows in --help after the type ("FLOAT:POSITIVE"), `expected` in the error.
CLI::Validator number_validator(const std::string& description, std::function<bool(double)> accepts,
                                const std::string& expected) {
  return CLI::Validator(
      [accepts = std::move(accepts), expected](std::string& text) -> std::string {
        const auto value = number_of(text);
        if (!value) return "\"" + text + "\" is not a number";
        if (!std::isfinite(*value) || !accepts(*value)) return text + " is out of range: expected " + expected;
        return {};
      },
      description);
}

// `text` as a TOML value that CLI11's reader gives back unchanged, or nothing if it cannot: that reader cuts a line at
// '#' even inside quotes, reads one line per value, and unquotes without escapes.
std::optional<std::string> toml_value(const std::string& text) {
  if (text == "true" || text == "false") return text;
  if (number_of(text) && std::isfinite(*number_of(text)) && text.find_first_of("xX") == std::string::npos) return text;
  if (text.find_first_of("\n\r#") != std::string::npos) return std::nullopt;
  if (text.find('"') == std::string::npos) return "\"" + text + "\"";
  if (text.find('\'') == std::string::npos) return "'" + text + "'";
  return std::nullopt;
}

// --config FILE: the file's values for the options the command line left unset. CLI11 2.1 reads a configuration file
// for the top-level app only, so the subcommand reads its own with CLI11's reader and the same rules: flags through
// their flag values (a negated name inverts), everything else as the option's results.
void read_config_file(CLI::App& command, const std::string& path) {
  const auto reader = command.get_config_formatter();
  const std::string where = path + ": ";
  for (const CLI::ConfigItem& item : reader->from_file(path)) {
    if (item.name == "--" || item.name == "++") continue;  // the reader's section markers
    if (!item.parents.empty() && !(item.parents.size() == 1 && item.parents.front() == command.get_name())) {
      throw CLI::ConfigError(where + "[" + joined(item.parents, ".") + "] " + item.name + ": expected no section or [" +
                             command.get_name() + "]");
    }
    CLI::Option* option = command.get_option_no_throw("--" + item.name);
    if (option == nullptr) {
      throw CLI::ConfigError(where + "\"" + item.name + "\" is not an option of `qwen_gsm8k " + command.get_name() +
                             "` (see its --help)");
    }
    if (!option->get_configurable()) {
      throw CLI::ConfigError(where + item.name + " is not read from a file: give it on the command line");
    }
    if (option->count() > 0) continue;  // the command line wins
    if (option->get_expected_min() == 0) {
      option->add_result(option->get_flag_value(item.name, reader->to_flag(item)));
    } else {
      option->add_result(item.inputs);
    }
  }
}

}  // namespace

CLI::Validator positive() {
  return number_validator(
      "POSITIVE", [](double x) { return x > 0; }, "> 0");
}
CLI::Validator non_negative() {
  return number_validator(
      "NONNEGATIVE", [](double x) { return x >= 0; }, ">= 0");
}
CLI::Validator at_least(double minimum) {
  const std::string bound = exact_number_text(minimum);
  return number_validator(
      "AT LEAST " + bound, [minimum](double x) { return x >= minimum; }, ">= " + bound);
}
CLI::Validator in_range(double minimum, double maximum) {
  const std::string range = "[" + exact_number_text(minimum) + ", " + exact_number_text(maximum) + "]";
  return number_validator(
      "in " + range, [minimum, maximum](double x) { return x >= minimum && x <= maximum; }, "a value in " + range);
}
CLI::Validator finite() {
  return number_validator(
      "", [](double) { return true; }, "a finite number");
}

DataFields data_fields(const std::string& preset, const DataFields& given, const std::string& answer_format) {
  DataFields fields = data_preset(preset);
  if (!given.question.empty()) fields.question = given.question;
  if (!given.answer.empty()) fields.answer = given.answer;
  if (!answer_format.empty()) fields.format = answer_format == "number" ? AnswerFormat::kNumber : AnswerFormat::kGsm8k;
  return fields;
}

std::string exact_number_text(double value) {
  std::array<char, 64> buffer{};
  const auto [end, error] = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value);
  return error == std::errc() ? std::string(buffer.data(), end) : std::to_string(value);
}

CLI::Option* add_switch(CLI::App& command, const std::string& names, bool& value, const std::string& help) {
  CLI::Option* option = command.add_flag(names, value, help);
  option->default_function([&value] { return std::string(value ? "true" : "false"); });
  option->capture_default_str();
  option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  return option;
}

void add_run_options(CLI::App& command, const RunSettings& s) {
  add_setting(command, "--steps,--rl-steps", *s.total_steps,
              "Training steps (verl trainer.total_training_steps, TRL max_steps); --rl-steps: the demo's old name")
      ->check(non_negative());
  add_setting(command, "--train-batch-size,--rl-groups", *s.train_batch_size,
              "Prompts (groups) trained on per step (verl data.train_batch_size); --rl-groups: the demo's old name")
      ->check(positive());
  add_setting(command, "--ppo-mini-batch-size,--rl-mini-groups", *s.ppo_mini_batch_size,
              "Groups per optimizer update; must divide --train-batch-size (verl actor.ppo_mini_batch_size); "
              "--rl-mini-groups: the demo's old name")
      ->check(positive());
  add_setting(command, "--lr,--rl-lr", *s.lr,
              "AdamW learning rate (verl actor.optim.lr, TRL learning_rate); --rl-lr: the demo's old name")
      ->check(positive());
  add_setting(command, "--seed", *s.seed, "Seed of every draw (data order, sampling); the same seed repeats the run")
      ->check(non_negative());
  add_setting(command, "--rollout-n,--num-generations", *s.rollout_n,
              "Responses per prompt, G (verl actor_rollout_ref.rollout.n, TRL num_generations)")
      ->check(at_least(2));
  add_setting(command, "--ppo-epochs,--num-iterations", *s.ppo_epochs,
              "Passes over each step's batch; updates after the first are off-policy (verl actor.ppo_epochs, TRL "
              "num_iterations)")
      ->check(positive());
  add_switch(command, "--cosine,!--constant-lr", *s.cosine_schedule,
             "Cosine decay of the learning rate after warm-up, or a constant one (verl "
             "actor.optim.lr_scheduler_type, TRL lr_scheduler_type)");
  add_setting(command, "--warmup-steps", *s.warmup_steps,
              "Linear warm-up of the learning rate, in optimizer updates (verl actor.optim.lr_warmup_steps, TRL "
              "warmup_steps)")
      ->check(non_negative());
  add_switch(command, "--shared-prompt,!--no-shared-prompt", *s.shared_prompt,
             "The update's forward passes compute each group's prompt once, its G responses attending to it (prompt + "
             "G x response tokens instead of G x (prompt + response); verl's PrefixGrouper): the same log-probs and "
             "gradients within rounding");
  add_setting(command, "--eval-every", *s.eval_every,
              "Evaluate every K steps, and at the start and end; 0: only then (verl trainer.test_freq, TRL eval_steps)")
      ->check(non_negative());
  add_setting(command, "--eval-problems", *s.eval_problems, "Held-out problems per evaluation (greedy)")
      ->check(non_negative());
  std::vector<std::string>& loggers = *s.loggers;
  command
      .add_option("--logger", loggers,
                  "Where each step's metrics go, a comma list of console (progress line), jsonl (metrics.jsonl), "
                  "tensorboard (events.out.tfevents.*) (verl trainer.logger, TRL report_to)")
      ->delimiter(',')
      ->check(CLI::IsMember(kLoggerNames))
      ->default_function([&loggers] { return joined(loggers, ","); })
      ->capture_default_str();
  add_setting(command, "--log-rollouts", *s.log_rollouts,
              "Groups per step written with their responses and rewards to rollouts/step-NNNNNN.jsonl; 0: none (verl "
              "trainer.rollout_data_dir, TRL log_completions)")
      ->check(non_negative());
  add_switch(command, "--quiet", *s.quiet, "No progress lines");
}

namespace {

// A string setting whose empty value (off) is spelled "none" on the command line, in --help and in --print-config.
CLI::Option* add_optional_name(CLI::App& command, const std::string& names, std::string& value,
                               const std::string& help) {
  return command
      .add_option_function<std::string>(
          names, [&value](const std::string& given) { value = given == "none" ? std::string() : given; }, help)
      ->default_function([&value] { return value.empty() ? std::string("none") : value; })
      ->capture_default_str();
}

}  // namespace

void add_algorithm_options(CLI::App& command, const AlgorithmSettings& s) {
  std::vector<std::string> losses;
  for (const auto& [mode, name] : dapo::kPolicyLossNames) {
    if (mode != dapo::PolicyLossMode::kKlCov && mode != dapo::PolicyLossMode::kClipCov) losses.emplace_back(name);
  }
  command
      .add_option_function<std::string>(
          "--policy-loss,--loss-mode", [s](const std::string& name) { *s.mode = dapo::policy_loss_from_name(name); },
          "Policy loss: " + joined(losses, ", ") +
              " (verl actor.policy_loss.loss_mode; docs/algorithm.md has each formula; kl_cov and clip_cov choose "
              "tokens per call and are library-only). train: the aggregation stays --loss-agg-mode's (verl uses "
              "seq-mean-token-mean for gspo and sapo); demo: as verl's")
      ->check(CLI::IsMember(losses))
      ->default_function([s] { return std::string(dapo::policy_loss_name(*s.mode)); })
      ->capture_default_str();
  add_setting(command, "--tau-pos", *s.tau_pos, "sapo's gate temperature for A > 0 (verl actor.tau_pos)")
      ->check(positive());
  add_setting(command, "--tau-neg", *s.tau_neg, "sapo's gate temperature for A <= 0 (verl actor.tau_neg)")
      ->check(positive());
  add_setting(command, "--dro-beta", *s.dro_beta,
              "dro's log-ratio penalty weight, required by --policy-loss dro (verl actor.policy_loss.dro_beta)")
      ->check(non_negative());
  std::vector<std::string> estimators;
  for (const auto& [estimator, name] : dapo::kAdvantageEstimatorNames) estimators.emplace_back(name);
  command
      .add_option_function<std::string>(
          "--adv-estimator",
          [s](const std::string& name) { *s.adv_estimator = dapo::advantage_estimator_from_name(name); },
          "Advantage estimator: " + joined(estimators, ", ") + " (verl algorithm.adv_estimator; grpo is DAPO's Eq. 9)")
      ->check(CLI::IsMember(estimators))
      ->default_function([s] { return std::string(dapo::advantage_estimator_name(*s.adv_estimator)); })
      ->capture_default_str();
  LossExtras& extras = *s.extras;
  add_setting(command, "--kl-loss-coef,--beta", extras.kl_loss_coef,
              "Weight of a KL loss against the frozen starting policy, aggregated as the policy loss; 0: none, and no "
              "reference model is kept (verl actor.kl_loss_coef with use_kl_loss, TRL beta)")
      ->check(non_negative());
  add_setting(command, "--kl-loss-type", extras.kl_loss_type,
              "The KL loss's estimator: k1 (kl), abs, k2 (mse), k3 (low_var_kl), each with + for k2's gradient "
              "(verl actor.kl_loss_type)");
  add_setting(command, "--entropy-coeff", extras.entropy_coeff,
              "Minus this times the aggregated entropy joins the loss (verl actor.entropy_coeff)");
  add_optional_name(command, "--rollout-is", extras.rollout_is,
                    "Rollout correction's IS weights on the loss, token or sequence level, from the trainer's old "
                    "log-probs against the sampler's; none: off (verl algorithm.rollout_correction.rollout_is)")
      ->check(CLI::IsMember({"none", "token", "sequence"}));
  add_setting(
      command, "--rollout-is-threshold", extras.rollout_is_threshold,
      "U truncates the weights at U (TIS); L_U zeroes them outside [L, U] (IcePop) (verl rollout_is_threshold)");
  add_optional_name(
      command, "--rollout-rs", extras.rollout_rs,
      "Rollout rejection, comma separated: token_k1..3, seq_sum_k1..3, seq_mean_k1..3, seq_max_k2, seq_max_k3; "
      "rejected tokens leave the loss; none: off (verl algorithm.rollout_correction.rollout_rs)");
  add_setting(command, "--rollout-rs-threshold", extras.rollout_rs_threshold,
              "The rejection's threshold, one for all options or one per option, U or L_U (verl rollout_rs_threshold)");
}

void add_train_options(CLI::App& command, TrainOptions& o) {
  add_setting(command, "--gen-batch-size", o.gen_batch_size,
              "Prompts per generation round (verl data.gen_batch_size); 0 = train batch size")
      ->check(non_negative());
  add_setting(command, "--ppo-micro-batch-size", o.ppo_micro_batch_size,
              "Groups per forward/backward (verl actor.ppo_micro_batch_size_per_gpu); 0 = mini-batch")
      ->check(non_negative());
  add_switch(command, "--use-dynamic-bsz", o.use_dynamic_bsz,
             "Micro-batches by a token budget: rows packed longest first, each micro-batch at most "
             "--ppo-max-token-len-per-gpu padded tokens; replaces --ppo-micro-batch-size (verl actor.use_dynamic_bsz)");
  add_setting(command, "--ppo-max-token-len-per-gpu", o.ppo_max_token_len_per_gpu,
              "With --use-dynamic-bsz: the update's micro-batch budget, rows x longest prompt + response (verl "
              "actor.ppo_max_token_len_per_gpu)")
      ->check(positive());
  add_setting(command, "--log-prob-max-token-len-per-gpu", o.log_prob_max_token_len_per_gpu,
              "With --use-dynamic-bsz: the same budget for the no-grad passes, old and reference log-probs (verl "
              "rollout/ref.log_prob_max_token_len_per_gpu); 0 = --ppo-max-token-len-per-gpu")
      ->check(non_negative());
  add_setting(command, "--max-num-gen-batches", o.max_num_gen_batches,
              "Generation rounds allowed per step (verl algorithm.filter_groups.max_num_gen_batches); 0 = unlimited")
      ->check(non_negative());
  add_switch(command, "--dynamic-sampling,!--no-dynamic-sampling", o.dynamic_sampling,
             "Dynamic sampling: drop groups whose responses all agree and generate more (verl "
             "algorithm.filter_groups.enable; --algo grpo: off)");
  add_switch(command, "--mask-truncated,--mask-truncated-completions", o.mask_truncated,
             "Overlong filtering: truncated responses out of the loss (TRL mask_truncated_completions)");
  add_setting(command, "--clip-ratio-low", o.loss.clip_low, "epsilon_low (verl actor.clip_ratio_low, TRL epsilon)")
      ->check(in_range(0, 1));
  add_setting(command, "--clip-ratio-high", o.loss.clip_high,
              "epsilon_high, Clip-Higher (verl actor.clip_ratio_high, TRL epsilon_high; --algo grpo: 0.2)")
      ->check(non_negative());
  add_setting(command, "--clip-ratio-c", o.loss.dual_clip,
              "Dual-clip bound for A < 0; 0 disables (verl actor.clip_ratio_c)")
      ->check(number_validator(
          "0 OR ABOVE 1", [](double c) { return c == 0 || c > 1; }, "0 (off) or a value > 1"));
  std::vector<std::string> modes;
  for (const auto& [mode, name] : dapo::kAggregationNames) modes.emplace_back(name);
  command
      .add_option_function<std::string>(
          "--loss-agg-mode", [&o](const std::string& name) { o.loss.aggregation = dapo::aggregation_from_name(name); },
          "Loss aggregation: " + joined(modes, ", ") +
              " (verl actor.loss_agg_mode; TRL loss_type dapo = token-mean, grpo = seq-mean-token-mean; --algo grpo: "
              "seq-mean-token-mean)")
      ->check(CLI::IsMember(modes))
      ->default_function([&o] { return std::string(dapo::aggregation_name(o.loss.aggregation)); })
      ->capture_default_str();
  command
      .add_option_function<std::string>(
          "--loss-type",
          [&o](const std::string& name) {
            // The loss and aggregation TRL's name stands for (dapo::trl_loss_type); the clip stays the --clip-ratio-*
            // flags' (TRL's cispo cap epsilon_high = E is --clip-ratio-low 1 --clip-ratio-high E-1).
            const dapo::TrlLossType trl = dapo::trl_loss_type(name, {.epsilon_high = 5.0});
            o.loss.mode = trl.options.mode;
            o.loss.aggregation = trl.options.aggregation;
          },
          "TRL's loss_type: grpo, bnpo, dr_grpo, dapo, cispo, sapo; sets --policy-loss and --loss-agg-mode as TRL's "
          "name "
          "means them (micro-batches still split the mini-batch's loss exactly, where TRL divides each by its own "
          "count)")
      ->check(CLI::IsMember({"grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"}))
      ->default_str("(none: --policy-loss and --loss-agg-mode)")
      ->configurable(false);  // --print-config writes the two settings it stands for
  add_setting(command, "--max-new-tokens,--max-completion-length", o.max_new_tokens,
              "Response budget, L_max (verl data.max_response_length, TRL max_completion_length)")
      ->check(positive());
  add_setting(command, "--overlong-buffer-len", o.rewards.overlong_cache,
              "Soft overlong zone, L_cache; 0 disables (verl reward_model.overlong_buffer.len; --algo grpo: 0)")
      ->check(non_negative());
  add_setting(command, "--overlong-penalty-factor", o.rewards.overlong_factor,
              "(verl reward_model.overlong_buffer.penalty_factor)")
      ->check(non_negative());
  add_setting(command, "--temperature", o.sampling.temperature,
              "Rollout temperature; 0 = greedy (verl actor_rollout_ref.rollout.temperature, TRL temperature)")
      ->check(non_negative());
  add_setting(command, "--top-p", o.sampling.top_p, "(verl actor_rollout_ref.rollout.top_p, TRL top_p)")
      ->check(number_validator(
          "in (0, 1]", [](double p) { return p > 0 && p <= 1; }, "a value in (0, 1]"));
  add_setting(command, "--top-k", o.sampling.top_k, "0 = off (verl actor_rollout_ref.rollout.top_k, TRL top_k)")
      ->check(non_negative());
  add_setting(command, "--weight-decay", o.weight_decay, "(verl actor.optim.weight_decay, TRL weight_decay)")
      ->check(non_negative());
  add_setting(command, "--min-lr-ratio", o.min_lr_ratio,
              "Cosine floor as a fraction of lr (verl actor.optim.min_lr_ratio)")
      ->check(in_range(0, 1));
  add_setting(command, "--grad-clip,--max-grad-norm", o.grad_clip,
              "Gradient-norm clip (verl actor.grad_clip, TRL max_grad_norm)")
      ->check(positive());
  add_setting(command, "--pass-k", o.eval_pass_k, "Also report pass@k with sampling; 0 = off")->check(non_negative());
  add_setting(command, "--save-every,--save-steps", o.save_every,
              "Checkpoint every K steps, and at the end and when stopped, so that a killed run resumes (--resume); 0: "
              "only at the end; -1: never, not even at the end or when stopped (verl trainer.save_freq, TRL "
              "save_steps)")
      ->check(at_least(-1));
  add_setting(command, "--save-total-limit", o.keep_checkpoints,
              "Newest checkpoints kept; 0 keeps all (TRL save_total_limit, verl trainer.max_actor_ckpt_to_keep)")
      ->check(non_negative());
  command
      .add_option_function<std::string>(
          "--max-shard-size", [&o](const std::string& text) { o.max_shard_bytes = parse_byte_size(text); },
          "Checkpoint weights above this size are split into model-0000k-of-0000n.safetensors with an index: 5GB "
          "(10^9 bytes), 500MB, 2GiB (2^30) or a byte count (transformers max_shard_size)")
      ->type_name("SIZE")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              parse_byte_size(text);
            } catch (const std::invalid_argument& error) {
              return error.what();
            }
            return {};
          },
          ""))
      ->default_function([&o] { return byte_size_text(o.max_shard_bytes); })
      ->capture_default_str();
  add_setting(command, "--correctness-weight", o.rewards.correctness_weight,
              "Weight of the correctness reward (2.0 when right)")
      ->check(finite());
  add_setting(command, "--digit-weight", o.rewards.digit_weight, "Weight of the digit reward (0.5)")->check(finite());
  add_setting(command, "--format-weight", o.rewards.format_weight, "Weight of the strict format reward (0.5)")
      ->check(finite());
  add_setting(command, "--mark-weight", o.rewards.mark_weight, "Weight of the tag reward (0.125 per tag)")
      ->check(finite());
  add_switch(command, "--gradient-checkpointing", o.gradient_checkpointing,
             "Recompute each decoder layer in the backward instead of keeping its activations: same gradients, "
             "activation memory of one layer (verl enable_gradient_checkpointing, TRL gradient_checkpointing)");
  add_setting(command, "--logprob-chunk", o.logprob_chunk, "Rows of lm-head logits alive at once (memory vs speed)")
      ->check(positive());
  add_setting(command, "--max-num-seqs,--max-rollout-rows", o.max_rollout_rows,
              "The generation engine's slots: sequences in flight at once (vLLM max_num_seqs, verl "
              "rollout.max_num_seqs); 0 = every row of a generation round")
      ->check(non_negative());
  add_switch(command, "--cuda-graphs,!--no-cuda-graphs", o.cuda_graphs,
             "On CUDA, run each decode step as a CUDA graph, captured once per step shape (vLLM's default; "
             "--no-cuda-graphs is its enforce_eager)");
  add_switch(command, "--free-cache-engine", o.free_cache_engine,
             "Free the generation engine (its KV cache, compute copy and CUDA graphs) after each step's rollouts, for "
             "the update's memory; default: kept for the run, so later rollouts replay the first one's graphs (verl "
             "rollout.free_cache_engine)");
}

void add_launch_options(CLI::App& command, LaunchSettings& settings, const std::string& nproc_help) {
  add_setting(command, "--nproc", settings.nproc, nproc_help)->check(positive());
  add_setting(command, "--dist-timeout", settings.dist_timeout,
              "Seconds a collective may wait for the other ranks before failing with the lost ranks named")
      ->check(positive());
}

// CLI11 2.6 runs an option's callback after the required options are checked unless its priority says otherwise;
// --config's must run before, since the file may give a required option. CLI11 2.1 and 2.4 have no priorities and run
// every callback before that check. (Detected from the Option class, not from a version number.)
namespace {
template <class OptionT>
void callback_before_requirements(OptionT* option) {
  if constexpr (requires { option->get_callback_priority(); }) {
    using Priority = decltype(option->get_callback_priority());
    option->callback_priority(Priority::PreRequirementsCheck);
  }
}
}  // namespace

void add_config_options(CLI::App& command, bool& print_config) {
  CLI::Option* config =
      command
          .add_option_function<std::string>(
              "--config", [&command](const std::string& path) { read_config_file(command, path); },
              "Read settings from a TOML file (name = value per line, names as the long options without dashes; "
              "--print-config writes one); options on the command line win over the file")
          ->check(CLI::ExistingFile)
          ->configurable(false);
  callback_before_requirements(config);
  command
      .add_flag("--print-config", print_config,
                "Print the effective settings (--algo's preset, this command line and --config applied) as TOML "
                "that --config reads, then exit")
      ->configurable(false);
}

std::string effective_config(CLI::App& command) {
  std::string text = "# qwen_gsm8k " + command.get_name() +
                     ": the effective settings, from --print-config; `qwen_gsm8k " + command.get_name() +
                     " --config FILE` reads them back\n";
  for (CLI::Option* option : command.get_options()) {
    if (!option->get_configurable()) continue;  // --help, --config, --print-config, --overwrite
    option->capture_default_str();              // the bound value now, after parsing
    const std::string value = option->get_default_str();
    if (value.empty()) continue;  // not set and no default (--test, --resume)
    const std::string name = option->get_single_name();
    if (const auto toml = toml_value(value)) {
      text += "\n# " + option->get_description() + "\n" + name + " = " + *toml + "\n";
    } else {
      text += "\n# " + name + ": not written: its value has a newline, '#' or both kinds of quote, which --config " +
              "cannot read back (the default system prompt has newlines); give it on the command line\n";
    }
  }
  return text;
}

CLI::ValidationError settings_error(const CLI::App& command, const std::string& message) {
  std::string text = message;
  const auto is_word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; };
  for (const CLI::Option* option : command.get_options()) {
    for (const std::string& name : option->get_lnames()) {
      std::string setting = name;
      std::replace(setting.begin(), setting.end(), '-', '_');
      if (setting == name) continue;  // one word ("lr", "train"): too likely to be a plain word of the message
      for (auto at = text.find(setting); at != std::string::npos; at = text.find(setting, at + 1)) {
        const auto end = at + setting.size();
        if ((at > 0 && is_word(text[at - 1])) || (end < text.size() && is_word(text[end]))) continue;
        text.replace(at, setting.size(), "--" + name);
      }
    }
  }
  return CLI::ValidationError(text);
}

int64_t parse_byte_size(const std::string& text) {
  static constexpr std::array<std::pair<std::string_view, int64_t>, 6> kUnits{{{"GIB", int64_t{1} << 30},
                                                                               {"MIB", int64_t{1} << 20},
                                                                               {"KIB", int64_t{1} << 10},
                                                                               {"GB", 1'000'000'000},
                                                                               {"MB", 1'000'000},
                                                                               {"KB", 1'000}}};
  std::string upper = text;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  int64_t unit = 1;
  std::string_view digits = upper;
  for (const auto& [suffix, bytes] : kUnits) {
    if (digits.size() > suffix.size() && digits.substr(digits.size() - suffix.size()) == suffix) {
      digits.remove_suffix(suffix.size());
      unit = bytes;
      break;
    }
  }
  int64_t count = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), count);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() || count <= 0 ||
      count > std::numeric_limits<int64_t>::max() / unit) {
    throw std::invalid_argument("\"" + text +
                                "\" is not a size: expected a positive whole number of bytes, or one with GB, MB, KB "
                                "(powers of 10) or GiB, MiB, KiB (powers of 2), e.g. 5GB");
  }
  return count * unit;
}

std::string byte_size_text(int64_t bytes) {
  std::string best = std::to_string(bytes);
  for (const auto& [suffix, unit] : {std::pair{"GB", int64_t{1'000'000'000}}, std::pair{"GiB", int64_t{1} << 30},
                                     std::pair{"MB", int64_t{1'000'000}}, std::pair{"MiB", int64_t{1} << 20},
                                     std::pair{"KB", int64_t{1'000}}, std::pair{"KiB", int64_t{1} << 10}}) {
    if (bytes > 0 && bytes % unit == 0) {
      std::string text = std::to_string(bytes / unit) + suffix;
      if (text.size() < best.size()) best = std::move(text);
    }
  }
  return best;
}

bool prepares_output_here() {
  const char* rank = std::getenv("RANK");
  return rank == nullptr || std::string(rank) == "0";
}

std::optional<int> launch_or_join(const LaunchSettings& settings, int argc, char** argv,
                                  DistributedConfig& distributed) {
  if (settings.nproc > 1) {
    if (std::getenv("RANK") != nullptr) {
      throw std::invalid_argument("--nproc " + std::to_string(settings.nproc) +
                                  " inside a rank (RANK is set): use one or the other");
    }
    return launch_local_ranks(settings.nproc, rank_arguments(argc, argv), std::chrono::seconds(30));
  }
  distributed = DistributedConfig::from_environment();
  if (!(settings.dist_timeout > 0)) throw std::invalid_argument("--dist-timeout must be > 0 seconds");
  distributed.timeout = std::chrono::milliseconds(static_cast<int64_t>(settings.dist_timeout * 1000));
  return std::nullopt;
}

}  // namespace qwen::cli
