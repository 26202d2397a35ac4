// The commands the docs give, parsed by the program's own command line: they must name real options with valid
// values, and the real run must carry the seed project's sampling, response budget and optimizer (docs/driver.md).
// Every complete `qwen_gsm8k demo|train` line of a ```sh block in README.md and docs/*.md must parse as well.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "qwen_gsm8k/cli/commands.hpp"
#include "support/documented_commands.hpp"
#include "support/qwen_fixtures.hpp"

namespace {

using dapo::test::documented_command;
using dapo::test::joined_lines;

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

namespace {

// Each complete `qwen_gsm8k demo ...` / `qwen_gsm8k train ...` command in the ```sh blocks of a Markdown file:
// the words after the program's name, up to a shell operator or comment. Lines with placeholders (DIR, FILE, ...,
// [optional parts]) are synopses, not commands, and are left out.
// A documented command: its words after the program's name, where its standard output goes (`> FILE`; empty: the
// terminal), and the shell block it sits in (commands of one block share a working directory, so a file one writes
// the next can read).
struct ShCommand {
  std::vector<std::string> words;
  std::string output_file;
  int block = 0;
};

std::vector<ShCommand> sh_commands(const std::filesystem::path& file) {
  std::ifstream in(file);
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  std::string doc = text.str();
  std::vector<ShCommand> commands;
  int block = 0;
  for (auto begin = doc.find("```sh\n"); begin != std::string::npos; begin = doc.find("```sh\n", begin + 1), ++block) {
    const auto end = doc.find("```", begin + 6);
    REQUIRE(end != std::string::npos);
    std::istringstream lines(joined_lines(doc.substr(begin + 6, end - begin - 6)));
    for (std::string line; std::getline(lines, line);) {
      if (line.find("...") != std::string::npos || line.find('[') != std::string::npos) continue;
      std::istringstream words(line);
      std::vector<std::string> command;
      std::string output_file;
      bool inside = false;
      for (std::string word; words >> word;) {
        if (!inside) {
          const auto slash = word.rfind('/');
          inside = (slash == std::string::npos ? word : word.substr(slash + 1)) == "qwen_gsm8k";
          continue;
        }
        if (word == ">") {
          words >> output_file;
          break;
        }
        if (word == "&" || word == "|" || word == ";" || word == "&&" || word[0] == '#' || word[0] == '>' ||
            word[0] == '<') {
          break;
        }
        command.push_back(word);
      }
      if (command.empty() || (command[0] != "demo" && command[0] != "train")) continue;
      const std::set<std::string> placeholders = {"DIR", "FILE", "N", "S"};
      if (std::any_of(command.begin(), command.end(), [&](const auto& w) { return placeholders.count(w) > 0; })) {
        continue;
      }
      commands.push_back({command, output_file, block});
    }
  }
  return commands;
}

}  // namespace

TEST_CASE("docs: every demo and train command in the docs' shell blocks parses") {
  const std::filesystem::path root = DAPO_SOURCE_DIR;
  std::vector<std::filesystem::path> files = {root / "README.md"};
  for (const auto& entry : std::filesystem::directory_iterator(root / "docs")) {
    if (entry.path().extension() == ".md") files.push_back(entry.path());
  }
  int parsed = 0;
  for (const auto& file : files) {
    std::unique_ptr<dapo::test::ScratchDir> scratch;
    int block = -1;
    for (const auto& [command, output_file, command_block] : sh_commands(file)) {
      if (command_block != block) scratch = std::make_unique<dapo::test::ScratchDir>(), block = command_block;
      const InDirectory inside(scratch->path());
      // The files the command names, so that the existence checks pass.
      for (std::size_t i = 0; i + 1 < command.size(); ++i) {
        if (command[i] == "--model") std::filesystem::create_directories(command[i + 1]);
        if (command[i] == "--train" || command[i] == "--test") {
          const std::filesystem::path data = command[i + 1];
          if (data.has_parent_path()) std::filesystem::create_directories(data.parent_path());
          std::ofstream(data) << "\n";
        }
      }
      CLI::App app;
      qwen::cli::DemoCommand demo;
      qwen::cli::TrainCommand train;
      qwen::cli::add_demo_command(app, demo);
      qwen::cli::add_train_command(app, train);
      std::string line;
      for (const auto& word : command) line += " " + word;
      INFO(file.filename().string() << ": qwen_gsm8k" << line);
      std::vector<std::string> args(command.rbegin(), command.rend());
      CHECK_NOTHROW(app.parse(args));
      // `--print-config > FILE`: the file a later command of the block reads with --config.
      if (!output_file.empty()) {
        for (const auto& [parsed_command, printed] : {std::pair<CLI::App*, bool>{demo.app, demo.print_config},
                                                      std::pair<CLI::App*, bool>{train.app, train.print_config}}) {
          if (parsed_command->parsed() && printed) {
            std::ofstream(output_file) << qwen::cli::effective_config(*parsed_command);
          }
        }
      }
      ++parsed;
    }
  }
  CHECK(parsed >= 3);  // the real run, the distributed ones: the scan itself must find them
}
