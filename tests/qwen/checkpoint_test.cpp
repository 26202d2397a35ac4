// Checkpoints survive a kill at any moment: a writer process is killed with SIGKILL at many points of its writes, and
// each time the checkpoint `latest` names is complete and loads, with the weights of its step.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/torch.h>

#include <chrono>
#include <thread>

#include "qwen_gsm8k/train/checkpoint.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "support/qwen_fixtures.hpp"

extern char** environ;

namespace {

// The step recorded in a checkpoint, after checking that its weights say the same.
int64_t verify_checkpoint(const std::filesystem::path& dir) {
  const auto state = dapo::test::read_json(dir / "trainer_state.json");
  const int64_t step = state.at("step");
  auto model = qwen::load_model(dir);
  for (const auto& parameter : model->parameters()) {
    REQUIRE(parameter.eq(static_cast<double>(step)).all().item<bool>());
  }
  return step;
}

}  // namespace

TEST_CASE("a checkpoint write killed at any moment leaves the previous checkpoint loadable") {
  dapo::test::ScratchDir scratch;
  const auto root = scratch.path() / "checkpoints";
  int64_t last_step = 0;
  for (int kill = 0; kill < 12; ++kill) {
    pid_t pid = 0;
    const std::string root_text = root.string();
    char* argv[] = {const_cast<char*>(CHECKPOINT_WRITER), const_cast<char*>(root_text.c_str()), nullptr};
    REQUIRE(posix_spawn(&pid, CHECKPOINT_WRITER, nullptr, nullptr, argv, environ) == 0);
    // Let it write for a while (varying, so the kill lands at different points), then kill it without warning.
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + 37 * kill));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    REQUIRE(WIFSIGNALED(status));

    const auto latest = qwen::find_checkpoint(root);
    if (!latest) continue;  // killed before its first checkpoint completed
    const int64_t step = verify_checkpoint(*latest);
    CAPTURE(kill);
    CHECK(step >= 1);
    last_step = step;
    // Every complete checkpoint directory loads too; only .partial-* directories may be broken.
    for (const auto& entry : std::filesystem::directory_iterator(root)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_directory() && name.rfind(".partial-", 0) != 0) verify_checkpoint(entry.path());
    }
  }
  CHECK(last_step >= 1);  // the writer did complete checkpoints between kills
  MESSAGE("killed the writer 12 times; the newest complete checkpoint was step " << last_step);
}

TEST_CASE("a failing checkpoint write leaves latest untouched; rewriting a step replaces it") {
  dapo::test::ScratchDir scratch;
  const auto root = scratch.path();
  qwen::commit_checkpoint(root, "step-000001", [](const std::filesystem::path& dir) {
    std::ofstream(dir / "trainer_state.json") << "{\"step\": 1}";
  }, 0);
  CHECK_THROWS_AS(qwen::commit_checkpoint(root, "step-000002",
                                          [](const std::filesystem::path& dir) {
                                            std::ofstream(dir / "trainer_state.json") << "{\"step\": 2";
                                            throw std::runtime_error("disk full");
                                          },
                                          0),
                  std::runtime_error);
  CHECK(qwen::find_checkpoint(root)->filename() == "step-000001");
  CHECK_FALSE(std::filesystem::exists(root / "step-000002"));
  qwen::commit_checkpoint(root, "step-000001", [](const std::filesystem::path& dir) {
    std::ofstream(dir / "trainer_state.json") << "{\"step\": 11}";
  }, 0);
  CHECK(dapo::test::read_json(root / "step-000001" / "trainer_state.json").at("step") == 11);
  for (int step = 2; step <= 5; ++step) {
    qwen::commit_checkpoint(root, "step-00000" + std::to_string(step), [](const std::filesystem::path& dir) {
      std::ofstream(dir / "trainer_state.json") << "{}";
    }, /*keep=*/2);
  }
  CHECK_FALSE(std::filesystem::exists(root / "step-000003"));
  CHECK(std::filesystem::exists(root / "step-000004"));
  CHECK(qwen::find_checkpoint(root)->filename() == "step-000005");
}
