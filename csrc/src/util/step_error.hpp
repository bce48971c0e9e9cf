#pragma once

#include <string>
#include <utility>

namespace kvtier::detail {

/// A step of a block operation that failed: an errno-style code, the step's name ("pwrite",
/// "cudaMemcpyAsync", ...) and optional detail beyond strerror. False when nothing failed.
struct StepError {
  StepError() = default;
  StepError(int error_value, const char* op, std::string detail = {})
      : error(error_value), operation(op), message(std::move(detail)) {}
  explicit operator bool() const noexcept { return error != 0; }

  int error = 0;
  const char* operation = "";
  std::string message;
};

}  // namespace kvtier::detail
