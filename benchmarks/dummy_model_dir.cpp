// A model directory without weights for `qwen_gsm8k train --load-format dummy` (random weights of config.json's shape,
// nothing read): config.json of a named shape (support/shapes.hpp, the benchmarks' one table) and the tokenizer's
// files, written as Tokenizer::save writes them (tokenizer.json, tokenizer_config.json with its chat template). The
// GPU check trains the Qwen2.5-1.5B shape through the trainer's own loop this way, with the real tokenizer.
// Usage: dummy_model_dir --shape NAME --tokenizer DIR --output DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>

#include "qwen_gsm8k/text/tokenizer.hpp"
#include "support/flags.hpp"
#include "support/harness.hpp"
#include "support/shapes.hpp"

namespace {

struct Args {
  std::string shape = "qwen2.5-1.5b", tokenizer_dir, output;
};

std::optional<Args> parse_args(int argc, char** argv) {
  Args args;
  dapo::bench::Flags flags("dummy_model_dir");
  flags.text("--shape", args.shape, "NAME", dapo::bench::kShapeNames)
      .text("--tokenizer", args.tokenizer_dir, "DIR", "a Hugging Face tokenizer's folder (tokenizer.json)")
      .text("--output", args.output, "DIR", "the model directory to write (created)");
  if (!flags.parse(argc, argv)) return std::nullopt;
  dapo::bench::model_shape(args.shape);  // throws for an unknown shape
  if (args.tokenizer_dir.empty()) throw std::invalid_argument("--tokenizer DIR is required");
  if (args.output.empty()) throw std::invalid_argument("--output DIR is required");
  return args;
}

void run(const Args& args) {
  const std::filesystem::path output(args.output);
  std::filesystem::create_directories(output);
  const qwen::Config config = dapo::bench::model_shape(args.shape);
  std::ofstream(output / "config.json") << config.to_json().dump(2) << "\n";
  qwen::Tokenizer::from_directory(args.tokenizer_dir).save(output);
  if (!std::filesystem::exists(output / "config.json") || !std::filesystem::exists(output / "tokenizer.json")) {
    throw std::runtime_error("could not write the model directory " + args.output);
  }
  std::printf("dummy_model_dir: %s (the %s shape's config.json and %s's tokenizer, no weights)\n", args.output.c_str(),
              args.shape.c_str(), args.tokenizer_dir.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  return dapo::bench::run_main<Args>(
      "dummy_model_dir", [&] { return parse_args(argc, argv); }, run);
}
