// The one door between the host and the device. Every read of device data by the host and every host-to-device copy
// of the engine and of the policy update goes through here, so that what a GPU would wait for is counted on any
// device: tests and benchmarks count them per decode step, per admission, per rollout and per optimizer step on the
// CPU.
// - A read waits: on a GPU the host waits for the device's queue to drain.
// - A fetch does not: its copy is queued behind the work already queued (on CUDA into pinned memory), the host queues
//   more work, and takes the values later, when the copy has run, while the device goes on with what came after it.
// - A copy to the device leaves from pinned memory without blocking on CUDA (LibTorch's pinned allocator keeps the
//   staging block until the copy has run), so the host goes on queueing work.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace c10 {
class Event;
}

namespace qwen::host_door {

struct Counts {
  int64_t reads = 0, read_bytes = 0;       // device -> host, waiting
  int64_t fetches = 0, fetched_bytes = 0;  // device -> host, not waiting
  int64_t copies = 0, copied_bytes = 0;    // host -> device
};

// The counts since the process started (all threads together).
Counts counts();

// `tensor`'s values on the host, contiguous (a copy when it lives on a device; one read counted either way).
torch::Tensor read(const torch::Tensor& tensor);
// A device tensor's values on their way to the host: the copy is queued when the fetch is made (one fetch counted)
// and get() gives the values once it has run, waiting for that copy alone (on the CPU, nothing to wait for).
class Fetch {
 public:
  Fetch() = default;  // nothing: get() gives an undefined tensor
  explicit Fetch(const torch::Tensor& tensor);
  Fetch(Fetch&&) noexcept;
  Fetch& operator=(Fetch&&) noexcept;
  ~Fetch();
  torch::Tensor get();  // contiguous, on the host

 private:
  torch::Tensor host_;
  std::unique_ptr<c10::Event> copied_;  // null: no copy to wait for
};

// Host values on `device`: on CUDA through pinned memory, not blocking; elsewhere a plain copy (one copy counted
// either way).
torch::Tensor to_device(const torch::Tensor& host, torch::Device device);
torch::Tensor to_device(const std::vector<int64_t>& values, torch::Device device);  // int64 [values.size()]

// For values the host keeps (a batch built on the host) that a caller may have put on a device: `tensor` itself where
// it is on the CPU, else read (one counted read).
torch::Tensor on_host(const torch::Tensor& tensor);
// `tensor` on `device`: from the CPU through to_device (one counted copy, also where `device` is the CPU, so that the
// CPU counts what a GPU copies); from another device, moved.
torch::Tensor on_device(const torch::Tensor& tensor, torch::Device device);

}  // namespace qwen::host_door
