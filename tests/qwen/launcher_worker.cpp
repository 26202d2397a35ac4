// Test helper for launcher_test: the --nproc launcher (qwen::launch_local_ranks) and the ranks it starts, in one
// program, since the launcher starts copies of the program that calls it. Not a user tool.
//   launcher_worker launch NPROC GRACE_S MODE OUT    runs launch_local_ranks(NPROC, {argv[0], "rank", MODE, OUT},
//                                                    GRACE_S) and exits with what it returns
//   launcher_worker rank MODE OUT                    one rank, as the launcher starts it:
// every rank writes OUT/rank<RANK>.json (the variables it saw, its arguments and pid), meets the others through the
// Communicator (so the variables really are a working rendezvous), then, by MODE:
//   ok      adds 1 + RANK over all ranks, writes the sum to OUT/sum<RANK>, and exits 0
//   exit    rank 1 exits with status 3; the others wait until rank 1 is gone, write OUT/stopped<RANK> and exit 0
//   killed  rank 1 kills itself with SIGKILL; the others hang until the launcher kills them
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "qwen_gsm8k/dist/distributed.hpp"

namespace {

std::string variable(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "(unset)";
}

int run_rank(const std::string& mode, const std::filesystem::path& out, int argc, char** argv) {
  const qwen::DistributedConfig config = qwen::DistributedConfig::from_environment();
  nlohmann::json seen{{"pid", ::getpid()}, {"argv", std::vector<std::string>(argv, argv + argc)}};
  for (const char* name :
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DAPO_LAUNCHER_TEST"}) {
    seen[name] = variable(name);
  }
  const std::string rank = std::to_string(config.rank);
  std::ofstream(out / ("rank" + rank + ".json")) << seen.dump() << "\n";

  // Rank 1's lock, held until it dies: the others' blocking lock returns when rank 1 is gone (exit or kill).
  const std::string lock_path = (out / "rank1.lock").string();
  int lock = -1;
  if (config.rank == 1) {
    lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock < 0 || ::flock(lock, LOCK_EX) != 0) return 10;
  }
  const auto communicator = qwen::Communicator::create(config, torch::kCPU);
  communicator->barrier();  // every rank has written its file, and rank 1 holds its lock
  if (mode == "ok") {
    const std::vector<double> sum = communicator->all_reduce_sum(std::vector<double>{1.0 + config.rank});
    std::ofstream(out / ("sum" + rank)) << sum.at(0) << "\n";
    communicator->barrier();
    return 0;
  }
  if (config.rank == 1) {
    if (mode == "killed") ::raise(SIGKILL);
    std::_Exit(3);
  }
  if (mode == "exit") {
    lock = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
    if (lock < 0 || ::flock(lock, LOCK_SH) != 0) return 11;  // returns once rank 1 has exited
    std::ofstream(out / ("stopped" + rank)) << "\n";
    std::_Exit(0);  // without the Communicator's goodbyes: a peer is gone
  }
  for (;;) ::pause();  // hangs: the launcher must kill it
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  try {
    if (command == "launch" && argc == 6) {
      const std::vector<std::string> arguments{argv[0], "rank", argv[4], argv[5]};
      return qwen::launch_local_ranks(std::stoi(argv[2]), arguments, std::chrono::seconds(std::stoi(argv[3])));
    }
    if (command == "rank" && argc == 4) return run_rank(argv[2], argv[3], argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "launcher_worker %s: %s\n", command.c_str(), error.what());
    return 1;
  }
  std::fprintf(stderr, "usage: launcher_worker launch NPROC GRACE_S MODE OUT | launcher_worker rank MODE OUT\n");
  return 2;
}
