// The one door between the host and the device. Every read of device data by the host (on a GPU the host then waits
// for the device's queue to drain) and every host-to-device copy of the engine goes through these two functions, so
// that what a GPU would wait for is counted on any device: tests and benchmarks count reads and copies per decode
// step, per admission and per rollout on the CPU. On CUDA a copy leaves from pinned memory without blocking (LibTorch's
// pinned allocator keeps the staging block until the copy has run), so the host goes on queueing work.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace qwen::host_door {

struct Counts {
  int64_t reads = 0, read_bytes = 0;     // device -> host
  int64_t copies = 0, copied_bytes = 0;  // host -> device
};

// The counts since the process started (all threads together).
Counts counts();

// `tensor`'s values on the host, contiguous (a copy when it lives on a device; one read counted either way).
torch::Tensor read(const torch::Tensor& tensor);
// Host values on `device`: on CUDA through pinned memory, not blocking; elsewhere a plain copy (one copy counted
// either way).
torch::Tensor to_device(const torch::Tensor& host, torch::Device device);
torch::Tensor to_device(const std::vector<int64_t>& values, torch::Device device);  // int64 [values.size()]

}  // namespace qwen::host_door
