// Checkpoints of a training run and resuming from them: weights, optimizer state, the data sampler, the step and
// update counters, and how many metrics/eval rows the run had written. A checkpoint directory is also a Hugging Face
// model directory, the one model.save_pretrained(dir) and tokenizer.save_pretrained(dir) leave, so that transformers,
// vLLM or `qwen_gsm8k train --model` load it as they load the input model.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>

#include "qwen_gsm8k/common/atomic_file.hpp"
#include "qwen_gsm8k/common/json_lines.hpp"
#include "qwen_gsm8k/common/run_directory.hpp"
#include "qwen_gsm8k/common/zip_check.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/checkpoint.hpp"
#include "qwen_gsm8k/train/trainer.hpp"
#include "qwen_gsm8k/train/trainer_state_file.hpp"

namespace qwen {
namespace {

// The files tokenizer.save_pretrained writes, across transformers versions (slow and fast tokenizers, the chat
// template in tokenizer_config.json or, in recent versions, its own chat_template.jinja); whichever the input
// model directory has are copied as they are.
constexpr const char* kTokenizerFiles[] = {"tokenizer.json",     "tokenizer_config.json",   "vocab.json",
                                           "merges.txt",         "special_tokens_map.json", "added_tokens.json",
                                           "chat_template.jinja"};

std::string seconds_text(std::chrono::steady_clock::time_point since) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count());
  return text;
}

// LibTorch's message without the C++ backtrace that 1.x appends.
std::string torch_message(const c10::Error& error) {
  std::string text = error.what_without_backtrace();
  const auto line_end = text.find('\n');
  return line_end == std::string::npos ? text : text.substr(0, line_end);
}

std::string read_checkpoint_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (!in.is_open() || in.bad()) {
    throw std::runtime_error(path.string() + ": cannot be read (a damaged checkpoint? resume from an earlier one)");
  }
  return text;
}

// The optimizer state of `archive_path` loaded into a new AdamW over `parameters` with `defaults` (the trainer's
// optimizer is replaced only once everything else has loaded too).
std::unique_ptr<ClippedAdamW> load_optimizer(const std::filesystem::path& archive_path,
                                             const std::vector<torch::Tensor>& parameters,
                                             const torch::optim::AdamWOptions& defaults) {
  // LibTorch 1.13 does not check the archive's CRCs: overwritten bytes would load as garbage moments.
  if (const auto problem = zip_archive_problem(archive_path)) {
    throw std::runtime_error(archive_path.string() + ": cannot be read (" + *problem +
                             "); damaged checkpoint? resume from an earlier one");
  }
  auto optimizer = std::make_unique<ClippedAdamW>(parameters, defaults);
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(archive_path.string());
    optimizer->load(archive);
  } catch (const c10::Error& error) {
    throw std::runtime_error(archive_path.string() + ": cannot be read (" + torch_message(error) +
                             "); damaged checkpoint? resume from an earlier one");
  }
  return optimizer;
}

}  // namespace

std::filesystem::path Trainer::save_checkpoint() {
  if (options_.output_dir.empty()) throw std::logic_error("save_checkpoint: no output_dir");
  if (!is_root()) throw std::logic_error("save_checkpoint: only rank 0 writes checkpoints");
  char name[32];
  std::snprintf(name, sizeof name, "step-%06lld", static_cast<long long>(step_));
  const std::string label = std::string("checkpoint ") + name + ": ";
  const auto started = std::chrono::steady_clock::now();
  // The input model directory (TrainOptions::model_dir, which the train command sets to --model) supplies
  // config.json's other fields, generation_config.json and the tokenizer files, copied as they are; the demo has
  // none, and its in-memory tokenizer writes its own (Tokenizer::save).
  const SaveOptions save{.max_shard_bytes = options_.max_shard_bytes,
                         .source_dir = options_.model_dir,
                         .progress = [&](const std::string& line) { progress(label + line); }};
  std::filesystem::path checkpoint;
  try {
    checkpoint = commit_checkpoint(
        RunDirectory{options_.output_dir}.checkpoints(), name,
        [&](const std::filesystem::path& dir) {
          save_model(model_, dir, save);
          progress(label + "writing optimizer state...");
          const auto optimizer_path = dir / "optimizer.pt";
          write_file_atomically(optimizer_path, [&](std::ostream& out) {
            try {
              torch::serialize::OutputArchive archive;
              optimizer_->save(archive);
              archive.save_to(out);
            } catch (const c10::Error& error) {
              throw std::runtime_error(optimizer_path.string() + ": cannot write the optimizer state (" +
                                       torch_message(error) + ")");
            }
          });
          if (options_.model_dir.empty()) {
            tokenizer_.save(dir);
          } else {
            for (const char* file : kTokenizerFiles) {
              const auto source = options_.model_dir / file;
              if (!std::filesystem::exists(source)) continue;
              std::error_code error;
              std::filesystem::copy_file(source, dir / file, error);
              if (error) {
                throw std::runtime_error((dir / file).string() + ": cannot copy " + source.string() + " there (" +
                                         error.message() + "; disk full?)");
              }
            }
          }
          const TrainerStateFile state{.step = step_,
                                       .updates = updates_,
                                       .sampler = sampler_.state(),
                                       .options = options_.to_json(),
                                       .metrics_rows = metrics_.size(),
                                       .eval_rows = evals_.size()};
          write_file_atomically(dir / "trainer_state.json", to_json(state).dump(2) + "\n");
        },
        options_.keep_checkpoints);
  } catch (const std::exception& error) {
    // commit_checkpoint removed the partial directory; latest still names the previous checkpoint.
    throw std::runtime_error(label + "not saved (latest still names the previous checkpoint): " + error.what());
  }
  progress(label + "saved in " + seconds_text(started) + " (" + checkpoint.string() + ")");
  return checkpoint;
}

namespace {

// The settings a resume may change, and why the run stays what it was: they decide when things happen, how a step's
// work is cut (memory) or what an evaluation covers, not what an update computes. Those that cut the update's sums
// otherwise keep the run within float32 rounding; the others keep it to the bit.
const std::map<std::string, std::string>& resumable_settings() {
  static const std::map<std::string, std::string> settings{
      {"total_steps", "the run's length"},
      {"eval_every", "an interval"},
      {"save_every", "an interval"},
      {"eval_problems", "what evaluations cover"},
      {"eval_pass_k", "what evaluations cover"},
      {"cuda_graphs", "speed alone"},
      {"free_cache_engine", "memory alone"},
      {"gradient_checkpointing", "memory alone"},
      {"ppo_micro_batch_size", "memory: the update's sums in another order, within float32 rounding"},
      {"use_dynamic_bsz", "memory: the update's sums in another order, within float32 rounding"},
      {"ppo_max_token_len_per_gpu", "memory: the update's sums in another order, within float32 rounding"},
      {"log_prob_max_token_len_per_gpu", "memory: the log-probs' sums in another order, within float32 rounding"},
      {"shared_prompt", "speed and memory: sums in another order, within float32 rounding"}};
  return settings;
}

std::string resumable_settings_list() {
  std::string list;
  for (const auto& [key, why] : resumable_settings()) list += (list.empty() ? "" : ", ") + key;
  return list;
}

// The settings of `now` that differ from the checkpointed run's, each as "key old -> new (why it may)"; a difference
// in any other setting throws, naming it.
std::vector<std::string> resumed_setting_changes(const nlohmann::json& now, const nlohmann::json& checkpointed,
                                                 const std::filesystem::path& state_path) {
  std::vector<std::string> changed;
  for (const auto& [key, value] : now.items()) {
    if (!checkpointed.contains(key) || checkpointed.at(key) == value) continue;
    const std::string change = key + " " + checkpointed.at(key).dump() + " -> " + value.dump();
    const auto resumable = resumable_settings().find(key);
    if (resumable == resumable_settings().end()) {
      throw std::invalid_argument(state_path.string() + ": option " + key + " was " + checkpointed.at(key).dump() +
                                  " in the checkpointed run but is " + value.dump() +
                                  " now; resume with the same setting (a resume may change only " +
                                  resumable_settings_list() + ")");
    }
    changed.push_back(change + " (" + resumable->second + ")");
  }
  return changed;
}

}  // namespace

void Trainer::resume(const std::filesystem::path& checkpoint) {
  // Everything is read and checked first, files of the run are touched last: a damaged checkpoint fails naming the
  // file at fault and leaves the output directory exactly as it was.
  const auto dir = find_checkpoint(checkpoint);
  if (!dir) throw std::runtime_error(checkpoint.string() + ": no checkpoint (no trainer_state.json and no latest)");
  const auto state_path = *dir / "trainer_state.json";
  const TrainerStateFile state = parse_trainer_state(read_checkpoint_file(state_path), state_path.string());
  const std::vector<std::string> changed = resumed_setting_changes(options_.to_json(), state.options, state_path);
  // The data must be the run's: its size first, before from_state builds an order of `count` indices.
  const auto count = state.sampler.find("count");
  if (count != state.sampler.end() && count->is_number_unsigned() && *count != train_.size()) {
    throw std::invalid_argument(state_path.string() + ": the checkpointed run drew from " + count->dump() +
                                " training problems, this one has " + std::to_string(train_.size()) +
                                "; resume with the same --train data");
  }
  std::optional<ProblemSampler> sampler;
  try {
    sampler = ProblemSampler::from_state(state.sampler);
  } catch (const std::invalid_argument& error) {
    throw std::runtime_error(state_path.string() + ": field \"sampler\": " + error.what());
  }
  // The rows the checkpointed run had written (those of steps after it are dropped at the end).
  std::vector<nlohmann::json> metrics, evals;
  bool metrics_cut = false, evals_cut = false;
  if (!options_.output_dir.empty() && is_root()) {
    const auto kept_rows = [](const std::filesystem::path& path, std::size_t keep, std::vector<nlohmann::json>& into,
                              bool& cut) {
      if (!std::filesystem::exists(path)) return;
      into = read_json_lines(path);
      cut = into.size() > keep;
      if (cut) into.resize(keep);
    };
    const RunDirectory directory{options_.output_dir};
    kept_rows(directory.metrics(), state.metrics_rows, metrics, metrics_cut);
    kept_rows(directory.eval(), state.eval_rows, evals, evals_cut);
  }
  const std::string label = "resume from " + dir->filename().string() + ": ";
  auto optimizer = load_optimizer(*dir / "optimizer.pt", model_->parameters(),
                                  static_cast<const torch::optim::AdamWOptions&>(optimizer_->defaults()));
  LoadOptions load;
  if (is_root()) load.progress = [&](const std::string& line) { progress(label + line); };
  load_weights(model_, *dir, load);

  // All loaded: now the trainer and the run's files change.
  for (const std::string& change : changed) progress(label + "took " + change);
  optimizer_ = std::move(optimizer);
  step_ = state.step;
  updates_ = state.updates;
  sampler_ = std::move(*sampler);
  metrics_ = std::move(metrics);
  evals_ = std::move(evals);
  const auto rewrite = [](const std::filesystem::path& path, const std::vector<nlohmann::json>& rows) {
    std::string text;
    for (const auto& row : rows) text += row.dump() + "\n";
    write_file_atomically(path, text);
  };
  const RunDirectory directory{options_.output_dir};
  if (metrics_cut) rewrite(directory.metrics(), metrics_);
  if (evals_cut) rewrite(directory.eval(), evals_);
}

}  // namespace qwen
