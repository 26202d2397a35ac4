// `qwen_gsm8k compare` and `qwen_gsm8k tokenize`: thin wrappers over the report and the tokenizer.
#include <cstdio>

#include "qwen_gsm8k/cli/commands.hpp"
#include "qwen_gsm8k/report/report.hpp"

namespace qwen::cli {

void add_compare_command(CLI::App& app, CompareCommand& command) {
  CLI::App* sub = app.add_subcommand("compare", "Charts of several runs side by side (accuracy against steps)");
  sub->add_option("--output", command.output, "Directory for the SVG charts");
  sub->add_option("runs", command.runs, "Run directories (with eval.jsonl / metrics.jsonl)")
      ->required()
      ->check(CLI::ExistingDirectory);
  command.app = sub;
}

int run_compare_command(const CompareCommand& command) {
  for (const auto& path : write_comparison(command.output, {command.runs.begin(), command.runs.end()})) {
    std::printf("wrote %s\n", path.string().c_str());
  }
  return 0;
}

void add_tokenize_command(CLI::App& app, TokenizeCommand& command) {
  CLI::App* sub = app.add_subcommand(
      "tokenize",
      "Read JSON lines on stdin (a string, or {\"messages\": [...], \"add_generation_prompt\": bool}) and "
      "write one JSON array of token ids per line");
  sub->add_option("--tokenizer", command.tokenizer_dir, "Directory with tokenizer.json (and tokenizer_config.json)")
      ->required()
      ->check(CLI::ExistingDirectory);
  command.app = sub;
}

}  // namespace qwen::cli
