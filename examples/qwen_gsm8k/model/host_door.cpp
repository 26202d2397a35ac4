// The counted door between the host and the device.
#include "qwen_gsm8k/model/host_door.hpp"

#include <torch/torch.h>

#include <atomic>

namespace qwen::host_door {
namespace {

std::atomic<int64_t> reads{0}, read_bytes{0}, copies{0}, copied_bytes{0};

int64_t bytes_of(const torch::Tensor& tensor) {
  return tensor.numel() * static_cast<int64_t>(tensor.element_size());
}

}  // namespace

Counts counts() {
  return {reads.load(), read_bytes.load(), copies.load(), copied_bytes.load()};
}

torch::Tensor read(const torch::Tensor& tensor) {
  ++reads;
  read_bytes += bytes_of(tensor);
  return tensor.device().is_cpu() ? tensor.contiguous() : tensor.cpu().contiguous();
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

}  // namespace qwen::host_door
