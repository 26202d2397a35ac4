// CUDA graphs of the engine's decode step, as vLLM and SGLang decode: each step shape (live rows and attended window,
// rounded up to buckets by the engine) is run eagerly the first time it comes (its warm-up: cuBLAS handles, the
// weights' autocast casts, SDPA's choice), captured the second time on a side stream, and replayed from then on: one
// launch per step instead of one per kernel. Every graph of a run draws its temporaries from one memory pool. A step
// that can be captured reads and writes only tensors that outlive it at fixed addresses (the slot pool, the engine's
// per-slot state, the cached weight casts) and makes no host synchronisation; a capture that fails is reported once
// and the run goes on eagerly.
//
// Built with CUDA LibTorch only (DAPO_DRIVER_CUDA); elsewhere, and on a CPU device, active() is false and run() is
// never asked to capture.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

namespace qwen {

class DecodeGraphs {
 public:
  using Shape = std::pair<int64_t, int64_t>;  // (rows, window)

  // Active when `wanted`, the program was built with CUDA LibTorch and `device` is a CUDA device.
  DecodeGraphs(torch::Device device, bool wanted);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // True where this build can capture CUDA graphs at all.
  static bool compiled();
  bool active() const { return active_; }

  // Runs `step` at `shape`: eagerly while inactive or the first time the shape comes, then as a captured graph.
  // `step` must do the same device work, at the same addresses, every time it is called with the same shape.
  void run(Shape shape, const std::function<void()>& step);

  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }

 private:
  bool capture(Shape shape, const std::function<void()>& step);  // false (and inactive from then on) if it failed

  struct Graphs;
  std::unique_ptr<Graphs> graphs_;
  bool active_ = false;
  int64_t captures_ = 0, replays_ = 0;
};

}  // namespace qwen
