// LibTorch's profiler (Kineto) driven from C++, and what ran inside a named scope (RECORD_USER_SCOPE): on a GPU, the
// device's kernels, copies and memsets, each attributed to the scope instance whose host time holds the runtime call
// that launched it (the two share a correlation id; a CUDA graph's kernels share their graph launch's); on the CPU,
// the operators the scope dispatched. Where the GPU's time goes, and how long it waits for the host, in numbers small
// enough to come back from a GPU lent for minutes.
//
// The profiler's C++ API moved between LibTorch versions: 1.13's events carry microseconds (startUs, durationUs),
// 2.1 and later's nanoseconds (startNs, durationNs). Everything else used here is the same in both.
#pragma once

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/version.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "support/harness.hpp"

namespace dapo::bench {

struct ProfiledEvent {
  std::string name;
  bool on_device = false;  // a kernel, copy or memset the GPU ran; else a host event (operator, scope, runtime call)
  uint64_t correlation = 0;
  int64_t start_ns = 0, end_ns = 0;
};

// Records from construction to stop(): the host's operators and scopes and, with `cuda`, the GPU's activities and
// the runtime calls that launched them. One profiler at a time per thread; the destructor stops an unstopped one.
class KernelProfiler {
 public:
  explicit KernelProfiler(bool cuda) {
    namespace impl = torch::profiler::impl;
    const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
    std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
    if (cuda) activities.insert(impl::ActivityType::CUDA);
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    active_ = true;
  }
  KernelProfiler(const KernelProfiler&) = delete;
  KernelProfiler& operator=(const KernelProfiler&) = delete;
  ~KernelProfiler() {
    if (active_) torch::autograd::profiler::disableProfiler();
  }

  std::vector<ProfiledEvent> stop() {
    active_ = false;
    const std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
        torch::autograd::profiler::disableProfiler();
    std::vector<ProfiledEvent> events;
    for (const auto& event : result->events()) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
      const auto start = static_cast<int64_t>(event.startNs()), duration = static_cast<int64_t>(event.durationNs());
#else
      const auto start = static_cast<int64_t>(event.startUs()) * 1000;
      const auto duration = static_cast<int64_t>(event.durationUs()) * 1000;
#endif
      events.push_back({.name = event.name(),
                        .on_device = event.deviceType() != c10::DeviceType::CPU,
                        .correlation = event.correlationId(),
                        .start_ns = start,
                        .end_ns = start + duration});
    }
    return events;
  }

 private:
  bool active_ = false;
};

// What ran in each instance of one scope, summed over the instances.
struct ScopeProfile {
  struct Total {
    std::string name;
    int64_t calls = 0;
    double ms = 0;
  };
  std::string scope;
  int64_t instances = 0;
  // The GPU (zero where nothing ran on one): kernels (copies and memsets included) and their summed time per
  // instance, medians over the instances; the window from the first instance's start to the end of the last of its
  // device work, the time the GPU was busy in that window (any device work, its overlaps counted once), and that
  // window per instance.
  double kernels_per_instance = 0, device_ms_per_instance = 0;
  double window_ms = 0, device_busy_ms = 0, wall_ms_per_instance = 0;
  // The host: operators dispatched inside an instance (nested calls included) and those at its top level, medians.
  double operators_per_instance = 0, top_level_operators_per_instance = 0;
  // The names that took the most time: kernels by device time where there are any, else top-level operators by host
  // time.
  std::vector<Total> top;

  double busy_fraction() const { return window_ms > 0 ? device_busy_ms / window_ms : 0.0; }
  nlohmann::json to_json() const;
};

namespace detail {

// Host events that are runtime or driver calls (cudaLaunchKernel, cudaGraphLaunch, cuLaunchKernel, ...), whose
// correlation id names the device work they started.
inline bool is_runtime_call(const ProfiledEvent& event) {
  return !event.on_device && event.correlation != 0 && event.name.rfind("cu", 0) == 0;
}

// The time the intervals cover together, overlaps once.
inline int64_t union_ns(std::vector<std::pair<int64_t, int64_t>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  int64_t covered = 0, open_start = 0, open_end = -1;
  for (const auto& [start, end] : intervals) {
    if (start > open_end) {
      if (open_end >= open_start) covered += open_end - open_start;
      open_start = start;
      open_end = end;
    } else {
      open_end = std::max(open_end, end);
    }
  }
  if (open_end >= open_start) covered += open_end - open_start;
  return covered;
}

}  // namespace detail

inline nlohmann::json ScopeProfile::to_json() const {
  nlohmann::json top_json = nlohmann::json::array();
  for (const Total& total : top) {
    top_json.push_back({{"name", total.name},
                        {"calls_per_instance", instances > 0 ? static_cast<double>(total.calls) / instances : 0.0},
                        {"ms_per_instance", instances > 0 ? total.ms / static_cast<double>(instances) : 0.0}});
  }
  return {{"scope", scope},
          {"instances", instances},
          {"kernels_per_instance", kernels_per_instance},
          {"device_ms_per_instance", device_ms_per_instance},
          {"window_ms", window_ms},
          {"device_busy_ms", device_busy_ms},
          {"busy_fraction", busy_fraction()},
          {"wall_ms_per_instance", wall_ms_per_instance},
          {"operators_per_instance", operators_per_instance},
          {"top_level_operators_per_instance", top_level_operators_per_instance},
          {"top", top_json}};
}

// The profile of every instance of `scope` among `events`; `top` names at most.
inline ScopeProfile profile_scope(const std::vector<ProfiledEvent>& events, const std::string& scope,
                                  std::size_t top = 15) {
  ScopeProfile profile;
  profile.scope = scope;
  std::vector<std::pair<int64_t, int64_t>> instances;  // host [start, end], in time order
  for (const auto& event : events) {
    if (!event.on_device && event.name == scope) instances.emplace_back(event.start_ns, event.end_ns);
  }
  std::sort(instances.begin(), instances.end());
  profile.instances = static_cast<int64_t>(instances.size());
  if (instances.empty()) return profile;
  const auto instance_of = [&instances](int64_t host_time) -> int64_t {  // the instance whose host time holds it
    auto after = std::upper_bound(instances.begin(), instances.end(), std::make_pair(host_time, INT64_MAX));
    if (after == instances.begin()) return -1;
    --after;
    return host_time <= after->second ? after - instances.begin() : -1;
  };
  const std::size_t count = instances.size();

  // The device: each activity to the instance that launched it.
  std::unordered_map<uint64_t, int64_t> launched_in;  // correlation id -> instance
  for (const auto& event : events) {
    if (detail::is_runtime_call(event)) {
      const int64_t instance = instance_of(event.start_ns);
      if (instance >= 0) launched_in[event.correlation] = instance;
    }
  }
  std::vector<double> kernels(count, 0.0), device_ns(count, 0.0);
  std::map<std::string, ScopeProfile::Total> device_totals;
  int64_t window_end = instances.back().second;
  for (const auto& event : events) {
    if (!event.on_device) continue;
    const auto found = launched_in.find(event.correlation);
    if (found == launched_in.end()) continue;
    const auto instance = static_cast<std::size_t>(found->second);
    kernels[instance] += 1;
    device_ns[instance] += static_cast<double>(event.end_ns - event.start_ns);
    ScopeProfile::Total& total = device_totals[event.name];
    total.name = event.name;
    total.calls += 1;
    total.ms += static_cast<double>(event.end_ns - event.start_ns) / 1e6;
    window_end = std::max(window_end, event.end_ns);
  }
  const int64_t window_start = instances.front().first;
  std::vector<std::pair<int64_t, int64_t>> busy;
  for (const auto& event : events) {
    if (event.on_device && event.end_ns > window_start && event.start_ns < window_end) {
      busy.emplace_back(std::max(event.start_ns, window_start), std::min(event.end_ns, window_end));
    }
  }
  profile.kernels_per_instance = median(kernels);
  std::vector<double> device_ms;
  for (const double ns : device_ns) device_ms.push_back(ns / 1e6);
  profile.device_ms_per_instance = median(device_ms);
  profile.window_ms = static_cast<double>(window_end - window_start) / 1e6;
  profile.device_busy_ms = static_cast<double>(detail::union_ns(busy)) / 1e6;
  profile.wall_ms_per_instance = profile.window_ms / static_cast<double>(count);

  // The host: operators inside each instance; top level = not inside another operator of that instance.
  std::vector<std::vector<const ProfiledEvent*>> operators(count);
  for (const auto& event : events) {
    if (event.on_device || detail::is_runtime_call(event) || event.name == scope || event.name.rfind("__", 0) == 0) {
      continue;
    }
    const int64_t instance = instance_of(event.start_ns);
    if (instance >= 0 && event.end_ns <= instances[static_cast<std::size_t>(instance)].second) {
      operators[static_cast<std::size_t>(instance)].push_back(&event);
    }
  }
  std::vector<double> all_counts, top_counts;
  std::map<std::string, ScopeProfile::Total> host_totals;
  for (auto& inside : operators) {
    std::sort(inside.begin(), inside.end(), [](const ProfiledEvent* a, const ProfiledEvent* b) {
      return a->start_ns != b->start_ns ? a->start_ns < b->start_ns : a->end_ns > b->end_ns;
    });
    int64_t open_end = INT64_MIN, top_level = 0;
    for (const ProfiledEvent* event : inside) {
      if (event->start_ns < open_end) continue;
      open_end = event->end_ns;
      ++top_level;
      ScopeProfile::Total& total = host_totals[event->name];
      total.name = event->name;
      total.calls += 1;
      total.ms += static_cast<double>(event->end_ns - event->start_ns) / 1e6;
    }
    all_counts.push_back(static_cast<double>(inside.size()));
    top_counts.push_back(static_cast<double>(top_level));
  }
  profile.operators_per_instance = median(all_counts);
  profile.top_level_operators_per_instance = median(top_counts);

  const auto& totals = device_totals.empty() ? host_totals : device_totals;
  for (const auto& [name, total] : totals) profile.top.push_back(total);
  std::sort(profile.top.begin(), profile.top.end(), [](const auto& a, const auto& b) { return a.ms > b.ms; });
  if (profile.top.size() > top) profile.top.resize(top);
  return profile;
}

}  // namespace dapo::bench
