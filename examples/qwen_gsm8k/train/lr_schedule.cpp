// The learning-rate schedule. The arithmetic is kept as it was in the trainer, so runs repeat bit for bit.
#include "qwen_gsm8k/train/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

namespace qwen {

double learning_rate(const LrSchedule& schedule, int64_t update) {
  const double position = static_cast<double>(update + 1);
  const auto warmup = static_cast<double>(schedule.warmup_updates);
  if (position <= warmup) return schedule.lr * position / warmup;
  if (!schedule.cosine) return schedule.lr;
  const auto total = static_cast<double>(schedule.total_updates);
  const double progress = std::clamp((position - warmup) / std::max(total - warmup, 1.0), 0.0, 1.0);
  const double cosine = 0.5 * (1.0 + std::cos(3.14159265358979323846 * progress));
  return schedule.lr * (schedule.min_lr_ratio + (1.0 - schedule.min_lr_ratio) * cosine);
}

}  // namespace qwen
