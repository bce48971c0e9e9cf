#pragma once

#include <stdexcept>
#include <string>
#include <system_error>

#include <kvtier/export.hpp>
#include <kvtier/version.hpp>

/// "file:line" of the place this macro is expanded, as one string literal (no cost at run
/// time). The build maps the source directory away (-fmacro-prefix-map), so inside kvtier it
/// reads "csrc/src/fs/beneath.cpp:90".
#define KVTIER_SOURCE_LOCATION __FILE__ ":" KVTIER_STRINGIFY_LINE_(__LINE__)
#define KVTIER_STRINGIFY_LINE_(line) KVTIER_STRINGIFY_(line)
#define KVTIER_STRINGIFY_(text) #text

/// A SystemError that records where it was made: `throw KVTIER_SYSTEM_ERROR(errno, "what",
/// path);`. The same works for the subclasses: KVTIER_ERROR_AT(IoUringRefusedError, ...).
#define KVTIER_SYSTEM_ERROR(errno_value, what, path) \
  ::kvtier::SystemError((errno_value), (what), (path), KVTIER_SOURCE_LOCATION)
#define KVTIER_ERROR_AT(type, ...) type(__VA_ARGS__, KVTIER_SOURCE_LOCATION)

namespace kvtier {
inline namespace KVTIER_ABI_NAMESPACE {

/// A failed system call: carries errno (code().value()), the path it concerned (empty when
/// none) and the place in kvtier's sources that threw it (where(): "file:line", empty when
/// the thrower did not say). what() is the message followed by ": " and strerror(errno).
class KVTIER_EXPORT SystemError : public std::system_error {
 public:
  SystemError(int errno_value, const std::string& what, std::string path, std::string where = {})
      : std::system_error(errno_value, std::generic_category(), what),
        path_(std::move(path)),
        where_(std::move(where)) {}
  ~SystemError() override;
  SystemError(const SystemError&) = default;
  SystemError& operator=(const SystemError&) = default;

  const std::string& path() const noexcept { return path_; }
  /// "file:line" of the throw site inside kvtier, or empty.
  const std::string& where() const noexcept { return where_; }

 private:
  std::string path_;
  std::string where_;
};

/// The Engine constructor refused IoEngine::kIoUring because the kernel refuses io_uring to
/// this process: errno is the kernel's answer (EPERM: sysctl kernel.io_uring_disabled or a
/// seccomp filter; ENOSYS: a kernel without io_uring; EOPNOTSUPP: an opcode the block
/// operations need is missing), path() the root directory. IoEngine::kAuto would have used
/// psync instead. Callers that need no distinction catch SystemError.
class KVTIER_EXPORT IoUringRefusedError : public SystemError {
 public:
  using SystemError::SystemError;
  ~IoUringRefusedError() override;
  IoUringRefusedError(const IoUringRefusedError&) = default;
  IoUringRefusedError& operator=(const IoUringRefusedError&) = default;
};

/// A job was submitted to an Engine after shutdown() began. Nothing was queued.
class KVTIER_EXPORT EngineShutDownError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  ~EngineShutDownError() override;
  EngineShutDownError(const EngineShutDownError&) = default;
  EngineShutDownError& operator=(const EngineShutDownError&) = default;
};

/// An Engine was used in a process forked from the one that created it: its worker threads
/// do not exist there (see Engine). Create a new engine in the child, or start children with
/// spawn/exec.
class KVTIER_EXPORT ForkedProcessError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  ~ForkedProcessError() override;
  ForkedProcessError(const ForkedProcessError&) = default;
  ForkedProcessError& operator=(const ForkedProcessError&) = default;
};

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
