// Capture and replay: the shape bookkeeping for any recorder; CUDA's recorder through ATen's CUDAGraph (the API is the
// same in LibTorch 2.6 and 2.15 for what is used here).
#include "qwen_gsm8k/engine/decode_graphs.hpp"

#include <cstdio>
#include <exception>

#if defined(DAPO_DRIVER_CUDA)
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace qwen {
namespace {

#if defined(DAPO_DRIVER_CUDA)
class CudaGraphRecorder final : public GraphRecorder {
 public:
  explicit CudaGraphRecorder(torch::Device device) : device_(device), pool_(at::cuda::graph_pool_handle()) {}

  void capture(Shape shape, const std::function<void()>& step) override {
    const c10::cuda::CUDAGuard device_guard(device_);
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    // Autocast's own cache off while capturing: a cast it cached would be read by the graph after autocast drops it.
    // Whatever the eager warm-up cached (autocast_weight's casts where the model computes under autocast) lives
    // outside the graph's pool.
    const bool autocast_cache = at::autocast::is_autocast_cache_enabled();
    const auto restore = [&] { at::autocast::set_autocast_cache_enabled(autocast_cache); };
    try {
      c10::cuda::device_synchronize();  // the warm-up done; capture needs a side stream with nothing pending
      const c10::cuda::CUDAStreamGuard stream_guard(c10::cuda::getStreamFromPool(false, device_.index()));
      at::autocast::set_autocast_cache_enabled(false);
      graph->capture_begin(pool_);
      try {
        step();
      } catch (...) {
        try {
          graph->capture_end();  // ends the stream's capture; the graph is discarded
        } catch (const std::exception&) {
        }
        throw;
      }
      graph->capture_end();
    } catch (...) {
      restore();
      throw;
    }
    restore();
    graphs_[shape] = std::move(graph);
  }
  void replay(Shape shape) override { graphs_.at(shape)->replay(); }
  void clear() override { graphs_.clear(); }

 private:
  torch::Device device_;
  decltype(at::cuda::graph_pool_handle()) pool_;  // shared: one step runs at a time, and none keeps a temporary
  std::map<Shape, std::unique_ptr<at::cuda::CUDAGraph>> graphs_;
};
#endif

std::shared_ptr<GraphRecorder> cuda_recorder(torch::Device device) {
#if defined(DAPO_DRIVER_CUDA)
  if (device.is_cuda()) return std::make_shared<CudaGraphRecorder>(device);
#else
  (void)device;
#endif
  return nullptr;
}

}  // namespace

bool DecodeGraphs::compiled() {
#if defined(DAPO_DRIVER_CUDA)
  return true;
#else
  return false;
#endif
}

DecodeGraphs::DecodeGraphs(torch::Device device, bool wanted, std::shared_ptr<GraphRecorder> recorder) {
  if (wanted) recorder_ = recorder ? std::move(recorder) : cuda_recorder(device);
}

bool DecodeGraphs::capture(Shape shape, const std::function<void()>& step) {
  try {
    recorder_->capture(shape, step);
  } catch (const std::exception& error) {
    recorder_.reset();
    std::fprintf(stderr,
                 "engine: capturing the decode step at %lld rows x %lld positions failed: %s; decoding without CUDA "
                 "graphs from here on\n",
                 static_cast<long long>(std::get<0>(shape)), static_cast<long long>(std::get<1>(shape)), error.what());
    return false;
  }
  captured_[shape] = true;
  ++captures_;
  return true;
}

void DecodeGraphs::run(Shape shape, const std::function<void()>& step) {
  if (active()) {
    if (captured_.count(shape) == 0 && eager_runs_[shape]++ > 0) capture(shape, step);
    if (active() && captured_.count(shape) > 0) {
      recorder_->replay(shape);  // right after a capture, which ran nothing, this is the step's work
      ++replays_;
      return;
    }
  }
  step();
}

void DecodeGraphs::clear() {
  if (recorder_) recorder_->clear();
  eager_runs_.clear();
  captured_.clear();
}

}  // namespace qwen
