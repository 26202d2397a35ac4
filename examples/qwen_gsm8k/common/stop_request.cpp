// The SIGTERM / SIGINT handlers: an atomic store, and (single process) the default action put back.
#include "qwen_gsm8k/common/stop_request.hpp"

#include <signal.h>

#include <atomic>

namespace qwen {
namespace {

// Lock-free atomics are the only shared state a handler may touch besides volatile sig_atomic_t.
std::atomic<int> first_signal{0};
std::atomic<int> signal_count{0};
std::atomic<bool> repeated_kills{true};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free);

constexpr int kStopSignals[] = {SIGTERM, SIGINT};

void on_stop_signal(int number) {
  int none = 0;
  first_signal.compare_exchange_strong(none, number);
  const int earlier = signal_count.fetch_add(1);
  if (repeated_kills.load()) {
    // After SIGTERM a Ctrl-C must kill too (and the reverse): both go back to their default action. sigaction is
    // async-signal-safe.
    struct sigaction fallback {};
    fallback.sa_handler = SIG_DFL;
    sigemptyset(&fallback.sa_mask);
    for (const int stop : kStopSignals) ::sigaction(stop, &fallback, nullptr);
    // The handler's mask is per thread: two signals that come together can run this handler on two threads before
    // either put the default back. The second one kills all the same: raised again in this thread, it stays blocked
    // until the handler returns, then takes the default action.
    if (earlier > 0) ::raise(number);
  }
}

}  // namespace

void install_stop_handlers(RepeatedSignal repeated) {
  repeated_kills.store(repeated == RepeatedSignal::kKills);
  // A single process that was already asked to stop keeps the default action: its next signal must kill.
  if (repeated == RepeatedSignal::kKills && first_signal.load() != 0) return;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  for (const int stop : kStopSignals) sigaddset(&action.sa_mask, stop);  // the two never interleave in the handler
  action.sa_flags = SA_RESTART;  // a read or write under way when the signal comes goes on: the step finishes
  for (const int stop : kStopSignals) ::sigaction(stop, &action, nullptr);
}

int stop_signal() {
  return first_signal.load();
}

int stop_signal_count() {
  return signal_count.load();
}

std::string signal_name(int signal) {
  if (signal == SIGTERM) return "SIGTERM";
  if (signal == SIGINT) return "SIGINT";
  return "signal " + std::to_string(signal);
}

}  // namespace qwen
