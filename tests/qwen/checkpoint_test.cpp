// Checkpoints survive a kill at any moment: a writer process is killed with SIGKILL at every stage of its writes, and
// each time the checkpoint `latest` names is complete and loads, with the weights of its step. The kills follow the
// writer's own progress reports, not the clock, so they land at the same points on a fast machine and a slow one.
#include <signal.h>

#include <torch/torch.h>

#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/checkpoint.hpp"
#include "support/process.hpp"
#include "support/qwen_fixtures.hpp"

namespace {

// The lines checkpoint_writer prints for each checkpoint, in order (see checkpoint_writer.cpp).
constexpr const char* kStages[] = {"begin", "weights", "optimizer", "state", "committed"};
constexpr int kStageCount = static_cast<int>(std::size(kStages));

// The step recorded in a checkpoint, after checking that its weights and optimizer values say the same.
int64_t verify_checkpoint(const std::filesystem::path& dir) {
  CAPTURE(dir.string());
  const auto state = dapo::test::read_json(dir / "trainer_state.json");
  const int64_t step = state.at("step");
  auto model = qwen::load_model(dir);
  for (const auto& parameter : model->parameters()) {
    REQUIRE(parameter.eq(static_cast<double>(step)).all().item<bool>());
  }
  std::vector<torch::Tensor> moments;
  torch::load(moments, (dir / "optimizer.pt").string());
  REQUIRE(moments.size() == model->parameters().size());
  for (const auto& moment : moments) REQUIRE(moment.eq(static_cast<double>(step)).all().item<bool>());
  return step;
}

}  // namespace

TEST_CASE("a checkpoint write killed at any moment leaves the previous checkpoint loadable") {
  dapo::test::ScratchDir scratch;
  const auto root = scratch.path() / "checkpoints";
  int64_t newest = 0;  // the step latest names
  int beyond_kill_point = 0;
  constexpr int kKills = 4 * kStageCount;
  for (int kill = 0; kill < kKills; ++kill) {
    // Kill k lets the writer complete 1 or 2 checkpoints, then kills it right after stage k % 5 of the next one
    // (after "committed": in the next write's sweep of leftovers). In the second and fourth rounds the writer stops
    // itself at that line, so the kill lands exactly there; otherwise it runs on until the kill reaches it, somewhere
    // inside the following stage. Every third run starts `complete` steps back, so that the write it is killed in
    // replaces the newest checkpoint (the directory swap of a rewritten step) instead of adding one.
    const int stage = kill % kStageCount;
    const bool exact = (kill / kStageCount) % 2 == 1;
    const int complete = 1 + kill / (2 * kStageCount);
    const int lines_before_kill = complete * kStageCount + stage;
    const int64_t first_step = kill % 3 == 2 ? std::max<int64_t>(newest - complete, 1) : newest + 1;
    CAPTURE(kill);
    CAPTURE(first_step);
    CAPTURE(lines_before_kill);
    CAPTURE(exact);

    std::vector<std::string> arguments{CHECKPOINT_WRITER, root.string(), std::to_string(first_step)};
    if (exact) arguments.push_back(std::to_string(lines_before_kill));
    dapo::test::SpawnOptions options;
    options.pipe_stdout = true;
    dapo::test::Child writer(arguments, options);
    // Each line the writer printed is the one expected next; returns false at the end of its output.
    int lines = 0;
    int64_t last_committed = 0;
    std::string last_line;
    auto next_line = [&] {
      const auto text = writer.read_line();
      if (!text) return false;
      const int64_t step = first_step + lines / kStageCount;
      REQUIRE(*text == std::string(kStages[lines % kStageCount]) + " " + std::to_string(step));
      if (lines % kStageCount == kStageCount - 1) last_committed = step;
      last_line = *text;
      ++lines;
      return true;
    };
    while (lines < lines_before_kill) REQUIRE_MESSAGE(next_line(), "the writer ended after " << lines << " lines");
    if (exact) writer.wait_stopped();
    writer.signal(SIGKILL);  // without warning
    REQUIRE(writer.wait() == 128 + SIGKILL);
    while (next_line()) {  // what it printed before the kill reached it
    }
    CAPTURE(last_line);
    REQUIRE(last_committed >= first_step);

    // latest names the last checkpoint the writer reported committed, or, when the kill came in the middle of a
    // commit (after "state"), possibly that one.
    const auto latest = qwen::find_checkpoint(root);
    REQUIRE(latest.has_value());
    const int64_t step = verify_checkpoint(*latest);
    if (!exact && last_line.rfind("state ", 0) == 0) {
      CHECK((step == last_committed || step == last_committed + 1));
    } else {
      CHECK(step == last_committed);
    }
    newest = step;
    // Every complete checkpoint directory loads too; only .partial-* directories may be broken.
    for (const auto& entry : std::filesystem::directory_iterator(root)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_directory() && name.rfind(".partial-", 0) != 0) verify_checkpoint(entry.path());
    }
    beyond_kill_point += lines - lines_before_kill;
  }
  MESSAGE("killed the writer " << kKills << " times; the newest complete checkpoint was step " << newest << "; "
                               << beyond_kill_point << " progress lines came between a kill's line and the kill");
}

TEST_CASE("a failing checkpoint write leaves latest untouched; rewriting a step replaces it") {
  dapo::test::ScratchDir scratch;
  const auto root = scratch.path();
  qwen::commit_checkpoint(
      root, "step-000001",
      [](const std::filesystem::path& dir) { std::ofstream(dir / "trainer_state.json") << "{\"step\": 1}"; }, 0);
  CHECK_THROWS_AS(qwen::commit_checkpoint(
                      root, "step-000002",
                      [](const std::filesystem::path& dir) {
                        std::ofstream(dir / "trainer_state.json") << "{\"step\": 2";
                        throw std::runtime_error("disk full");
                      },
                      0),
                  std::runtime_error);
  CHECK(qwen::find_checkpoint(root)->filename() == "step-000001");
  CHECK_FALSE(std::filesystem::exists(root / "step-000002"));
  qwen::commit_checkpoint(
      root, "step-000001",
      [](const std::filesystem::path& dir) { std::ofstream(dir / "trainer_state.json") << "{\"step\": 11}"; }, 0);
  CHECK(dapo::test::read_json(root / "step-000001" / "trainer_state.json").at("step") == 11);
  for (int step = 2; step <= 5; ++step) {
    qwen::commit_checkpoint(
        root, "step-00000" + std::to_string(step),
        [](const std::filesystem::path& dir) { std::ofstream(dir / "trainer_state.json") << "{}"; }, /*keep=*/2);
  }
  CHECK_FALSE(std::filesystem::exists(root / "step-000003"));
  CHECK(std::filesystem::exists(root / "step-000004"));
  CHECK(qwen::find_checkpoint(root)->filename() == "step-000005");
}
