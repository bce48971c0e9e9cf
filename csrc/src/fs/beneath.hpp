#pragma once

#include <sys/types.h>

#include <string>

#include "io/posix_io.hpp"

namespace kvtier::detail {

/// A step of path resolution that failed: errno, the step ("open", "mkdir", "resolve") and
/// the absolute path of the entry it concerned.
struct PathError {
  int error = 0;
  const char* operation = "";
  std::string path;
  explicit operator bool() const noexcept { return error != 0; }
};

/// The directory every block file must lie below, held open. Paths below it are resolved
/// from this descriptor without following any symbolic link (openat2 with RESOLVE_BENEATH |
/// RESOLVE_NO_SYMLINKS where the kernel has it, else one O_NOFOLLOW openat per component),
/// so a link planted anywhere below the root can neither redirect a store outside it nor
/// feed a load with outside bytes. The root itself may be reached through links: it is the
/// caller's choice and trusted.
class RootDir {
 public:
  RootDir() = default;
  /// Opens `path`, creating missing directories with exactly `directory_mode` when `create`.
  /// Throws SystemError (with errno and the path) when that fails.
  RootDir(const std::string& path, bool create, mode_t directory_mode);

  const std::string& path() const noexcept { return path_; }
  int fd() const noexcept { return fd_.get(); }

  /// Splits `path` (which must name an entry below the root, without ".." components) into
  /// its directory relative to the root ("" for the root itself) and its final name.
  /// Returns 0, or EPERM for a path that is not below the root.
  int split(const std::string& path, std::string& directory, std::string& name) const;

  /// Opens `directory` (relative, from split()) without following links. With `create`,
  /// missing directories are made with exactly `mode` (whatever the umask). A link on the way
  /// is ELOOP; a non-directory is ENOTDIR.
  PathError open_directory(const std::string& directory, bool create, mode_t mode,
                           FileDescriptor& out) const;

  /// Opens the file `name` in `directory` (from split()) with `flags` in one openat2 system
  /// call, never through a link. Returns 0, or an errno value: ENOSYS where openat2 is not
  /// used (the caller then opens the directory first), ELOOP for a link anywhere on the way,
  /// EAGAIN when a concurrent rename made the kernel give up. Reports nothing else about
  /// which component failed: callers re-resolve step by step for a precise error.
  int open_file(const std::string& directory, const std::string& name, int flags,
                FileDescriptor& out) const;

  /// The absolute form of a relative `directory` (and optional `name`), for messages.
  std::string absolute(const std::string& directory, const std::string& name = {}) const;

 private:
  // open_directory() component by component (no openat2, or missing directories to make).
  PathError walk_directory(const std::string& directory, bool create, mode_t mode,
                           FileDescriptor& out) const;

  std::string path_;
  FileDescriptor fd_;
};

/// Lets tests exercise the per-component fallback on kernels that have openat2.
void set_openat2_enabled(bool enabled) noexcept;

/// What a non-regular entry is, for messages ("a directory", "a FIFO", ...).
const char* file_kind(mode_t mode) noexcept;

/// The errno reported for a block path holding something other than a regular file:
/// EISDIR for a directory, ELOOP for a link, EINVAL for FIFOs, sockets and devices.
int not_regular_error(mode_t mode) noexcept;

}  // namespace kvtier::detail
