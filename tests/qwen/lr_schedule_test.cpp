// qwen::learning_rate: linear warm-up, then constant or cosine decay to a floor; hand-checked values.
#include <doctest/doctest.h>

#include <cmath>

#include "qwen_gsm8k/train/lr_schedule.hpp"

TEST_CASE("learning_rate: linear warm-up over the first updates, then constant") {
  const qwen::LrSchedule schedule{.lr = 2.0, .warmup_updates = 4, .cosine = false, .total_updates = 100};
  CHECK(qwen::learning_rate(schedule, 0) == doctest::Approx(0.5));  // update 1 of 4
  CHECK(qwen::learning_rate(schedule, 1) == doctest::Approx(1.0));
  CHECK(qwen::learning_rate(schedule, 2) == doctest::Approx(1.5));
  CHECK(qwen::learning_rate(schedule, 3) == 2.0);  // the last warm-up update reaches lr exactly
  CHECK(qwen::learning_rate(schedule, 4) == 2.0);
  CHECK(qwen::learning_rate(schedule, 1000) == 2.0);
}

TEST_CASE("learning_rate: no warm-up means lr from the first update") {
  const qwen::LrSchedule schedule{.lr = 3e-4};
  CHECK(qwen::learning_rate(schedule, 0) == 3e-4);
  CHECK(qwen::learning_rate(schedule, 7) == 3e-4);
}

TEST_CASE("learning_rate: cosine from lr after warm-up down to min_lr_ratio * lr at the last update") {
  const qwen::LrSchedule schedule{
      .lr = 1.0, .warmup_updates = 2, .cosine = true, .min_lr_ratio = 0.1, .total_updates = 10};
  CHECK(qwen::learning_rate(schedule, 0) == doctest::Approx(0.5));
  CHECK(qwen::learning_rate(schedule, 1) == doctest::Approx(1.0));  // end of warm-up: cosine progress 0
  // update 6 (0-based 5): progress (6 - 2) / (10 - 2) = 0.5, cos term 0.5 -> 0.1 + 0.9 * 0.5
  CHECK(qwen::learning_rate(schedule, 5) == doctest::Approx(0.55));
  // update 4 (0-based 3): progress 0.25 -> 0.1 + 0.9 * 0.5 * (1 + cos(pi / 4))
  CHECK(qwen::learning_rate(schedule, 3) == doctest::Approx(0.1 + 0.45 * (1.0 + std::sqrt(0.5))));
  CHECK(qwen::learning_rate(schedule, 9) == doctest::Approx(0.1));   // the last update sits on the floor
  CHECK(qwen::learning_rate(schedule, 50) == doctest::Approx(0.1));  // past the end it stays there
  for (int64_t update = 2; update < 10; ++update) {                  // and it only goes down
    CHECK(qwen::learning_rate(schedule, update) < qwen::learning_rate(schedule, update - 1));
  }
}

TEST_CASE("learning_rate: cosine to zero without warm-up (the demo's schedule)") {
  const qwen::LrSchedule schedule{.lr = 6e-4, .cosine = true, .total_updates = 160};
  CHECK(qwen::learning_rate(schedule, 0) == doctest::Approx(6e-4 * 0.5 * (1.0 + std::cos(M_PI / 160.0))));
  CHECK(qwen::learning_rate(schedule, 79) == doctest::Approx(3e-4));
  CHECK(qwen::learning_rate(schedule, 159) == doctest::Approx(0.0));
}
