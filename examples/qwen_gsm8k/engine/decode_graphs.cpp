// Capture and replay through ATen's CUDAGraph (the API is the same in LibTorch 2.6 and 2.15 for what is used here).
#include "qwen_gsm8k/engine/decode_graphs.hpp"

#if defined(DAPO_DRIVER_CUDA)
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdio>
#include <exception>
#include <map>
#endif

namespace qwen {

#if defined(DAPO_DRIVER_CUDA)
struct DecodeGraphs::Graphs {
  explicit Graphs(torch::Device where) : device(where), pool(at::cuda::graph_pool_handle()) {}
  torch::Device device;
  decltype(at::cuda::graph_pool_handle()) pool;  // shared: one step runs at a time, and none keeps a temporary
  std::map<Shape, int64_t> eager_runs;
  std::map<Shape, std::unique_ptr<at::cuda::CUDAGraph>> captured;
};

bool DecodeGraphs::compiled() {
  return true;
}

DecodeGraphs::DecodeGraphs(torch::Device device, bool wanted) {
  if (wanted && device.is_cuda()) {
    graphs_ = std::make_unique<Graphs>(device);
    active_ = true;
  }
}

bool DecodeGraphs::capture(Shape shape, const std::function<void()>& step) {
  const c10::cuda::CUDAGuard device_guard(graphs_->device);
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  // Autocast's own cache off while capturing: a cast it cached would be read by the graph after autocast drops it.
  // The weights' casts (autocast_weight) were made by the eager warm-up, outside the graph's pool.
  const bool autocast_cache = at::autocast::is_autocast_cache_enabled();
  try {
    c10::cuda::device_synchronize();  // the warm-up done; capture needs a side stream with nothing pending
    const c10::cuda::CUDAStreamGuard stream_guard(c10::cuda::getStreamFromPool(false, graphs_->device.index()));
    at::autocast::set_autocast_cache_enabled(false);
    graph->capture_begin(graphs_->pool);
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
  } catch (const std::exception& error) {
    at::autocast::set_autocast_cache_enabled(autocast_cache);
    active_ = false;
    std::fprintf(stderr,
                 "engine: capturing the decode step at %lld rows x %lld positions failed: %s; decoding without CUDA "
                 "graphs from here on\n",
                 static_cast<long long>(shape.first), static_cast<long long>(shape.second), error.what());
    return false;
  }
  at::autocast::set_autocast_cache_enabled(autocast_cache);
  graphs_->captured.emplace(shape, std::move(graph));
  ++captures_;
  return true;
}

void DecodeGraphs::run(Shape shape, const std::function<void()>& step) {
  if (active_) {
    const auto found = graphs_->captured.find(shape);
    if (found != graphs_->captured.end()) {
      found->second->replay();
      ++replays_;
      return;
    }
    if (graphs_->eager_runs[shape]++ > 0 && capture(shape, step)) {
      graphs_->captured.at(shape)->replay();  // capturing ran nothing: this step's work is the first replay
      ++replays_;
      return;
    }
  }
  step();
}
#else
struct DecodeGraphs::Graphs {};

bool DecodeGraphs::compiled() {
  return false;
}

DecodeGraphs::DecodeGraphs(torch::Device /*device*/, bool /*wanted*/) {}

bool DecodeGraphs::capture(Shape /*shape*/, const std::function<void()>& /*step*/) {
  return false;
}

void DecodeGraphs::run(Shape /*shape*/, const std::function<void()>& step) {
  step();
}
#endif

DecodeGraphs::~DecodeGraphs() = default;

}  // namespace qwen
