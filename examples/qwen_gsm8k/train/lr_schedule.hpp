// The learning rate of each optimizer update: linear warm-up, then constant or cosine decay to a floor (verl's
// actor.optim lr_warmup_steps, lr_scheduler_type, min_lr_ratio). Counted in optimizer updates, not training steps.
#pragma once

#include <cstdint>

namespace qwen {

struct LrSchedule {
  double lr = 1e-6;            // the peak rate
  int64_t warmup_updates = 0;  // updates 1..warmup_updates ramp linearly up to lr
  bool cosine = false;         // after warm-up: cosine decay to min_lr_ratio * lr at total_updates; else constant
  double min_lr_ratio = 0.0;
  int64_t total_updates = 0;  // the run's updates (steps * updates per step); the cosine ends here
};

// The rate of update `update` (0-based). Past total_updates the cosine stays at its floor.
double learning_rate(const LrSchedule& schedule, int64_t update);

}  // namespace qwen
