#pragma once

#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstddef>
#include <string>
#include <vector>

namespace kvtier::detail {

/// Owns a file descriptor; closes it on destruction.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  ~FileDescriptor() { reset(); }
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.release()) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  int release() noexcept {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  /// Closes now and reports the close error (NFS reports deferred write errors here).
  /// Returns 0 or an errno value.
  int close_checked() noexcept;

 private:
  int fd_ = -1;
};

/// Writes every byte of `iov` at `offset`, retrying on EINTR and short writes; any number of
/// entries (IOV_MAX per system call).
/// Returns 0 or an errno value (EIO if the kernel accepts no bytes).
int pwritev_full(int fd, std::vector<iovec> iov, off_t offset) noexcept;

/// Reads into `iov` (any number of entries, IOV_MAX per system call) at `offset` until it is
/// full or the file ends, retrying on EINTR and short reads. Sets `bytes_read`. Returns 0
/// (also at end of file) or an errno value.
int preadv_full(int fd, std::vector<iovec> iov, off_t offset, std::size_t& bytes_read) noexcept;

/// Creates every missing directory of `dir` with exactly `mode` (whatever the umask).
/// Returns 0 or an errno value.
int make_directories(const std::string& dir, mode_t mode) noexcept;

}  // namespace kvtier::detail
