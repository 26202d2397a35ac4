// qwen_gsm8k: the command-line driver. Subcommands: tokenize (JSON lines in, token ids out). Training and the
// built-in demo arrive with the trainer.
#include <CLI/CLI.hpp>

#include <iostream>
#include <string>

#include "qwen_gsm8k/runtime.hpp"
#include "qwen_gsm8k/tokenize_command.hpp"

int main(int argc, char** argv) {
  qwen::use_passive_openmp(argv);
  CLI::App app{"qwen_gsm8k: DAPO training of Qwen2.5 on GSM8K with the dapo library"};
  app.require_subcommand(1);

  std::string tokenizer_dir;
  CLI::App* tokenize = app.add_subcommand(
      "tokenize", "Read JSON lines on stdin (a string, or {\"messages\": [...], \"add_generation_prompt\": bool}) and "
                  "write one JSON array of token ids per line");
  tokenize->add_option("--tokenizer", tokenizer_dir, "Directory with tokenizer.json (and tokenizer_config.json)")
      ->required()
      ->check(CLI::ExistingDirectory);

  CLI11_PARSE(app, argc, argv);
  if (tokenize->parsed()) return qwen::run_tokenize(tokenizer_dir, std::cin, std::cout, std::cerr);
  return 0;
}
