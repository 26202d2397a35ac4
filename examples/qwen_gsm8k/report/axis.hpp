// Chart axes (internal to report/): a data range widened to "nice" ticks (1, 2 or 5 times a power of ten) and their
// labels.
#pragma once

#include <string>
#include <vector>

namespace qwen::detail {

struct Axis {
  double low = 0.0, high = 1.0;  // the drawn range: the data's range widened to whole ticks
  double step = 0.0;             // between ticks; 0 when the range is too wide to subdivide
  std::vector<double> ticks;
  std::vector<std::string> labels;  // one per tick

  // Where `value` lies along the axis, 0 at `low` and 1 at `high`. Halved first so that a range near the largest
  // double does not overflow.
  double fraction(double value) const { return (value / 2 - low / 2) / (high / 2 - low / 2); }
};

// Ticks covering [minimum, maximum] (minimum > maximum: no data), about `target_ticks` of them. `integral`: the
// values are whole numbers (steps), so ticks are too. One value gets a range around it.
Axis make_axis(double minimum, double maximum, int target_ticks, bool integral);

}  // namespace qwen::detail
