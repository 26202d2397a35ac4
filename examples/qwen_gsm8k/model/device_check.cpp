// Whether a --device can run in this process (see the header).
#include "qwen_gsm8k/model/device_check.hpp"

#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/cuda.h>

#include <cstdint>
#include <optional>
#include <stdexcept>

namespace qwen {

bool libtorch_has_cuda() {
  try {
    // The hooks of a LibTorch without CUDA refuse every CUDA question; those of one with it answer this one with or
    // without a GPU.
    (void)at::detail::getCUDAHooks().versionCUDART();
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

void check_device(torch::Device device, const std::string& command) {
  if (device.is_cpu()) return;
  const std::string asked = command + ": --device " + device.str();
  if (!device.is_cuda()) throw std::invalid_argument(asked + " is not supported, expected cpu or cuda[:N]");
  if (!libtorch_has_cuda()) {
    throw std::invalid_argument(asked +
                                " asks for CUDA, but this program's LibTorch was built without CUDA (a CPU-only "
                                "build such as Debian's libtorch-dev): build it against a LibTorch with CUDA (pip's "
                                "torch, scripts/pip-torch.sh), or use --device cpu");
  }
  if (!torch::cuda::is_available()) {
    throw std::invalid_argument(asked +
                                " asks for CUDA; this LibTorch has CUDA, but no GPU is visible to this process (the "
                                "NVIDIA driver, CUDA_VISIBLE_DEVICES): use --device cpu, or run where a GPU is");
  }
  // device_count() is a std::size_t in LibTorch 1.x and a c10::DeviceIndex (signed) in later ones.
  const auto count = static_cast<int64_t>(torch::cuda::device_count());
  if (device.has_index() && (device.index() < 0 || device.index() >= count)) {
    throw std::invalid_argument(asked + " names GPU " + std::to_string(device.index()) + ", but this process sees " +
                                std::to_string(count) + " (cuda:0 .. cuda:" + std::to_string(count - 1) + ")");
  }
}

torch::Device usable_device(const std::string& text, const std::string& command) {
  std::optional<torch::Device> device;
  try {
    device.emplace(text);
  } catch (const c10::Error&) {
    throw std::invalid_argument(command + ": --device \"" + text + "\" is not a device, expected cpu or cuda[:N]");
  }
  check_device(*device, command);
  return *device;
}

}  // namespace qwen
