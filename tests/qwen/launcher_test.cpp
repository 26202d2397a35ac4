// The --nproc launcher, qwen::launch_local_ranks: N ranks on this machine get torchrun's variables (replacing any the
// launcher itself had), the launcher's arguments and a rendezvous that works; it returns 0 when all succeed, and the
// first failure's status (128 + signal for a killed rank) when one fails, after the others stopped by themselves or,
// once the grace ran out, were killed. The ranks are launcher_worker.cpp.
#include <signal.h>

#include <cerrno>
#include <set>

#include "qwen_gsm8k/dist/distributed.hpp"
#include "support/process.hpp"
#include "support/qwen_fixtures.hpp"

namespace {

struct Launch {
  int status = -1;
  std::string log;  // the launcher's and the ranks' stderr
};

// launcher_worker launch NPROC GRACE_S MODE OUT, from an environment that has launcher variables of its own, as if
// it ran inside another launcher: the ranks must see theirs instead.
Launch launch(int nproc, std::chrono::seconds grace, const std::string& mode, const std::filesystem::path& out) {
  dapo::test::SpawnOptions options;
  options.environment = {{"RANK", "7"},
                         {"WORLD_SIZE", "9"},
                         {"LOCAL_RANK", "7"},
                         {"LOCAL_WORLD_SIZE", "9"},
                         {"MASTER_ADDR", "10.0.0.9"},
                         {"MASTER_PORT", "1"},
                         {"DAPO_LAUNCHER_TEST", "passed through"}};
  options.stderr_file = out / "launcher.log";
  dapo::test::Child launcher(
      {LAUNCHER_WORKER, "launch", std::to_string(nproc), std::to_string(grace.count()), mode, out.string()}, options);
  Launch result;
  result.status = launcher.wait();
  result.log = dapo::test::read_text(out / "launcher.log");
  return result;
}

// What rank `rank` saw (launcher_worker writes it before anything can fail).
nlohmann::json seen_by(const std::filesystem::path& out, int rank) {
  const auto path = out / ("rank" + std::to_string(rank) + ".json");
  REQUIRE_MESSAGE(std::filesystem::exists(path), "rank " << rank << " never started");
  return dapo::test::read_json(path);
}

bool process_exists(pid_t pid) {
  return ::kill(pid, 0) == 0 || errno != ESRCH;
}

}  // namespace

TEST_CASE("--nproc launcher: every rank gets torchrun's variables and the arguments, meets the others, status 0") {
  dapo::test::ScratchDir scratch;
  const auto out = scratch.path();
  const auto result = launch(3, dapo::test::kHangGuard, "ok", out);
  REQUIRE_MESSAGE(result.status == 0, result.log);
  std::set<std::string> ports;
  for (int rank = 0; rank < 3; ++rank) {
    CAPTURE(rank);
    const auto seen = seen_by(out, rank);
    CHECK(seen.at("RANK") == std::to_string(rank));
    CHECK(seen.at("LOCAL_RANK") == std::to_string(rank));
    CHECK(seen.at("WORLD_SIZE") == "3");
    CHECK(seen.at("LOCAL_WORLD_SIZE") == "3");
    CHECK(seen.at("MASTER_ADDR") == "127.0.0.1");
    CHECK(seen.at("DAPO_LAUNCHER_TEST") == "passed through");  // the rest of the environment is inherited
    CHECK(seen.at("argv") == nlohmann::json{LAUNCHER_WORKER, "rank", "ok", out.string()});
    ports.insert(seen.at("MASTER_PORT").get<std::string>());
    CHECK(dapo::test::read_text(out / ("sum" + std::to_string(rank))) == "6\n");  // 1 + 2 + 3, over the rendezvous
  }
  REQUIRE(ports.size() == 1);  // one rendezvous for all, on a port of the launcher's choosing
  CHECK(*ports.begin() != "1");
}

TEST_CASE("--nproc launcher: a rank that fails gives its status; the others may stop by themselves within the grace") {
  dapo::test::ScratchDir scratch;
  const auto out = scratch.path();
  // Rank 1 exits with 3; ranks 0 and 2 notice it is gone and exit 0. The grace is only a hang guard here: they stop
  // long before it, and the launcher must not kill them first.
  const auto result = launch(3, dapo::test::kHangGuard, "exit", out);
  CHECK_MESSAGE(result.status == 3, result.log);
  CHECK_MESSAGE(result.log.find("rank 1 exited with status 3; stopping the other ranks") != std::string::npos,
                result.log);
  for (int rank : {0, 2}) {
    CAPTURE(rank);
    CHECK(std::filesystem::exists(out / ("stopped" + std::to_string(rank))));  // they ran to their own end
  }
}

TEST_CASE("--nproc launcher: a killed rank gives 128 + signal, and the ranks left hanging are killed after the grace") {
  dapo::test::ScratchDir scratch;
  const auto out = scratch.path();
  // Rank 1 kills itself; ranks 0 and 2 hang forever, so the launcher returns only if it kills them.
  const auto result = launch(3, std::chrono::seconds(1), "killed", out);
  CHECK_MESSAGE(result.status == 128 + SIGKILL, result.log);
  CHECK_MESSAGE(result.log.find("rank 1 was killed by signal 9; stopping the other ranks") != std::string::npos,
                result.log);
  for (int rank : {0, 2}) {
    CAPTURE(rank);
    CHECK_FALSE(process_exists(seen_by(out, rank).at("pid").get<pid_t>()));  // killed and reaped
  }
}

TEST_CASE("--nproc launcher: fewer than 1 process is an error naming --nproc") {
  CHECK_THROWS_WITH_AS(qwen::launch_local_ranks(0, {"unused"}, std::chrono::seconds(1)),
                       doctest::Contains("--nproc is 0, expected >= 1"), std::invalid_argument);
}
