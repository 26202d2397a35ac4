// The counted door between the host and the device.
#include "qwen_gsm8k/model/host_door.hpp"

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/torch.h>

#include <atomic>
#include <thread>

namespace qwen::host_door {
namespace {

std::atomic<int64_t> reads{0}, read_bytes{0}, fetches{0}, fetched_bytes{0}, copies{0}, copied_bytes{0};

int64_t bytes_of(const torch::Tensor& tensor) {
  return tensor.numel() * static_cast<int64_t>(tensor.element_size());
}

}  // namespace

Counts counts() {
  return {reads.load(), read_bytes.load(), fetches.load(), fetched_bytes.load(), copies.load(), copied_bytes.load()};
}

torch::Tensor read(const torch::Tensor& tensor) {
  ++reads;
  read_bytes += bytes_of(tensor);
  return tensor.device().is_cpu() ? tensor.contiguous() : tensor.cpu().contiguous();
}

Fetch::Fetch(const torch::Tensor& tensor) {
  ++fetches;
  fetched_bytes += bytes_of(tensor);
  if (!tensor.device().is_cuda()) {
    host_ = tensor.cpu().contiguous();
    return;
  }
  host_ = torch::empty(tensor.sizes(), tensor.options().device(torch::kCPU).pinned_memory(true));
  host_.copy_(tensor, /*non_blocking=*/true);
  copied_ = std::make_unique<c10::Event>(c10::DeviceType::CUDA);
  copied_->record(c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getStream(tensor.device()));
}

Fetch::Fetch(Fetch&&) noexcept = default;
Fetch& Fetch::operator=(Fetch&&) noexcept = default;
Fetch::~Fetch() = default;

torch::Tensor Fetch::get() {
  // LibTorch 1.13's c10::Event has no synchronize(): ask until the copy has run (cudaEventSynchronize spins too).
  while (copied_ && !copied_->query()) std::this_thread::yield();
  copied_.reset();
  return host_;
}

torch::Tensor to_device(const torch::Tensor& host, torch::Device device) {
  ++copies;
  copied_bytes += bytes_of(host);
  if (device.is_cuda()) return host.contiguous().pin_memory().to(device, /*non_blocking=*/true);
  return host.to(device);
}

torch::Tensor to_device(const std::vector<int64_t>& values, torch::Device device) {
  return to_device(torch::tensor(values, torch::kInt64), device);
}

torch::Tensor on_host(const torch::Tensor& tensor) {
  return tensor.device().is_cpu() ? tensor : read(tensor);
}

torch::Tensor on_device(const torch::Tensor& tensor, torch::Device device) {
  return tensor.device().is_cpu() ? to_device(tensor, device) : tensor.to(device);
}

}  // namespace qwen::host_door
