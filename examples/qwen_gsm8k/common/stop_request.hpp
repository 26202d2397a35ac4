// Stopping a run at a safe point when its job is preempted: SIGTERM (a scheduler: Slurm, Kubernetes, torchrun) or
// SIGINT (Ctrl-C) only records the request here; the training loop polls it between steps (Trainer::set_stop_request),
// writes a checkpoint and ends with status 128 + signal. Process-wide, like the signals themselves; not a general
// signal library (nothing but SIGTERM and SIGINT, no other handler chained).
#pragma once

#include <string>

namespace qwen {

// What a signal after the first does.
enum class RepeatedSignal {
  kKills,       // a single process: the default action is restored after the first, so the second ends it at once
  kAsksToStop,  // a rank among several, or a launcher: every signal only (re)records the request; the launcher
                // escalates (ours and torchrun's end their ranks with SIGKILL), so that one signal delivered twice
                // (by the terminal to the whole process group, and again by the launcher) cannot kill a rank mid-save
};

// Installs the handlers for SIGTERM and SIGINT. The handlers only store into lock-free atomics (async-signal-safe).
// Calling it again replaces the repeated-signal mode and keeps a request already recorded.
void install_stop_handlers(RepeatedSignal repeated);

// The first signal that asked to stop (SIGTERM or SIGINT), or 0 when none came.
int stop_signal();
// How many stop signals came so far.
int stop_signal_count();

// "SIGTERM", "SIGINT", else "signal N".
std::string signal_name(int signal);

}  // namespace qwen
