// A CPU allocator that wraps LibTorch's and counts live and peak bytes, so benchmarks can report the peak memory of a
// computation exactly (not a resident-set estimate). Install once at start-up; it stays for the process.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

namespace dapo::bench {

class TrackingAllocator final : public c10::Allocator {
 public:
  static TrackingAllocator& install() {
    static TrackingAllocator tracker(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&tracker, /*priority=*/255);
    return tracker;
  }

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t bytes) override {
    return wrap(bytes);
  }
  void copy_data(void* destination, const void* source, std::size_t count) const override {
    std::memcpy(destination, source, count);
  }
#else
  c10::DataPtr allocate(size_t bytes) const override {
    return wrap(bytes);
  }
#endif

  int64_t live_bytes() const {
    return live_.load();
  }
  int64_t peak_bytes() const {
    return peak_.load();
  }
  void reset_peak() {
    peak_.store(live_.load());
  }

 private:
  struct Context {
    c10::DataPtr inner;
    int64_t bytes;
    const TrackingAllocator* owner;
  };

  explicit TrackingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr wrap(size_t bytes) const {
    auto* context = new Context{base_->allocate(bytes), static_cast<int64_t>(bytes), this};
    const int64_t live = live_.fetch_add(context->bytes) + context->bytes;
    int64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    void* data = context->inner.get();
    const c10::Device device = context->inner.device();
    return {data, context, &release, device};
  }

  static void release(void* pointer) {
    auto* context = static_cast<Context*>(pointer);
    context->owner->live_.fetch_sub(context->bytes);
    delete context;  // frees the inner allocation
  }

  c10::Allocator* base_;
  mutable std::atomic<int64_t> live_{0}, peak_{0};
};

}  // namespace dapo::bench
