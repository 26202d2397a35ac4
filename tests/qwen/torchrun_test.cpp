// torchrun as users launch the driver (`torchrun --nproc_per_node 2 --no_python qwen_gsm8k demo ...`). Two
// rendezvous: --standalone (the c10d backend; the agent picks MASTER_PORT and rank 0 serves the TCPStore there) and
// torchrun's default, the static one (the agent itself serves the store on --master_port and tells the ranks
// TORCHELASTIC_USE_AGENT_STORE=True: every rank must be a client, with its keys under PyTorch's
// "/worker/attempt_<restart count>" prefix). The agent store is first checked without Python, against a store this
// test serves; then both real torchrun launches must finish a 2-rank demo with the metrics of the --nproc 2 launcher.
//
// The real launches need Debian's python3-torch (/usr/bin/torchrun). A missing torchrun fails the test where it was
// promised: DAPO_TORCHRUN_TEST=required (scripts/test.sh, which installs it) or CI=true, unless
// DAPO_TORCHRUN_TEST=optional (the LibTorch 2.x leg, whose Debian 13 root has no python3-torch); elsewhere it skips
// with a message. CTest runs the torchrun cases as their own entry, `torchrun` (tests/CMakeLists.txt).
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "qwen_gsm8k/common/json_lines.hpp"
#include "qwen_gsm8k/dist/distributed.hpp"
#include "support/process.hpp"
#include "support/qwen_fixtures.hpp"

namespace {

using dapo::test::read_text;

// Sets (or, with nothing, removes) environment variables for one scope, then restores them.
class ScopedEnvironment {
 public:
  explicit ScopedEnvironment(const std::vector<std::pair<std::string, std::optional<std::string>>>& variables) {
    for (const auto& [name, value] : variables) {
      const char* before = std::getenv(name.c_str());
      saved_.emplace_back(name, before ? std::optional<std::string>(before) : std::nullopt);
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  ~ScopedEnvironment() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// Every variable a launcher sets, removed, so that a child sees only the ones a test gives it.
std::vector<std::pair<std::string, std::optional<std::string>>> without_launcher_variables() {
  std::vector<std::pair<std::string, std::optional<std::string>>> variables;
  for (const char* name :
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
        "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"}) {
    variables.emplace_back(name, std::nullopt);
  }
  return variables;
}

int free_port() {
  const auto port = qwen::free_loopback_port();
  REQUIRE(port.has_value());
  return *port;
}

// LibTorch >= 2.4 asks for the libuv TCPStore server by default, which Debian's build refuses; the classic one then
// serves (as distributed.cpp does for its own store). A template, so that 1.13's options need no such member.
template <class Options>
void without_libuv(Options& options) {
  if constexpr (requires { options.useLibUV; }) options.useLibUV = false;
}

// A TCPStore server on 127.0.0.1:port, as torchrun's agent serves it.
c10::intrusive_ptr<c10d::TCPStore> serve_store(int port) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = true;
  options.waitWorkers = false;
  try {
    return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  } catch (const std::exception& error) {
    if (std::string(error.what()).find("libuv") == std::string::npos) throw;
  }
  without_libuv(options);
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
}

// torchrun on PATH, or nothing after the test failed or skipped as the file comment says.
std::optional<std::filesystem::path> torchrun_or_skip() {
  if (const char* path = std::getenv("PATH")) {
    std::stringstream directories(path);
    for (std::string directory; std::getline(directories, directory, ':');) {
      const auto candidate = std::filesystem::path(directory.empty() ? "." : directory) / "torchrun";
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  }
  const char* setting = std::getenv("DAPO_TORCHRUN_TEST");
  const std::string mode = setting ? setting : "";
  if (mode == "required" || (mode != "optional" && dapo::test::running_in_ci())) {
    const std::string reason = mode == "required" ? "DAPO_TORCHRUN_TEST=required" : "CI=true";
    FAIL("torchrun is not on PATH, and this run requires it ("
         << reason
         << "): install Debian's python3-torch (scripts/test.sh does), or set DAPO_TORCHRUN_TEST=optional where no "
            "torchrun can be installed");
  }
  MESSAGE(
      "skipped: torchrun is not on PATH; install Debian's python3-torch (sudo apt-get install python3-torch) to "
      "run the torchrun launches");
  return std::nullopt;
}

// The short demo: a 20-update warm start, one GRPO step of 4 prompts in 2 updates, 8 evaluation problems. GRPO:
// no dynamic sampling, which a policy this barely warm could not satisfy (every group agrees).
std::vector<std::string> demo_arguments(const std::filesystem::path& output) {
  return {"demo", "--algo",          "grpo", "--sft-steps", "20",       "--sft-min-steps",
          "20",   "--rl-steps",      "1",    "--rl-groups", "4",        "--rl-mini-groups",
          "2",    "--eval-problems", "8",    "--quiet",     "--output", output.string()};
}

struct Run {
  int status = -1;
  std::string log;  // stdout and stderr of the launcher and its ranks
};

Run run(const std::vector<std::string>& arguments, const std::filesystem::path& log) {
  dapo::test::SpawnOptions options;
  options.environment = without_launcher_variables();
  // torchrun gives each rank OMP_NUM_THREADS=1 unless it is set; OpenBLAS's sums follow its thread count, so every run
  // here gets the same, for the runs to agree to the bit.
  options.environment.emplace_back("OMP_NUM_THREADS", "1");
  options.stdout_file = log.string() + ".out";
  options.stderr_file = log;
  dapo::test::Child child(arguments, options);
  Run result;
  result.status = child.wait();
  result.log = read_text(log.string() + ".out") + read_text(log);
  return result;
}

// What a torchrun needs to start programs, from a probe launch of `true`:
// - Debian 12's torchrun (PyTorch 1.13 on Python 3.11) starts no program with its defaults --redirects 0 --tee 0:
//   Python 3.11's enum no longer yields IntFlag's zero member, so the "0" it parses becomes None and the agent dies
//   with "'NoneType' object has no attribute 'get'" (fixed in PyTorch 2.0; pytorch/pytorch#92319). Users there add
//   --redirects 2 --tee 2 (each rank's stderr also into a log under --log_dir; stdout untouched); so does this test.
// - Debian sid's torchrun (PyTorch 2.14) starts no program at all: its PyTorch is built without libuv, and both of
//   its rendezvous (c10d for --standalone, static for --master_port) make their TCPStore with libuv, USE_LIBUV=0 or
//   not ("use_libuv was requested but PyTorch was built without libuv support"). Nothing on our side can launch
//   under it; the test says so and skips (our driver's own store falls back by itself: docs/platforms.md).
// Returns the arguments to add (none for a working torchrun), or nothing for a torchrun that cannot start programs.
std::optional<std::vector<std::string>> torchrun_workaround(const std::filesystem::path& torchrun,
                                                            const std::filesystem::path& scratch) {
  const Run probe =
      run({torchrun.string(), "--standalone", "--nproc_per_node", "1", "--no_python", "true"}, scratch / "probe.log");
  if (probe.status == 0) return std::vector<std::string>{};
  if (probe.log.find("use_libuv was requested but PyTorch was built without libuv support") != std::string::npos) {
    MESSAGE(
        "skipped: this torchrun cannot start any program: its PyTorch is built without libuv, and its rendezvous "
        "stores ask for libuv whatever USE_LIBUV says (Debian sid's python3-torch 2.14)");
    return std::nullopt;
  }
  REQUIRE_MESSAGE(probe.log.find("'NoneType' object has no attribute 'get'") != std::string::npos,
                  "torchrun cannot start `true`:\n"
                      << probe.log);
  MESSAGE(
      "this torchrun is PyTorch 1.13 on Python 3.11 (Debian 12), whose default --redirects 0 fails; "
      "launching with --redirects 2 --tee 2, as its users must");
  return std::vector<std::string>{"--redirects", "2", "--tee", "2", "--log_dir", (scratch / "torchelastic").string()};
}

// Whether a metrics or summary field measures time (or speed), which differs from run to run, or memory.
bool varies_with_clock(const std::string& key) {
  return key.rfind("timing_s/", 0) == 0 || key.ends_with("seconds") || key.ends_with("per_second") ||
         key == "perf/throughput" || key == "perf/time_per_step" ||
         key.rfind("perf/max_memory_", 0) == 0;  // one process holds what two ranks share
}

nlohmann::json untimed(nlohmann::json value) {
  for (auto it = value.begin(); it != value.end();) {
    it = varies_with_clock(it.key()) ? value.erase(it) : std::next(it);
  }
  return value;
}

std::vector<nlohmann::json> untimed_rows(const std::filesystem::path& path) {
  std::vector<nlohmann::json> rows;
  for (const auto& row : qwen::read_json_lines(path)) rows.push_back(untimed(row));
  return rows;
}

}  // namespace

TEST_CASE("torchrun's agent store: the variables make every rank a client under PyTorch's key prefix") {
  ScopedEnvironment base(without_launcher_variables());
  {
    ScopedEnvironment torchrun({{"RANK", "1"},
                                {"WORLD_SIZE", "2"},
                                {"MASTER_ADDR", "127.0.0.1"},
                                {"MASTER_PORT", "29500"},
                                {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                {"TORCHELASTIC_RESTART_COUNT", "3"}});
    const auto config = qwen::DistributedConfig::from_environment();
    CHECK(config.use_agent_store);
    CHECK(config.store_prefix == "/worker/attempt_3");
  }
  {
    // --standalone and other rendezvous backends: rank 0 serves, no prefix.
    ScopedEnvironment torchrun({{"RANK", "0"},
                                {"WORLD_SIZE", "2"},
                                {"TORCHELASTIC_USE_AGENT_STORE", "False"},
                                {"TORCHELASTIC_RESTART_COUNT", "0"}});
    const auto config = qwen::DistributedConfig::from_environment();
    CHECK_FALSE(config.use_agent_store);
    CHECK(config.store_prefix.empty());
  }
  {
    ScopedEnvironment torchrun({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
    CHECK_THROWS_WITH_AS(qwen::DistributedConfig::from_environment(),
                         doctest::Contains("TORCHELASTIC_RESTART_COUNT is not set"), std::invalid_argument);
  }
  {
    ScopedEnvironment torchrun({{"RANK", "0"},
                                {"WORLD_SIZE", "2"},
                                {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                {"TORCHELASTIC_RESTART_COUNT", "once"}});
    CHECK_THROWS_WITH_AS(qwen::DistributedConfig::from_environment(),
                         doctest::Contains("TORCHELASTIC_RESTART_COUNT is \"once\", expected an integer"),
                         std::invalid_argument);
  }
}

TEST_CASE("torchrun's agent store: 2 ranks meet through a store they do not serve, their keys under the prefix") {
  dapo::test::ScratchDir scratch;
  const int port = free_port();
  const auto agent = serve_store(port);                       // what torchrun's agent holds open while its ranks run
  agent->set("none/MASTER_PORT", std::vector<uint8_t>{'1'});  // a key of the agent's own (its run id prefix)
  std::vector<std::unique_ptr<dapo::test::Child>> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    dapo::test::SpawnOptions options;
    options.environment = without_launcher_variables();
    // An array, not a temporary vector: g++ 16 warns (-Wfree-nonheap-object, falsely) on freeing the latter here.
    const std::pair<const char*, std::string> variables[] = {{"RANK", std::to_string(rank)},
                                                             {"LOCAL_RANK", std::to_string(rank)},
                                                             {"WORLD_SIZE", "2"},
                                                             {"LOCAL_WORLD_SIZE", "2"},
                                                             {"MASTER_ADDR", "127.0.0.1"},
                                                             {"MASTER_PORT", std::to_string(port)},
                                                             {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                                             {"TORCHELASTIC_RESTART_COUNT", "2"}};
    for (const auto& [name, value] : variables) options.environment.emplace_back(name, value);
    options.stderr_file = scratch.path() / ("log" + std::to_string(rank));
    // launcher_worker's "rank ok" mode: rendezvous, then the sum of 1 + RANK over the ranks into OUT/sum<RANK>.
    ranks.push_back(std::make_unique<dapo::test::Child>(
        std::vector<std::string>{LAUNCHER_WORKER, "rank", "ok", scratch.path().string()}, options));
  }
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    const int status = ranks[rank]->wait();
    REQUIRE_MESSAGE(status == 0, read_text(scratch.path() / ("log" + std::to_string(rank))));
    CHECK(read_text(scratch.path() / ("sum" + std::to_string(rank))) == "3\n");  // 1 + 2, over the agent's store
  }
  // Every key the ranks wrote sits under "/worker/attempt_2", where PyTorch's env:// rendezvous puts its own.
  CHECK(agent->check({"/worker/attempt_2/heartbeat/0", "/worker/attempt_2/heartbeat/1"}));
  CHECK_FALSE(agent->check({"heartbeat/0"}));
  CHECK(agent->get("none/MASTER_PORT") == std::vector<uint8_t>{'1'});
}

TEST_CASE("torchrun's agent store: the --nproc launcher drops the TORCHELASTIC_ variables it inherits") {
  // qwen_gsm8k --nproc run under torchrun's static rendezvous: its ranks must meet through the launcher's own store
  // (rank 0 serves it), not look for an agent's store on a port where nobody serves one.
  dapo::test::ScratchDir scratch;
  dapo::test::SpawnOptions options;
  options.environment = without_launcher_variables();
  for (const auto& [name, value] :
       std::vector<std::pair<std::string, std::string>>{{"RANK", "0"},
                                                        {"WORLD_SIZE", "1"},
                                                        {"MASTER_ADDR", "127.0.0.1"},
                                                        {"MASTER_PORT", std::to_string(free_port())},
                                                        {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                                        {"TORCHELASTIC_RESTART_COUNT", "0"}}) {
    options.environment.emplace_back(name, value);
  }
  options.stderr_file = scratch.path() / "launcher.log";
  // launcher_worker launch NPROC GRACE_S MODE OUT: 2 ranks in "ok" mode, each writing the sum over ranks.
  dapo::test::Child launcher({LAUNCHER_WORKER, "launch", "2", "600", "ok", scratch.path().string()}, options);
  REQUIRE_MESSAGE(launcher.wait() == 0, read_text(scratch.path() / "launcher.log"));
  for (int rank = 0; rank < 2; ++rank) CHECK(read_text(scratch.path() / ("sum" + std::to_string(rank))) == "3\n");
}

TEST_CASE("torchrun: --standalone and the default static rendezvous run the 2-rank demo of the --nproc 2 launcher") {
  const auto torchrun = torchrun_or_skip();
  if (!torchrun) return;
  dapo::test::ScratchDir scratch;
  // launcher + the demo's arguments + extra, in a directory of its own.
  const auto launch = [&](const std::string& name, std::vector<std::string> launcher,
                          const std::vector<std::string>& extra = {}) {
    const auto output = scratch.path() / name;
    const auto demo = demo_arguments(output);
    launcher.insert(launcher.end(), demo.begin(), demo.end());
    launcher.insert(launcher.end(), extra.begin(), extra.end());
    const Run result = run(launcher, scratch.path() / (name + ".log"));
    INFO(name << ": " << result.log);
    REQUIRE(result.status == 0);
    REQUIRE(std::filesystem::exists(output / "summary.json"));
    REQUIRE(std::filesystem::exists(output / "metrics.jsonl"));
    return output;
  };
  const auto workaround = torchrun_workaround(*torchrun, scratch.path());
  if (!workaround) return;
  // The reference: the driver's own launcher, 2 ranks.
  const auto reference = launch("nproc", {QWEN_GSM8K}, {"--nproc", "2"});
  const auto torchrun_with = [&](std::vector<std::string> rendezvous) {
    std::vector<std::string> command{torchrun->string()};
    command.insert(command.end(), workaround->begin(), workaround->end());
    command.insert(command.end(), rendezvous.begin(), rendezvous.end());
    command.insert(command.end(), {"--nproc_per_node", "2", "--no_python", QWEN_GSM8K});
    return command;
  };
  const auto standalone = launch("standalone", torchrun_with({"--standalone"}));
  // Without --standalone or --rdzv-backend: the static rendezvous, the agent's store on --master_port.
  const auto static_rendezvous = launch("static", torchrun_with({"--master_port", std::to_string(free_port())}));

  const auto expected = untimed_rows(reference / "metrics.jsonl");
  REQUIRE(expected.size() == 1);  // one GRPO step
  const auto summary = untimed(dapo::test::read_json(reference / "summary.json"));
  CHECK(summary.at("ranks") == 2);
  const std::string weights = read_text(reference / "checkpoints" / "step-000001" / "model.safetensors");
  REQUIRE(!weights.empty());
  for (const auto& output : {standalone, static_rendezvous}) {
    CAPTURE(output.filename().string());
    // Data parallel is exact here (the warm start too): the same batches, the same all-reduced gradients, whoever
    // started the ranks; so the same metrics, evaluations and weights, to the bit.
    CHECK(untimed_rows(output / "metrics.jsonl") == expected);
    CHECK(untimed(dapo::test::read_json(output / "summary.json")) == summary);
    CHECK(read_text(output / "checkpoints" / "step-000001" / "model.safetensors") == weights);
  }
}
