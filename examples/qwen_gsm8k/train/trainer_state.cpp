// Checkpoints of a training run and resuming from them: weights, optimizer state, the data sampler, the step and
// update counters, and how many metrics/eval rows the run had written. A checkpoint directory is also a Hugging Face
// model directory, the one model.save_pretrained(dir) and tokenizer.save_pretrained(dir) leave, so that transformers,
// vLLM or `qwen_gsm8k train --model` load it as they load the input model.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "qwen_gsm8k/common/atomic_file.hpp"
#include "qwen_gsm8k/common/json_lines.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/checkpoint.hpp"
#include "qwen_gsm8k/train/trainer.hpp"

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

}  // namespace

std::filesystem::path Trainer::save_checkpoint() {
  if (options_.output_dir.empty()) throw std::logic_error("save_checkpoint: no output_dir");
  if (!is_root()) throw std::logic_error("save_checkpoint: only rank 0 writes checkpoints");
  char name[32];
  std::snprintf(name, sizeof name, "step-%06lld", static_cast<long long>(step_));
  const std::string label = std::string("checkpoint ") + name + ": ";
  const auto started = std::chrono::steady_clock::now();
  // The input model directory (TrainOptions::model_dir, which the train command sets to --model) supplies
  // config.json's other fields, generation_config.json and the tokenizer files; the demo has none.
  const SaveOptions save{.max_shard_bytes = options_.max_shard_bytes,
                         .source_dir = options_.model_dir,
                         .progress = [&](const std::string& line) { progress(label + line); }};
  const auto checkpoint = commit_checkpoint(
      options_.output_dir / "checkpoints", name,
      [&](const std::filesystem::path& dir) {
        save_model(model_, dir, save);
        progress(label + "writing optimizer state...");
        torch::serialize::OutputArchive archive;
        optimizer_->save(archive);
        archive.save_to((dir / "optimizer.pt").string());
        if (!options_.model_dir.empty()) {
          for (const char* file : kTokenizerFiles) {
            if (std::filesystem::exists(options_.model_dir / file)) {
              std::filesystem::copy_file(options_.model_dir / file, dir / file);
            }
          }
        }
        const nlohmann::json state{{"step", step_},
                                   {"updates", updates_},
                                   {"sampler", sampler_.state()},
                                   {"options", options_.to_json()},
                                   {"metrics_rows", metrics_.size()},
                                   {"eval_rows", evals_.size()}};
        write_file_atomically(dir / "trainer_state.json", state.dump(2) + "\n");
      },
      options_.keep_checkpoints);
  progress(label + "saved in " + seconds_text(started) + " (" + checkpoint.string() + ")");
  return checkpoint;
}

void Trainer::resume(const std::filesystem::path& checkpoint) {
  const auto dir = find_checkpoint(checkpoint);
  if (!dir) throw std::runtime_error(checkpoint.string() + ": no checkpoint (no trainer_state.json and no latest)");
  std::ifstream in(*dir / "trainer_state.json");
  const nlohmann::json state = nlohmann::json::parse(in);
  const nlohmann::json saved_options = state.at("options");
  nlohmann::json current = options_.to_json();
  for (const char* volatile_key : {"total_steps", "eval_every", "save_every"}) {  // may change on resume
    current.erase(volatile_key);
  }
  for (const auto& [key, value] : current.items()) {
    if (saved_options.contains(key) && saved_options.at(key) != value) {
      throw std::invalid_argument((*dir / "trainer_state.json").string() + ": option " + key + " was " +
                                  saved_options.at(key).dump() + " in the checkpointed run but is " + value.dump() +
                                  " now; resume with the same settings");
    }
  }
  const std::string label = "resume from " + dir->filename().string() + ": ";
  LoadOptions load;
  if (is_root()) load.progress = [&](const std::string& line) { progress(label + line); };
  load_weights(model_, *dir, load);
  torch::serialize::InputArchive archive;
  archive.load_from((*dir / "optimizer.pt").string());
  optimizer_->load(archive);
  step_ = state.at("step");
  updates_ = state.at("updates");
  sampler_ = ProblemSampler::from_state(state.at("sampler"));
  // Keep the rows the checkpointed run had written; drop those of steps after it.
  metrics_.clear();
  evals_.clear();
  if (!options_.output_dir.empty() && is_root()) {
    const auto rows = [&](const char* file, std::size_t keep, std::vector<nlohmann::json>& into) {
      const auto path = options_.output_dir / file;
      if (!std::filesystem::exists(path)) return;
      auto all = read_json_lines(path);
      if (all.size() > keep) all.resize(keep);
      into = all;
      std::string text;
      for (const auto& row : into) text += row.dump() + "\n";
      write_file_atomically(path, text);
    };
    rows("metrics.jsonl", state.at("metrics_rows").get<std::size_t>(), metrics_);
    rows("eval.jsonl", state.at("eval_rows").get<std::size_t>(), evals_);
  }
}

}  // namespace qwen
