// The ops' argument errors as Python's ValueError under every LibTorch: the library throws std::invalid_argument,
// which LibTorch 1.13's op calls left to pybind11 (ValueError) but 2.x's translate as any std::exception
// (RuntimeError). value_errors<&f> is f with std::invalid_argument rethrown as c10::ValueError, the error LibTorch
// itself raises as ValueError; its message is the library's, unchanged.
#pragma once

#include <c10/util/Exception.h>

#include <stdexcept>
#include <utility>

namespace dapo::python {

template <auto Function>
struct ValueErrors;

template <class Result, class... Args, Result (*Function)(Args...)>
struct ValueErrors<Function> {
  static Result call(Args... args) {
    try {
      return Function(std::forward<Args>(args)...);
    } catch (const std::invalid_argument& error) {
      TORCH_CHECK_VALUE(false, error.what());
    }
  }
};

template <auto Function>
constexpr auto value_errors = &ValueErrors<Function>::call;

}  // namespace dapo::python
