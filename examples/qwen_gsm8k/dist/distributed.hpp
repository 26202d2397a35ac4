// Data-parallel training across processes with LibTorch's own distributed engine, c10d: Gloo for CPU tensors, NCCL for
// CUDA tensors (when LibTorch has it). Ranks meet through a TCPStore the way torchrun arranges it (RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT; with TORCHELASTIC_USE_AGENT_STORE=True the torchrun agent already serves the
// store there and every rank is a client, as in PyTorch's env:// rendezvous). Every rank keeps a heartbeat in the
// store, so that when a collective fails or times out the error names the rank that was lost instead of hanging. Not a
// general collective library: only what the trainer needs (broadcast, sum, gather, barrier).
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace c10d {
class Store;
class ProcessGroup;
class Backend;
}  // namespace c10d

namespace qwen {

// What runs collectives: ProcessGroupGloo / ProcessGroupNCCL derive from ProcessGroup in LibTorch 1.x and from Backend
// in 2.x; the calls used here are the same.
#if TORCH_VERSION_MAJOR >= 2
using CollectiveGroup = c10d::Backend;
#else
using CollectiveGroup = c10d::ProcessGroup;
#endif

struct DistributedConfig {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // torchrun's static rendezvous (its default without --standalone or --rdzv-backend): the agent hosts the TCPStore
  // on MASTER_PORT itself, so no rank may start one there; every rank connects as a client and keeps its keys under
  // store_prefix, "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>", the prefix PyTorch's env:// rendezvous uses, so
  // that they cannot collide with the agent's own keys or with an earlier attempt's. Otherwise rank 0 hosts it.
  bool use_agent_store = false;
  std::string store_prefix;
  // A collective (or the rendezvous) that waits longer than this fails, naming the ranks whose heartbeat stopped.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);

  // From RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE and
  // TORCHELASTIC_RESTART_COUNT; all absent means one process. Throws std::invalid_argument naming the variable and
  // its value when they are inconsistent.
  static DistributedConfig from_environment();
};

class Communicator {
 public:
  // world_size 1: no store, no process group; every collective is the identity. Otherwise rendezvous (TCPStore on
  // master_addr:master_port, served by rank 0 or by the torchrun agent, see use_agent_store), then a Gloo (CPU) or NCCL
  // (CUDA) process group for `device`.
  static std::shared_ptr<Communicator> create(const DistributedConfig& config, torch::Device device);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return config_.rank; }
  int world_size() const { return config_.world_size; }
  bool is_root() const { return config_.rank == 0; }

  // This rank's part of `count` items split in contiguous, balanced shares in rank order: [begin, end).
  std::pair<int64_t, int64_t> shard(int64_t count) const { return share(count, config_.rank, config_.world_size); }
  static std::pair<int64_t, int64_t> share(int64_t count, int rank, int world_size) {
    const int64_t base = count / world_size, extra = count % world_size;
    const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
    return {begin, begin + base + (rank < extra ? 1 : 0)};
  }

  // In place: every tensor gets root's values.
  void broadcast(std::vector<torch::Tensor>& tensors, int root = 0);
  // In place: the sum over ranks, through flat buckets (one per dtype, at most 64 MB each) instead of one message
  // per tensor.
  void all_reduce_sum(std::vector<torch::Tensor>& tensors);
  std::vector<double> all_reduce_sum(const std::vector<double>& values);
  // Every rank's `values` (all the same length), in rank order.
  std::vector<double> all_gather(const std::vector<double>& values);
  void barrier();
  // The gradients of `parameters` summed over ranks (a parameter without one contributes zeros), in flat buckets.
  void all_reduce_gradients(const std::vector<torch::Tensor>& parameters);
  // Every rank gets root's value of a decision (so that ranks never disagree on which collectives come next).
  bool agree(bool value, int root = 0);

 private:
  explicit Communicator(DistributedConfig config);
  // Waits for a collective; on failure throws std::runtime_error naming the lost ranks (see the file comment).
  void finish(const std::function<void()>& collective, const char* what);
  std::string lost_ranks();
  void heartbeat_loop();

  DistributedConfig config_;
  torch::Device device_ = torch::kCPU;
  c10::intrusive_ptr<c10d::Store> store_, heartbeat_store_;
  c10::intrusive_ptr<CollectiveGroup> group_;
  std::atomic<bool> stop_{false};
  std::thread heartbeat_;
};

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, read back, released), for a rendezvous host
// that is about to listen on it; nothing when the socket calls fail.
std::optional<int> free_loopback_port();

// The --nproc launcher: runs this program `nproc` times on this machine as ranks 0..nproc-1 (RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free MASTER_PORT) with `arguments` (argv without --nproc), waits for them, and
// returns 0 when all succeed, else the first failure's exit status (128 + signal for a killed rank). When one rank
// fails, the others get `grace` to stop with their own error, then are killed. SIGTERM / SIGINT sent to the launcher
// go on to the ranks (the first as it is: they stop at a step boundary and exit with 128 + signal, which is no
// failure; the second as SIGKILL).
int launch_local_ranks(int nproc, const std::vector<std::string>& arguments, std::chrono::seconds grace);

}  // namespace qwen
