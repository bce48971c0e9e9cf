#pragma once

#include <string>
#include <system_error>

namespace kvtier {

/// A failed system call: carries errno (code().value()) and the path it concerned.
class SystemError : public std::system_error {
 public:
  SystemError(int errno_value, const std::string& what, std::string path)
      : std::system_error(errno_value, std::generic_category(), what), path_(std::move(path)) {}
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

}  // namespace kvtier
