// CUDA graphs of the engine's decode step, as vLLM and SGLang decode: each step shape (live rows and attended window,
// rounded up to buckets by the engine) is run eagerly the first time it comes (its warm-up: cuBLAS handles, the
// weights' autocast casts, SDPA's choice), captured the second time on a side stream, and replayed from then on: one
// launch per step instead of one per kernel. The graphs live as long as the engine's model runner, across its runs
// (every rollout of a training run), and draw their temporaries from one memory pool. A step that can be captured
// reads and writes only tensors that outlive it at fixed addresses (the slot pool, the runner's per-slot state, the
// weights or their compute copy, refreshed in place) and makes no host synchronisation; a capture that
// fails is reported once and the runner goes on eagerly.
//
// The capture itself is a GraphRecorder's: CUDA's (built with CUDA LibTorch only, DAPO_DRIVER_CUDA, on a CUDA device),
// or one a test gives (tests/qwen/engine_test.cpp replays the captured step function on the CPU and counts).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>

namespace qwen {

class GraphRecorder {
 public:
  // (rows, window, variant): the step's shape and which of its variants (the run's sampling settings, which the step's
  // kernels take as constants) it computes.
  using Shape = std::tuple<int64_t, int64_t, int64_t>;
  virtual ~GraphRecorder() = default;
  // Records `step`'s device work at `shape` without running it; throws if it cannot be recorded.
  virtual void capture(Shape shape, const std::function<void()>& step) = 0;
  virtual void replay(Shape shape) = 0;  // runs what was recorded at `shape`
  virtual void clear() = 0;              // forgets every recording
};

class DecodeGraphs {
 public:
  using Shape = GraphRecorder::Shape;

  // Active when `wanted` and either `recorder` is given or the program was built with CUDA LibTorch and `device` is a
  // CUDA device (then CUDA's recorder).
  DecodeGraphs(torch::Device device, bool wanted, std::shared_ptr<GraphRecorder> recorder = nullptr);
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // True where this build can capture CUDA graphs at all.
  static bool compiled();
  bool active() const { return recorder_ != nullptr; }

  // Runs `step` at `shape`: eagerly while inactive or the first time the shape comes, then as a captured graph.
  // `step` must do the same device work, at the same addresses, every time it is called with the same shape.
  void run(Shape shape, const std::function<void()>& step);
  // Forgets every graph (what they read has moved): shapes are run eagerly, then captured, again.
  void clear();

  int64_t captures() const { return captures_; }  // since construction
  int64_t replays() const { return replays_; }

 private:
  bool capture(Shape shape, const std::function<void()>& step);  // false (and inactive from then on) if it failed

  std::shared_ptr<GraphRecorder> recorder_;
  std::map<Shape, int64_t> eager_runs_;
  std::map<Shape, bool> captured_;
  int64_t captures_ = 0, replays_ = 0;
};

}  // namespace qwen
