// Benchmark harness: wall-clock timing (best of repeats after warm-up), the machine's description, a printed table
// and a JSON record. Benchmarks check their result against the reference before they time anything.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/version.h>

#include <dlfcn.h>
#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace dapo::bench {

// Best (minimum) seconds of `repeats` runs after `warmup` runs; the minimum is the least noisy estimate of the cost.
inline double best_seconds(const std::function<void()>& run, int repeats, int warmup = 1) {
  for (int i = 0; i < warmup; ++i) run();
  double best = 1e300;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// The median of `values` (the upper one of an even count); robust against a run that a neighbour slowed down.
inline double median(std::vector<double> values) {
  if (values.empty()) throw std::invalid_argument("median: no values");
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

// The malloc the benchmark runs with: "tcmalloc" when gperftools' tcmalloc is linked in (CMake's DAPO_ALLOCATOR, the
// default) or preloaded, else "system" (glibc's).
inline std::string allocator() {
  return ::dlsym(RTLD_DEFAULT, "tc_malloc") != nullptr ? "tcmalloc" : "system";
}

// What the process has used so far (getrusage): CPU seconds in user and kernel mode and page faults. Differences of
// two snapshots show what a phase cost besides arithmetic: with an allocator that gives memory back to the kernel,
// every large tensor is faulted in again, page by page (system time).
struct Usage {
  double user_seconds = 0, system_seconds = 0;
  double minor_faults = 0, major_faults = 0;

  static Usage now() {
    rusage usage{};
    ::getrusage(RUSAGE_SELF, &usage);
    const auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * t.tv_usec; };
    return {seconds(usage.ru_utime), seconds(usage.ru_stime), static_cast<double>(usage.ru_minflt),
            static_cast<double>(usage.ru_majflt)};
  }
  Usage operator-(const Usage& before) const {
    return {user_seconds - before.user_seconds, system_seconds - before.system_seconds,
            minor_faults - before.minor_faults, major_faults - before.major_faults};
  }
  Usage per(double count) const {
    return {user_seconds / count, system_seconds / count, minor_faults / count, major_faults / count};
  }
  nlohmann::json to_json() const {
    return {{"user_seconds", user_seconds},
            {"system_seconds", system_seconds},
            {"page_faults", minor_faults + major_faults},
            {"major_page_faults", major_faults}};
  }
};

inline nlohmann::json machine() {
  return {{"cpu", cpu_model()},
          {"allocator", allocator()},
          {"hardware_threads", std::thread::hardware_concurrency()},
          {"torch_threads", at::get_num_threads()},
          {"libtorch", std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                           std::to_string(TORCH_VERSION_PATCH)}};
}

// Throws when a benchmark's result disagrees with its reference: a fast wrong answer is not a result.
inline void require_close(double actual, double expected, double relative, const std::string& what) {
  if (!(std::abs(actual - expected) <= relative * std::max(1.0, std::abs(expected)))) {
    throw std::runtime_error(what + ": " + std::to_string(actual) + " vs reference " + std::to_string(expected));
  }
}

inline void require_close(const at::Tensor& actual, const at::Tensor& expected, double relative,
                          const std::string& what) {
  const double error = (actual.to(at::kDouble) - expected.to(at::kDouble)).norm().item<double>();
  const double scale = std::max(expected.to(at::kDouble).norm().item<double>(), 1e-30);
  if (!(error <= relative * scale)) {
    throw std::runtime_error(what + ": relative L2 error " + std::to_string(error / scale) + " > " +
                             std::to_string(relative));
  }
}

inline void write_json(const nlohmann::json& record, const std::string& path) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << record.dump(2) << "\n";
}

// A benchmark's main after its set-up: `parse` reads the flags (nullopt: --help was printed) and checks them before
// any work, then `run` does the work. Errors go to stderr after the program's name: exit 2 for bad flags, 1 for a
// failure of the work.
template <class Args>
int run_main(const char* program, const std::function<std::optional<Args>()>& parse,
             const std::function<void(const Args&)>& run) {
  std::optional<Args> args;
  try {
    args = parse();
    if (!args) return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s\n", program, error.what());
    return 2;
  }
  try {
    run(*args);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s\n", program, error.what());
    return 1;
  }
  return 0;
}

}  // namespace dapo::bench
