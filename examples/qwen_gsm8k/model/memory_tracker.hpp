// Counts LibTorch's CPU tensor memory while an instance lives: bytes held now, the peak since reset_peak(), the
// largest single allocation and the sizes allocated. It wraps the CPU allocator LibTorch had (tcmalloc or glibc
// underneath, unchanged) and puts it back on destruction; memory allocated under it is counted off when freed, even
// after. For tests and benchmarks (the peak memory of generate); one instance at a time. Not a caching allocator: it
// allocates nothing itself.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace qwen {

class CpuMemoryTracker final : public c10::Allocator {
 public:
  CpuMemoryTracker() : base_(c10::GetCPUAllocator()) {
    State& state = shared();
    const std::lock_guard<std::mutex> lock(state.mutex);
    if (state.active) throw std::logic_error("CpuMemoryTracker: one instance at a time");
    if (base_->raw_deleter() == nullptr) {
      throw std::runtime_error("CpuMemoryTracker: LibTorch's CPU allocator has no raw deleter to wrap");
    }
    state.active = true;
    state.base_deleter = base_->raw_deleter();
    state.peak = state.current;
    state.largest = 0;
    state.count = 0;
    state.sizes.clear();
    c10::SetCPUAllocator(this, kPriority);
  }
  ~CpuMemoryTracker() override {
    c10::SetCPUAllocator(base_, kPriority);
    State& state = shared();
    const std::lock_guard<std::mutex> lock(state.mutex);
    state.active = false;
  }
  CpuMemoryTracker(const CpuMemoryTracker&) = delete;
  CpuMemoryTracker& operator=(const CpuMemoryTracker&) = delete;

  // Whether an instance is installed now (there can be one at a time).
  static bool installed() { return read_flag(); }

  // Bytes allocated under a tracker and not freed yet; the most of them at once since construction or reset_peak().
  int64_t current_bytes() const { return read(&State::current); }
  int64_t peak_bytes() const { return read(&State::peak); }
  int64_t largest_allocation() const { return read(&State::largest); }
  int64_t allocations() const { return read(&State::count); }
  // How many allocations of exactly `bytes` were made (a buffer of a known shape and dtype).
  int64_t allocations_of(int64_t bytes) const {
    State& state = shared();
    const std::lock_guard<std::mutex> lock(state.mutex);
    const auto found = state.sizes.find(bytes);
    return found == state.sizes.end() ? 0 : found->second;
  }
  // The peak and the largest allocation start again from what is held now.
  void reset_peak() {
    State& state = shared();
    const std::lock_guard<std::mutex> lock(state.mutex);
    state.peak = state.current;
    state.largest = 0;
  }

  // Plain data pointers (data == context), as LibTorch's own CPU allocator gives: some ops use raw_allocate.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t bytes) override {
    return track(bytes);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t bytes) const override {
    return track(bytes);
  }
#endif
  c10::DeleterFnPtr raw_deleter() const override {
    return &release;
  }

 private:
  static constexpr uint8_t kPriority = 200;  // above LibTorch's default CPU allocator (0)

  // Process-wide, so that a block freed after its tracker is gone still finds its size and its real deleter.
  struct State {
    std::mutex mutex;
    bool active = false;
    c10::DeleterFnPtr base_deleter = nullptr;
    int64_t current = 0, peak = 0, largest = 0, count = 0;
    std::unordered_map<const void*, int64_t> held;  // block -> bytes
    std::unordered_map<int64_t, int64_t> sizes;     // bytes -> allocations
  };
  static State& shared() {
    static State* state = new State;  // never destroyed: blocks may be freed during static destruction
    return *state;
  }
  static int64_t read(int64_t State::*field) {
    State& state = shared();
    const std::lock_guard<std::mutex> lock(state.mutex);
    return state.*field;
  }

  static bool read_flag() {
    State& state = shared();
    const std::lock_guard<std::mutex> lock(state.mutex);
    return state.active;
  }

  static void release(void* data) {
    State& state = shared();
    c10::DeleterFnPtr deleter = nullptr;
    {
      const std::lock_guard<std::mutex> lock(state.mutex);
      const auto found = state.held.find(data);
      if (found != state.held.end()) {
        state.current -= found->second;
        state.held.erase(found);
      }
      deleter = state.base_deleter;
    }
    deleter(data);
  }

  c10::DataPtr track(size_t bytes) const {
    void* data = base_->raw_allocate(bytes);
    State& state = shared();
    const auto size = static_cast<int64_t>(bytes);
    {
      const std::lock_guard<std::mutex> lock(state.mutex);
      state.held[data] = size;
      state.current += size;
      if (state.current > state.peak) state.peak = state.current;
      if (size > state.largest) state.largest = size;
      ++state.count;
      ++state.sizes[size];
    }
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::Allocator* base_;
};

}  // namespace qwen
