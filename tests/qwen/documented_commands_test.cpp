// The commands the docs give, parsed by the program's own command line: they must name real options with valid
// values, and the real run must carry the seed project's sampling, response budget and optimizer (docs/driver.md).
#include <CLI/CLI.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "qwen_gsm8k/cli/commands.hpp"
#include "support/qwen_fixtures.hpp"

namespace {

// The words of the first ```sh block after `heading` in a Markdown file, continuation lines joined.
std::vector<std::string> documented_command(const std::filesystem::path& file, const std::string& heading) {
  std::ifstream in(file);
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const auto section = doc.find(heading);
  REQUIRE(section != std::string::npos);
  const auto begin = doc.find("```sh\n", section);
  REQUIRE(begin != std::string::npos);
  const auto end = doc.find("```", begin + 6);
  REQUIRE(end != std::string::npos);
  std::string block = doc.substr(begin + 6, end - begin - 6);
  for (auto at = block.find("\\\n"); at != std::string::npos; at = block.find("\\\n")) block.replace(at, 2, " ");
  std::istringstream words(block);
  std::vector<std::string> out;
  for (std::string word; words >> word;) out.push_back(word);
  return out;
}

// Runs in a scratch directory holding the files the command names, then returns to where it was.
class InDirectory {
 public:
  explicit InDirectory(const std::filesystem::path& dir) : previous_(std::filesystem::current_path()) {
    std::filesystem::current_path(dir);
  }
  ~InDirectory() { std::filesystem::current_path(previous_); }

 private:
  std::filesystem::path previous_;
};

}  // namespace

TEST_CASE("docs: the real-run command parses and uses the seed project's sampling, budget and optimizer") {
  const auto words =
      documented_command(std::filesystem::path(DAPO_SOURCE_DIR) / "docs" / "driver.md", "## The real run");
  REQUIRE(words.size() > 2);
  CHECK(words[0] == "qwen_gsm8k");
  CHECK(words[1] == "train");
  dapo::test::ScratchDir scratch;
  const InDirectory inside(scratch.path());
  std::filesystem::create_directories("Qwen2.5-1.5B-Instruct");
  std::filesystem::create_directories("gsm8k");
  std::ofstream("gsm8k/train.jsonl") << "\n";
  std::ofstream("gsm8k/test.jsonl") << "\n";

  CLI::App app;
  qwen::cli::TrainCommand command;
  qwen::cli::add_train_command(app, command);
  std::vector<std::string> args(words.rbegin(), words.rend() - 1);  // CLI11 takes them last first, without argv[0]
  CHECK_NOTHROW(app.parse(args));
  const qwen::TrainOptions& options = command.options;
  CHECK(options.rollout_n == 4);
  CHECK(options.sampling.temperature == 0.9);
  CHECK(options.sampling.top_k == 50);
  CHECK(options.max_new_tokens == 128);
  CHECK(options.lr == 1e-6);
  CHECK(options.weight_decay == 0.0);  // AdamW without weight decay: Adam's update
  CHECK(options.loss.clip_low == 0.2);
  CHECK(options.loss.clip_high == 0.28);
  CHECK(options.ppo_mini_batch_size < options.train_batch_size);  // more than one update per rollout
  CHECK(command.autocast == "bfloat16");
}
