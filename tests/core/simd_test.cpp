// The SIMD arithmetic policies: the vector exp is accurate where the kernels use it, and NaN survives it.
#include <dapo/core/simd.hpp>

#include <cmath>
#include <limits>

#include <doctest/doctest.h>

#if defined(DAPO_HAVE_FLOAT_VECTOR)
TEST_CASE("FloatVector<4>::exp is within 2e-7 relative of exp on [-87, 88] and keeps NaN") {
  using Vector = dapo::simd::FloatVector<4>;
  double worst = 0.0;
  for (double x = -87.0; x <= 88.0; x += 0.00731) {
    const float lanes[4] = {static_cast<float>(x), static_cast<float>(-x / 4), 0.0f, static_cast<float>(x / 9)};
    const auto result = Vector::exp(Vector::load(lanes));
    for (int i = 0; i < 4; ++i) {
      const double exact = std::exp(static_cast<double>(lanes[i]));
      worst = std::max(worst, std::abs(result[i] - exact) / exact);
    }
  }
  CHECK(worst < 2e-7);
  const float nan_lanes[4] = {std::numeric_limits<float>::quiet_NaN(), 1.0f, -20.0f, 20.0f};
  const auto result = Vector::exp(Vector::load(nan_lanes));
  CHECK(std::isnan(result[0]));
  CHECK(result[1] == doctest::Approx(std::exp(1.0)).epsilon(1e-6));
}

TEST_CASE("FloatVector loads widen bool masks and partial loads fill with zero") {
  using Vector = dapo::simd::FloatVector<8>;
  const bool mask[8] = {true, false, true, true, false, false, true, false};
  const auto loaded = Vector::load(mask);
  for (int i = 0; i < 8; ++i) CHECK(loaded[i] == (mask[i] ? 1.0f : 0.0f));
  const float values[3] = {1.5f, -2.0f, 3.0f};
  const auto partial = Vector::load_partial(values, 3);
  CHECK(partial[2] == 3.0f);
  CHECK(partial[3] == 0.0f);
  CHECK(Vector::sum(partial) == doctest::Approx(2.5));
}
#endif
