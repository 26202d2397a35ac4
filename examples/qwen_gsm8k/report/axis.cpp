// Nice ticks for the report's charts: steps of 1, 2 or 5 times a power of ten, never finer than doubles can tell apart.
#include "qwen_gsm8k/report/axis.hpp"

#include <algorithm>
#include <cmath>

#include "qwen_gsm8k/report/markup.hpp"

namespace qwen::detail {
namespace {

// The smallest 1, 2 or 5 times a power of ten that is at least `value` (> 0).
double nice_step(double value) {
  const double power = std::pow(10.0, std::floor(std::log10(value)));
  const double mantissa = value / power;
  const double nice = mantissa <= 1.0 ? 1.0 : mantissa <= 2.0 ? 2.0 : mantissa <= 5.0 ? 5.0 : 10.0;
  return nice * power;
}

// Tick labels `step` apart: as many decimals as the step needs, or exponent notation for tiny steps and huge values.
std::string tick_label(double value, double step, double largest_magnitude) {
  if (step == 0.0) return print_number("%.*g", 3, value);
  if (std::abs(value) < step * 1e-6) value = 0.0;  // rounding residue and -0
  const int step_exponent = static_cast<int>(std::floor(std::log10(step)));
  if (largest_magnitude >= 1e6 || step_exponent < -4) {
    const int magnitude =
        largest_magnitude > 0.0 ? static_cast<int>(std::floor(std::log10(largest_magnitude))) : step_exponent;
    return print_number("%.*g", std::clamp(magnitude - step_exponent + 1, 1, 15), value);
  }
  return print_number("%.*f", std::max(0, -step_exponent), value);
}

}  // namespace

Axis make_axis(double minimum, double maximum, int target_ticks, bool integral) {
  if (minimum > maximum) minimum = 0.0, maximum = 1.0;
  if (minimum == maximum) {  // one value: a range around it, so the point sits in the middle
    const double pad = integral ? 1.0 : minimum == 0.0 ? 1.0 : std::abs(minimum) * 0.1;
    minimum -= pad, maximum += pad;
  }
  Axis axis;
  const double largest_magnitude = std::max(std::abs(minimum), std::abs(maximum));
  const double span = maximum - minimum;
  if (!std::isfinite(span)) {  // beyond subdividing in doubles: just the two ends
    axis.low = minimum, axis.high = maximum;
    axis.ticks = {minimum, maximum};
  } else {
    // Never finer than the doubles can tell apart, so that tick labels stay distinct.
    double step = std::max(nice_step(span / (target_ticks - 1)), nice_step(largest_magnitude * 1e-12));
    if (integral) step = std::max(step, 1.0);
    axis.step = step;
    axis.low = std::floor(minimum / step) * step;
    axis.high = std::ceil(maximum / step) * step;
    const long count = std::lround((axis.high - axis.low) / step);
    for (long i = 0; i <= count; ++i) axis.ticks.push_back(axis.low + static_cast<double>(i) * step);
  }
  for (const double tick : axis.ticks) axis.labels.push_back(tick_label(tick, axis.step, largest_magnitude));
  return axis;
}

}  // namespace qwen::detail
