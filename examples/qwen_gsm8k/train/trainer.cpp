// The DAPO step, evaluation and the run loop. The step's rollouts are in trainer_rollouts.cpp, its policy update in
// update.cpp, checkpoints and resume in trainer_state.cpp.
#include "qwen_gsm8k/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <stdexcept>

#include "qwen_gsm8k/common/seed.hpp"
#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/report/report.hpp"
#include "qwen_gsm8k/train/batch.hpp"
#include "qwen_gsm8k/train/rollout_log.hpp"
#include "qwen_gsm8k/train/step_metrics.hpp"
#include "qwen_gsm8k/train/update.hpp"

namespace qwen {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string format_duration(double seconds) {
  const auto total = static_cast<int64_t>(seconds);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof text, "%lldh%02lldm", static_cast<long long>(total / 3600),
                  static_cast<long long>(total % 3600 / 60));
  } else {
    std::snprintf(text, sizeof text, "%lldm%02llds", static_cast<long long>(total / 60),
                  static_cast<long long>(total % 60));
  }
  return text;
}

}  // namespace

Qwen2ForCausalLM reference_policy(const Qwen2ForCausalLM& model, std::optional<torch::ScalarType> autocast) {
  Qwen2ForCausalLM copy(model->config());
  torch::NoGradGuard no_grad;
  const auto copy_from = [](const auto& sources, const auto& targets) {
    for (const auto& item : targets) item.value().set_data(sources[item.key()].detach().clone());
  };
  copy_from(model->named_parameters(), copy->named_parameters());
  copy_from(model->named_buffers(), copy->named_buffers());
  if (autocast) {
    for (const auto& module : copy->model->layers->modules(/*include_self=*/false)) {
      if (module->as<torch::nn::Linear>() == nullptr) continue;
      for (auto& parameter : module->parameters(/*recurse=*/false)) parameter.set_data(parameter.to(*autocast));
    }
  }
  for (auto& parameter : copy->parameters()) parameter.requires_grad_(false);
  copy->eval();
  return copy;
}

nlohmann::json EvalResult::to_json() const {
  nlohmann::json row{{"step", step}, {"problems", problems}, {"accuracy", accuracy}};
  if (k > 0) {
    row["pass_at_k"] = pass_at_k;
    row["k"] = k;
  }
  return row;
}

Trainer::Trainer(Qwen2ForCausalLM model, Tokenizer tokenizer, std::vector<Problem> train, std::vector<Problem> test,
                 TrainOptions options, std::shared_ptr<Communicator> communicator)
    : model_(std::move(model)),
      tokenizer_(std::move(tokenizer)),
      train_(std::move(train)),
      test_(std::move(test)),
      options_(std::move(options)),
      sampler_(train_.empty() ? 1 : train_.size(), options_.seed),
      communicator_(std::move(communicator)),
      metric_log_(options_.output_dir, options_.loggers, communicator_ == nullptr || communicator_->is_root()) {
  options_.validate();
  if (train_.empty()) throw std::invalid_argument("trainer: the training set is empty");
  if (communicator_ == nullptr) communicator_ = Communicator::create({}, model_->lm_head_weight().device());
  if (!is_root()) options_.quiet = true;
  if (world_size() > 1) {  // every rank starts from rank 0's weights
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> state;
    for (const auto& parameter : model_->parameters()) state.push_back(parameter);
    for (const auto& buffer : model_->buffers()) state.push_back(buffer);
    communicator_->broadcast(state);
  }
  rollout_options_ = rollout_options(options_, tokenizer_);
  model_->model->set_gradient_checkpointing(options_.gradient_checkpointing);
  // After the broadcast: rank 0's weights.
  if (options_.extras.kl_loss_coef > 0.0) reference_ = reference_policy(model_, options_.autocast);
  optimizer_ = std::make_unique<ClippedAdamW>(model_->parameters(), torch::optim::AdamWOptions(options_.lr)
                                                                        .betas({options_.beta1, options_.beta2})
                                                                        .weight_decay(options_.weight_decay));
  if (!options_.output_dir.empty()) std::filesystem::create_directories(options_.output_dir);
  std::vector<torch::Tensor> held = model_->parameters();
  for (const auto& buffer : model_->buffers()) held.push_back(buffer);
  if (!reference_.is_empty()) {
    for (const auto& parameter : reference_->parameters()) held.push_back(parameter);
    for (const auto& buffer : reference_->buffers()) held.push_back(buffer);
  }
  memory_ = std::make_unique<MemoryMonitor>(model_->lm_head_weight().device(), tensor_bytes(held));
}

nlohmann::json Trainer::step() {
  const auto started = Clock::now();
  memory_->start();
  nlohmann::json metrics{{"step", step_ + 1}};
  const std::vector<Group> groups = collect_groups(metrics);
  if (options_.free_cache_engine) rollout_engine_.reset();
  TrainBatch batch = build_train_batch(groups, options_.rollout_n, rollout_options_.generation.pad_id,
                                       options_.mask_truncated, options_.advantage, options_.adv_estimator);
  PolicyUpdate update{model_, *optimizer_, *communicator_, options_, reference_.is_empty() ? nullptr : &reference_};
  const UpdateMetrics out = update.run(batch, updates_);
  add_batch_metrics(metrics, groups, batch, response_budget(options_).truncated_at);
  add_update_metrics(metrics, out);
  add_time_metrics(metrics, groups, out, seconds_since(started), world_size());
  for (const auto& [name, value] : memory_->peak_metrics()) metrics[name] = value;
  ++step_;
  metrics_.push_back(metrics);
  metric_log_.log_step(metrics);
  if (is_root() && !options_.output_dir.empty()) {
    write_rollout_log(options_.output_dir, step_, groups, batch.advantages, tokenizer_, options_.log_rollouts);
  }
  return metrics;
}

EvalResult Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  model_->eval();
  EvalResult result;
  result.step = step_;
  const auto count = std::min<std::size_t>(static_cast<std::size_t>(options_.eval_problems), test_.size());
  result.problems = static_cast<int64_t>(count);
  if (count == 0) return result;
  // Each rank evaluates its share of the problems; the counts are summed.
  const auto [begin, end] = communicator_->shard(static_cast<int64_t>(count));
  const std::vector<Problem> problems(test_.begin() + begin, test_.begin() + end);
  const AutocastGuard autocast(model_->lm_head_weight().device(), options_.autocast);
  // A progress line after each generation call but the last (several only with --max-rollout-rows).
  const auto started = Clock::now();
  const ChunkProgress on_chunk = [&](int64_t done, int64_t rows) {
    if (done == rows) return;
    const double seconds = seconds_since(started);
    progress("eval  step " + std::to_string(step_) + ": " + std::to_string(done) + "/" + std::to_string(rows) +
             " problems of this rank, " + format_duration(seconds) + ", left " +
             format_duration(seconds * static_cast<double>(rows - done) / static_cast<double>(done)));
  };
  // Through the rollout engine: its graphs serve the evaluation's greedy decoding too, captured once per run.
  const auto correct =
      static_cast<double>(greedy_correct(rollout_engine(), tokenizer_, problems, rollout_options_, on_chunk));
  double passed = 0;
  if (options_.eval_pass_k > 0 && !problems.empty()) {
    RolloutOptions sampled = rollout_options_;
    sampled.group_size = options_.eval_pass_k;
    const auto rank = static_cast<uint64_t>(communicator_->rank());
    for (const auto& group : rollout(rollout_engine(), tokenizer_, problems, sampled,
                                     derived_seed(options_.seed, step_, 0, 2 + 16 * rank))) {
      passed += std::any_of(group.responses.begin(), group.responses.end(),
                            [](const Response& response) { return response.score.correct; });
    }
  }
  const std::vector<double> totals = communicator_->all_reduce_sum({correct, passed});
  result.accuracy = totals[0] / static_cast<double>(count);
  if (options_.eval_pass_k > 0) {
    result.k = options_.eval_pass_k;
    result.pass_at_k = totals[1] / static_cast<double>(count);
  }
  evals_.push_back(result.to_json());
  metric_log_.log_eval(result.to_json());
  return result;
}

void Trainer::progress(const std::string& line) const {
  if (!options_.quiet) std::printf("%s\n", line.c_str()), std::fflush(stdout);
}

void Trainer::evaluate_and_report(bool with_count) {
  const auto started = Clock::now();
  const EvalResult eval = evaluate();
  if (!options_.output_dir.empty() && is_root()) write_report();  // the report grows as the run goes
  progress("eval  step " + std::to_string(step_) + ": greedy accuracy " + std::to_string(eval.accuracy).substr(0, 5) +
           (!with_count ? "" : " on " + std::to_string(eval.problems) + " problems") + " (" +
           format_duration(seconds_since(started)) + ")");
}

RunResult Trainer::run() {
  const auto started = Clock::now();
  // Rank 0 decides (after a resume only it has read the evaluations so far); the others follow.
  if (communicator_->agree(evals_.empty() || evals_.back().at("step") != step_)) evaluate_and_report(true);
  const int64_t first_step = step_;
  while (step_ < options_.total_steps) {
    const nlohmann::json row = step();
    const double per_step = seconds_since(started) / static_cast<double>(step_ - first_step);
    char line[256];
    std::snprintf(line, sizeof line,
                  "step %lld/%lld | reward %.3f | acc %.3f | len %.1f | clip %.4f | rounds %lld | %.1f s/step | "
                  "left %s",
                  static_cast<long long>(step_), static_cast<long long>(options_.total_steps),
                  row.at("sampled/score/mean").get<double>(), row.at("sampled/accuracy").get<double>(),
                  row.at("sampled/response_length/mean").get<double>(), row.at("actor/pg_clipfrac").get<double>(),
                  static_cast<long long>(row.at("train/num_gen_batches").get<int64_t>()),
                  row.at("timing_s/step").get<double>(),
                  format_duration(per_step * static_cast<double>(options_.total_steps - step_)).c_str());
    if (has_logger(options_.loggers, "console")) progress(line);
    const bool last = step_ == options_.total_steps;
    // The safe point: the step is complete. Every rank takes part in the sum, so all stop after the same step.
    const bool asked = stop_requested_ && stop_requested_();
    if (!last && communicator_->all_reduce_sum({asked ? 1.0 : 0.0})[0] > 0) {
      RunResult result{.stopped = true, .step = step_, .checkpoint = {}};
      if (!options_.output_dir.empty() && is_root()) {
        if (options_.save_every >= 0) result.checkpoint = save_checkpoint();
        write_report();
      }
      return result;
    }
    if (options_.eval_every > 0 && step_ % options_.eval_every == 0 && !last) evaluate_and_report(false);
    if (options_.save_every > 0 && step_ % options_.save_every == 0 && !last && !options_.output_dir.empty() &&
        is_root()) {
      save_checkpoint();
    }
  }
  if (communicator_->agree(evals_.empty() || evals_.back().at("step") != step_)) evaluate_and_report(false);
  if (!options_.output_dir.empty() && is_root()) {
    if (options_.save_every >= 0) save_checkpoint();
    write_report();
  }
  return {.stopped = false, .step = step_, .checkpoint = {}};
}

void Trainer::write_report() const {
  nlohmann::json summary{{"steps", step_}, {"settings", options_.to_json()}};
  if (!evals_.empty()) {
    summary["first_eval_accuracy"] = evals_.front().at("accuracy");
    summary["final_accuracy"] = evals_.back().at("accuracy");
  }
  qwen::write_report(options_.output_dir, metrics_, evals_, summary);
}

}  // namespace qwen
