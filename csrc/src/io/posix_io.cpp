#include "io/posix_io.hpp"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <new>

namespace kvtier::detail {
namespace {

// Drops `n` consumed bytes from the front of an iovec list.
void advance(std::vector<iovec>& iov, std::size_t& first, std::size_t n) noexcept {
  while (n > 0 && first < iov.size()) {
    if (n >= iov[first].iov_len) {
      n -= iov[first].iov_len;
      ++first;
    } else {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + n;
      iov[first].iov_len -= n;
      n = 0;
    }
  }
}

}  // namespace

int FileDescriptor::close_checked() noexcept {
  if (fd_ < 0) return 0;
  int fd = release();
  // Never retry close() on EINTR: on Linux the descriptor is already gone.
  return ::close(fd) == 0 || errno == EINTR ? 0 : errno;
}

int pwritev_full(int fd, std::vector<iovec> iov, off_t offset) noexcept {
  std::size_t first = 0;
  while (first < iov.size()) {
    const int count = static_cast<int>(std::min<std::size_t>(iov.size() - first, IOV_MAX));
    ssize_t n = ::pwritev(fd, iov.data() + first, count, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    offset += n;
    advance(iov, first, static_cast<std::size_t>(n));
    while (first < iov.size() && iov[first].iov_len == 0) ++first;
  }
  return 0;
}

int preadv_full(int fd, std::vector<iovec> iov, off_t offset, std::size_t& bytes_read) noexcept {
  bytes_read = 0;
  std::size_t first = 0;
  while (first < iov.size()) {
    const int count = static_cast<int>(std::min<std::size_t>(iov.size() - first, IOV_MAX));
    ssize_t n = ::preadv(fd, iov.data() + first, count, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return 0;  // end of file: the caller compares bytes_read
    offset += n;
    bytes_read += static_cast<std::size_t>(n);
    advance(iov, first, static_cast<std::size_t>(n));
    while (first < iov.size() && iov[first].iov_len == 0) ++first;
  }
  return 0;
}

int make_directories(const std::string& dir, mode_t mode) noexcept {
  if (dir.empty()) return 0;
  std::string prefix;
  try {
    prefix.reserve(dir.size());  // every assign below fits: nothing else allocates
  } catch (const std::bad_alloc&) {
    return ENOMEM;
  }
  std::size_t pos = 0;
  while (pos <= dir.size()) {
    std::size_t slash = dir.find('/', pos);
    if (slash == std::string::npos) slash = dir.size();
    prefix.assign(dir, 0, slash);
    pos = slash + 1;
    if (prefix.empty() || prefix == "." || prefix == "..") continue;
    if (::mkdir(prefix.c_str(), mode) == 0) {
      // mkdir applies the umask: the mode is made exact, as file_mode is for files.
      if (::chmod(prefix.c_str(), mode) != 0) return errno;
    } else if (errno != EEXIST) {
      return errno;
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return errno;
  return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

}  // namespace kvtier::detail
