// c10d rendezvous, collectives with lost-rank diagnosis, and the local multi-process launcher.
#include "qwen_gsm8k/dist/distributed.hpp"

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>

#include "qwen_gsm8k/common/stop_request.hpp"

extern char** environ;

namespace qwen {
namespace {

constexpr auto kHeartbeatPeriod = std::chrono::milliseconds(500);

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// LibTorch >= 2.4 asks for the libuv TCPStore server by default (useLibUV = true), which builds without libuv, such as
// Debian's, refuse ("use_libuv was requested but PyTorch was build without libuv support"). The store then falls back
// to the classic server, which speaks the same protocol to every client. Older LibTorch has no such option.
template <class Options>
bool asks_for_libuv(const Options& options) {
  if constexpr (requires { options.useLibUV; }) {
    return options.useLibUV;
  } else {
    return false;
  }
}

template <class Options>
void without_libuv(Options& options) {
  if constexpr (requires { options.useLibUV; }) options.useLibUV = false;
}

c10::intrusive_ptr<c10d::TCPStore> connect_store(const std::string& host, c10d::TCPStoreOptions& options) {
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const std::exception& error) {
    if (!asks_for_libuv(options) || std::string(error.what()).find("libuv") == std::string::npos) throw;
  }
  without_libuv(options);
  return c10::make_intrusive<c10d::TCPStore>(host, options);
}

std::optional<std::string> environment(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

int integer_variable(const char* name, const std::string& value) {
  try {
    std::size_t used = 0;
    const int parsed = std::stoi(value, &used);
    if (used == value.size()) return parsed;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(std::string("environment variable ") + name + " is \"" + value +
                              "\", expected an integer");
}

// Where this rank's Gloo connections listen. Ranks on one machine (a loopback MASTER_ADDR: --nproc, torchrun
// --standalone on a host whose name is localhost) use 127.0.0.1. Otherwise PyTorch's own choice, so that torchrun
// across machines works as it does for PyTorch: GLOO_SOCKET_IFNAME's (first) interface when set, else the address this
// host's name resolves to (loopback when none can be bound). Never MASTER_ADDR itself: only rank 0's machine has it.
std::shared_ptr<::gloo::transport::Device> gloo_device(const DistributedConfig& config) {
  if (const auto interfaces = environment("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(interfaces->substr(0, interfaces->find(',')));
  }
  const std::string& address = config.master_addr;
  if (address == "localhost" || address.rfind("127.", 0) == 0 || address == "::1") {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

DistributedConfig DistributedConfig::from_environment() {
  DistributedConfig config;
  const auto rank = environment("RANK"), world = environment("WORLD_SIZE");
  if (!rank && !world) return config;
  if (!rank || !world) {
    throw std::invalid_argument("RANK and WORLD_SIZE must be set together (as torchrun does); only " +
                                std::string(rank ? "RANK" : "WORLD_SIZE") + " is set");
  }
  config.rank = integer_variable("RANK", *rank);
  config.world_size = integer_variable("WORLD_SIZE", *world);
  config.local_rank =
      environment("LOCAL_RANK") ? integer_variable("LOCAL_RANK", *environment("LOCAL_RANK")) : config.rank;
  if (const auto address = environment("MASTER_ADDR")) config.master_addr = *address;
  if (const auto port = environment("MASTER_PORT")) config.master_port = integer_variable("MASTER_PORT", *port);
  if (config.world_size < 1) throw std::invalid_argument("WORLD_SIZE is " + *world + ", expected >= 1");
  if (config.rank < 0 || config.rank >= config.world_size) {
    throw std::invalid_argument("RANK is " + *rank + ", expected a value in [0, WORLD_SIZE = " + *world + ")");
  }
  if (config.master_port <= 0 || config.master_port > 65535) {
    throw std::invalid_argument("MASTER_PORT is " + std::to_string(config.master_port) + ", expected 1..65535");
  }
  // torchrun writes Python's str(bool); PyTorch's env:// rendezvous tests for exactly "True", and so do we.
  config.use_agent_store = environment("TORCHELASTIC_USE_AGENT_STORE") == std::optional<std::string>("True");
  if (config.use_agent_store) {
    const auto attempt = environment("TORCHELASTIC_RESTART_COUNT");
    if (!attempt) {
      throw std::invalid_argument(
          "TORCHELASTIC_USE_AGENT_STORE is True but TORCHELASTIC_RESTART_COUNT is not set "
          "(torchrun sets both; the store's key prefix needs the restart count)");
    }
    config.store_prefix = "/worker/attempt_" + std::to_string(integer_variable("TORCHELASTIC_RESTART_COUNT", *attempt));
  }
  return config;
}

Communicator::Communicator(DistributedConfig config) : config_(std::move(config)) {}

std::shared_ptr<Communicator> Communicator::create(const DistributedConfig& config, torch::Device device) {
  std::shared_ptr<Communicator> communicator(new Communicator(config));
  communicator->device_ = device;
  if (config.world_size == 1) return communicator;
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(config.master_port);
  options.timeout = config.timeout;
  if (!config.use_agent_store) {  // rank 0 serves, and waits until every rank has connected
    options.isServer = config.rank == 0;
    options.numWorkers = static_cast<std::size_t>(config.world_size);
    options.waitWorkers = true;
  }  // else all clients, and no count of workers in the agent's store: only our prefixed keys are ours to touch
  try {
    communicator->store_ = connect_store(config.master_addr, options);
    options.isServer = false;  // the heartbeat thread's own connection
    options.numWorkers = c10::nullopt;
    options.waitWorkers = false;
    communicator->heartbeat_store_ = connect_store(config.master_addr, options);
  } catch (const std::exception& error) {
    throw std::runtime_error("rank " + std::to_string(config.rank) + ": rendezvous at " + config.master_addr + ":" +
                             std::to_string(config.master_port) + " failed (" + error.what() + "); are all " +
                             std::to_string(config.world_size) + " ranks started with the same " +
                             "MASTER_ADDR and MASTER_PORT?");
  }
  if (!config.store_prefix.empty()) {
    communicator->store_ = c10::make_intrusive<c10d::PrefixStore>(config.store_prefix, communicator->store_);
    communicator->heartbeat_store_ =
        c10::make_intrusive<c10d::PrefixStore>(config.store_prefix, communicator->heartbeat_store_);
  }
  communicator->heartbeat_store_->set("heartbeat/" + std::to_string(config.rank), std::vector<uint8_t>(8, 0));
  communicator->heartbeat_ = std::thread([raw = communicator.get()] { raw->heartbeat_loop(); });
  const auto prefix = c10::make_intrusive<c10d::PrefixStore>("collectives", communicator->store_);
  if (device.is_cuda()) {
#if defined(USE_C10D_NCCL)
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = config.timeout;
    communicator->group_ =
        c10::make_intrusive<c10d::ProcessGroupNCCL>(prefix, config.rank, config.world_size, nccl_options);
#else
    throw std::runtime_error("this LibTorch has no NCCL: data-parallel training on CUDA is not available");
#endif
  } else {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(config.timeout);
    gloo_options->devices.push_back(gloo_device(config));
    communicator->group_ =
        c10::make_intrusive<c10d::ProcessGroupGloo>(prefix, config.rank, config.world_size, gloo_options);
  }
  return communicator;
}

Communicator::~Communicator() {
  stop_ = true;
  if (heartbeat_.joinable()) heartbeat_.join();
}

void Communicator::heartbeat_loop() {
  const std::string key = "heartbeat/" + std::to_string(config_.rank);
  while (!stop_) {
    try {
      const int64_t now = now_ms();
      std::vector<uint8_t> bytes(8);
      std::memcpy(bytes.data(), &now, 8);
      heartbeat_store_->set(key, bytes);
    } catch (const std::exception&) {
      // The store host (rank 0 or the torchrun agent) is gone; the next collective reports it.
    }
    std::this_thread::sleep_for(kHeartbeatPeriod);
  }
}

std::string Communicator::lost_ranks() {
  std::string lost;
  const int64_t now = now_ms();
  for (int rank = 0; rank < config_.world_size; ++rank) {
    if (rank == config_.rank) continue;
    try {
      const auto bytes = heartbeat_store_->get("heartbeat/" + std::to_string(rank));
      int64_t beat = 0;
      std::memcpy(&beat, bytes.data(), std::min<std::size_t>(8, bytes.size()));
      const double silent = static_cast<double>(now - beat) / 1000.0;
      if (silent > 4.0 * std::chrono::duration<double>(kHeartbeatPeriod).count()) {
        lost += (lost.empty() ? "" : ", ") +
                ("rank " + std::to_string(rank) + " (no heartbeat for " + std::to_string(silent).substr(0, 4) + " s)");
      }
    } catch (const std::exception&) {
      return std::string(config_.use_agent_store ? "the torchrun agent" : "rank 0") + " (the rendezvous host at " +
             config_.master_addr + ":" + std::to_string(config_.master_port) + " is unreachable)";
    }
  }
  return lost;
}

void Communicator::finish(const std::function<void()>& collective, const char* what) {
  try {
    collective();
  } catch (const std::exception& error) {
    // Give a dead peer's heartbeat time to go stale before judging.
    std::this_thread::sleep_for(5 * kHeartbeatPeriod);
    const std::string lost = lost_ranks();
    std::string message = error.what();
    message = message.substr(0, message.find('\n'));
    throw std::runtime_error("rank " + std::to_string(config_.rank) + ": " + what +
                             " failed: " + (lost.empty() ? "no rank has stopped its heartbeat" : "lost " + lost) +
                             " (" + message + ")");
  }
}

void Communicator::broadcast(std::vector<torch::Tensor>& tensors, int root) {
  if (config_.world_size == 1 || tensors.empty()) return;
  for (auto& tensor : tensors) {
    std::vector<torch::Tensor> one{tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    finish([&] { group_->broadcast(one, options)->wait(); }, "broadcast");
  }
}

void Communicator::all_reduce_sum(std::vector<torch::Tensor>& tensors) {
  if (config_.world_size == 1 || tensors.empty()) return;
  constexpr int64_t kBucketBytes = 64ll << 20;
  // Consecutive tensors of one dtype are packed into a flat buffer, reduced at once, and unpacked.
  std::size_t start = 0;
  while (start < tensors.size()) {
    std::size_t end = start;
    int64_t bytes = 0;
    while (end < tensors.size() && tensors[end].scalar_type() == tensors[start].scalar_type() &&
           (end == start || bytes + tensors[end].numel() * tensors[end].element_size() <= kBucketBytes)) {
      bytes += tensors[end].numel() * tensors[end].element_size();
      ++end;
    }
    std::vector<torch::Tensor> flat_views;
    for (std::size_t i = start; i < end; ++i) flat_views.push_back(tensors[i].reshape(-1));
    std::vector<torch::Tensor> bucket{torch::cat(flat_views)};
    finish([&] { group_->allreduce(bucket)->wait(); }, "all-reduce");
    int64_t offset = 0;
    for (std::size_t i = start; i < end; ++i) {
      const int64_t count = tensors[i].numel();
      tensors[i].copy_(bucket[0].narrow(0, offset, count).view_as(tensors[i]));
      offset += count;
    }
    start = end;
  }
}

std::vector<double> Communicator::all_reduce_sum(const std::vector<double>& values) {
  if (config_.world_size == 1) return values;
  std::vector<torch::Tensor> tensor{torch::tensor(values, torch::kFloat64).to(device_)};
  all_reduce_sum(tensor);
  const torch::Tensor host = tensor[0].cpu();
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

std::vector<double> Communicator::all_gather(const std::vector<double>& values) {
  if (config_.world_size == 1) return values;
  std::vector<torch::Tensor> input{torch::tensor(values, torch::kFloat64).to(device_)};
  std::vector<std::vector<torch::Tensor>> output(1);
  for (int rank = 0; rank < config_.world_size; ++rank) output[0].push_back(torch::empty_like(input[0]));
  finish([&] { group_->allgather(output, input)->wait(); }, "all-gather");
  std::vector<double> gathered;
  for (const auto& part : output[0]) {
    const torch::Tensor host = part.cpu();
    gathered.insert(gathered.end(), host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
  }
  return gathered;
}

void Communicator::all_reduce_gradients(const std::vector<torch::Tensor>& parameters) {
  if (config_.world_size == 1) return;
  std::vector<torch::Tensor> gradients;
  for (const auto& parameter : parameters) {
    if (!parameter.requires_grad()) continue;
    if (!parameter.grad().defined()) parameter.mutable_grad() = torch::zeros_like(parameter);
    gradients.push_back(parameter.grad());
  }
  all_reduce_sum(gradients);
}

bool Communicator::agree(bool value, int root) {
  if (config_.world_size == 1) return value;
  std::vector<torch::Tensor> flag{torch::full({1}, value ? 1.0 : 0.0, torch::kFloat64).to(device_)};
  broadcast(flag, root);
  return flag[0].item<double>() != 0.0;
}

void Communicator::barrier() {
  if (config_.world_size == 1) return;
  finish([&] { group_->barrier()->wait(); }, "barrier");
}

std::optional<int> free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return std::nullopt;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  std::optional<int> port;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  ::close(fd);
  return port;
}

int launch_local_ranks(int nproc, const std::vector<std::string>& arguments, std::chrono::seconds grace) {
  if (nproc < 1) throw std::invalid_argument("--nproc is " + std::to_string(nproc) + ", expected >= 1");
  // SIGTERM / SIGINT (a scheduler, Ctrl-C): the launcher does not die of them but passes the first on to every rank
  // (they stop after the same step, see Trainer::set_stop_request, and exit with 128 + signal) and kills the ranks on
  // the second; so a job signalled through the launcher alone still checkpoints, and the launcher reports how its
  // ranks ended. The ranks themselves only ever stop on a signal (RepeatedSignal::kAsksToStop): one that reached them
  // twice, from the terminal and from here, must not kill them mid-checkpoint. (The ranks start with the default
  // actions: exec resets handled signals.)
  install_stop_handlers(RepeatedSignal::kAsksToStop);
  const int port = free_loopback_port().value_or(29500);  // for rank 0's store
  std::map<pid_t, int> ranks;
  for (int rank = 0; rank < nproc; ++rank) {
    std::vector<std::string> environment_text;
    for (char** variable = environ; *variable != nullptr; ++variable) {
      const std::string text = *variable;
      // A launcher's variables of its own (this one run under torchrun, say) would name another rendezvous; torchrun's
      // TORCHELASTIC_* ones would make every rank a client of an agent store that nobody serves here.
      if (text.rfind("RANK=", 0) != 0 && text.rfind("WORLD_SIZE=", 0) != 0 && text.rfind("LOCAL_RANK=", 0) != 0 &&
          text.rfind("MASTER_ADDR=", 0) != 0 && text.rfind("MASTER_PORT=", 0) != 0 &&
          text.rfind("LOCAL_WORLD_SIZE=", 0) != 0 && text.rfind("TORCHELASTIC_", 0) != 0) {
        environment_text.push_back(text);
      }
    }
    environment_text.push_back("RANK=" + std::to_string(rank));
    environment_text.push_back("LOCAL_RANK=" + std::to_string(rank));
    environment_text.push_back("WORLD_SIZE=" + std::to_string(nproc));
    environment_text.push_back("LOCAL_WORLD_SIZE=" + std::to_string(nproc));
    environment_text.push_back("MASTER_ADDR=127.0.0.1");
    environment_text.push_back("MASTER_PORT=" + std::to_string(port));
    std::vector<char*> envp, argv;
    for (auto& text : environment_text) envp.push_back(text.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = arguments;
    for (auto& text : args) argv.push_back(text.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()) != 0) {
      for (const auto& [child, child_rank] : ranks) ::kill(child, SIGKILL);
      throw std::runtime_error("cannot start rank " + std::to_string(rank) + " of " + std::to_string(nproc));
    }
    ranks[pid] = rank;
  }
  int signals_passed = 0;
  int result = 0;
  auto first_failure = std::chrono::steady_clock::time_point::max();
  while (!ranks.empty()) {
    if (const int signals = stop_signal_count(); signals > signals_passed) {
      for (const auto& [child, rank] : ranks) ::kill(child, signals == 1 ? stop_signal() : SIGKILL);
      if (signals > 1 && result == 0) result = 128 + stop_signal();
      signals_passed = signals;
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0 && ranks.count(pid)) {
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      // A rank that stopped on request exits with 128 + SIGTERM or SIGINT, and the others stop after the same step:
      // they are not killed.
      const bool stopped = WIFEXITED(status) && (code == 128 + SIGTERM || code == 128 + SIGINT);
      if (code != 0 && result == 0) result = code;
      if (code != 0 && !stopped && first_failure == std::chrono::steady_clock::time_point::max()) {
        first_failure = std::chrono::steady_clock::now();
        std::fprintf(stderr, "qwen_gsm8k: rank %d %s %d; stopping the other ranks\n", ranks[pid],
                     WIFEXITED(status) ? "exited with status" : "was killed by signal",
                     WIFEXITED(status) ? code : WTERMSIG(status));
      }
      ranks.erase(pid);
      continue;
    }
    if (first_failure != std::chrono::steady_clock::time_point::max() &&
        std::chrono::steady_clock::now() - first_failure > grace) {
      for (const auto& [child, rank] : ranks) ::kill(child, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return result;
}

}  // namespace qwen
