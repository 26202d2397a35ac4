// Small helpers on std::vector shared by the core tests.
#pragma once

#include <vector>

namespace dapo::test {

// values converted to T (float or double), as the core's span front ends take them.
template <class T>
std::vector<T> as(const std::vector<double>& values) {
  return std::vector<T>(values.begin(), values.end());
}

}  // namespace dapo::test
