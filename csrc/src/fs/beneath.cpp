#include "fs/beneath.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>

#include <kvtier/error.hpp>

#ifndef SYS_openat2
#define SYS_openat2 437  // the same number on every architecture with the generic table
#endif

namespace kvtier::detail {
namespace {

// Cleared for good once the kernel (or a seccomp filter) refuses openat2.
std::atomic<bool> g_openat2{true};

// Called through syscall(): glibc before 2.41 has no wrapper, and this way one code path
// serves every C library.
int openat2_beneath(int root, const std::string& relative, std::uint64_t flags, int& fd) noexcept {
  open_how how{};
  how.flags = flags;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  const long r = ::syscall(SYS_openat2, root, relative.c_str(), &how, sizeof(how));
  if (r < 0) return errno;
  fd = static_cast<int>(r);
  return 0;
}

int openat2_directory(int root, const std::string& relative, int& fd) noexcept {
  for (;;) {
    const int e = openat2_beneath(root, relative, O_RDONLY | O_DIRECTORY | O_CLOEXEC, fd);
    if (e != EINTR && e != EAGAIN) return e;
  }
}

int openat_directory(int dir, const char* name, int& fd) noexcept {
  for (;;) {
    fd = ::openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) return 0;
    const int error = errno;
    if (error == EINTR) continue;
    // O_DIRECTORY reports a link as ENOTDIR; say ELOOP, as openat2 does.
    struct stat st;
    if (error == ENOTDIR && ::fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISLNK(st.st_mode))
      return ELOOP;
    return error;
  }
}

// Opens directory `part` of `at`, never through a link; with `create`, a missing one is made
// with exactly `mode` (mkdir applies the umask: the mode is made exact, as file_mode is for
// files). The error's path is left for the caller to fill.
PathError open_component(int at, const std::string& part, bool create, mode_t mode, int& fd) {
  bool made = false;
  int e = openat_directory(at, part.c_str(), fd);
  if (e == ENOENT && create) {
    if (::mkdirat(at, part.c_str(), mode) == 0)
      made = true;
    else if (errno != EEXIST)
      return {errno, "mkdir", {}};
    e = openat_directory(at, part.c_str(), fd);
  }
  if (e != 0) return {e, "open", {}};
  if (made && ::fchmod(fd, mode) != 0) {
    const int error = errno;
    ::close(fd);
    return {error, "chmod", {}};
  }
  return {};
}

}  // namespace

void set_openat2_enabled(bool enabled) noexcept {
  g_openat2.store(enabled, std::memory_order_relaxed);
}

const char* file_kind(mode_t mode) noexcept {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "a regular file";
    case S_IFDIR:
      return "a directory";
    case S_IFLNK:
      return "a symbolic link";
    case S_IFIFO:
      return "a FIFO";
    case S_IFSOCK:
      return "a socket";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    default:
      return "not a regular file";
  }
}

int not_regular_error(mode_t mode) noexcept {
  if (S_ISDIR(mode)) return EISDIR;
  if (S_ISLNK(mode)) return ELOOP;
  return EINVAL;
}

RootDir::RootDir(const std::string& path, bool create, mode_t directory_mode) : path_(path) {
  while (path_.size() > 1 && path_.back() == '/') path_.pop_back();
  if (create) {
    if (int e = make_directories(path_, directory_mode))
      throw KVTIER_SYSTEM_ERROR(e, "cannot create root directory", path_);
  }
  fd_ = FileDescriptor(::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd_) {
    const int e = errno;  // read before the error's strings are made
    throw KVTIER_SYSTEM_ERROR(e, "cannot open root directory", path_);
  }
}

int RootDir::split(const std::string& path, std::string& directory, std::string& name) const {
  const std::string prefix = path_ == "/" ? path_ : path_ + "/";
  if (path.compare(0, prefix.size(), prefix) != 0) return EPERM;
  directory.clear();
  name.clear();
  std::size_t pos = prefix.size();
  while (pos <= path.size()) {
    std::size_t slash = path.find('/', pos);
    if (slash == std::string::npos) slash = path.size();
    const std::string part = path.substr(pos, slash - pos);
    pos = slash + 1;
    if (part.empty() || part == ".") continue;
    if (part == "..") return EPERM;
    if (!name.empty()) directory += directory.empty() ? name : "/" + name;
    name = part;
  }
  return name.empty() ? EPERM : 0;
}

std::string RootDir::absolute(const std::string& directory, const std::string& name) const {
  std::string out = path_;
  for (const std::string* part : {&directory, &name}) {
    if (part->empty()) continue;
    if (out.empty() || out.back() != '/') out += '/';
    out += *part;
  }
  return out;
}

int RootDir::open_file(const std::string& directory, const std::string& name, int flags,
                       FileDescriptor& out) const {
  if (!g_openat2.load(std::memory_order_relaxed)) return ENOSYS;
  int fd = -1;
  const int e = openat2_beneath(fd_.get(), directory.empty() ? name : directory + "/" + name,
                                static_cast<std::uint64_t>(flags), fd);
  if (e == 0) out = FileDescriptor(fd);
  return e;
}

PathError RootDir::open_directory(const std::string& directory, bool create, mode_t mode,
                                  FileDescriptor& out) const {
  if (directory.empty()) {
    const int fd = ::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return {errno, "open", path_};
    out = FileDescriptor(fd);
    return {};
  }
  if (g_openat2.load(std::memory_order_relaxed)) {
    int fd = -1;
    const int e = openat2_directory(fd_.get(), directory, fd);
    if (e == 0) {
      out = FileDescriptor(fd);
      return {};
    }
    // ENOSYS: an old kernel; EPERM: a seccomp filter (container runtimes) that denies it.
    if (e == ENOSYS || e == EPERM) {
      g_openat2.store(false, std::memory_order_relaxed);
    } else if (!(e == ENOENT && create)) {
      return {e, "open", absolute(directory)};
    }
  }
  return walk_directory(directory, create, mode, out);
}

// One component at a time, never through a link; missing ones are made when creating.
PathError RootDir::walk_directory(const std::string& directory, bool create, mode_t mode,
                                  FileDescriptor& out) const {
  FileDescriptor current;
  int at = fd_.get();
  std::string done;
  std::size_t pos = 0;
  while (pos < directory.size()) {
    std::size_t slash = directory.find('/', pos);
    if (slash == std::string::npos) slash = directory.size();
    const std::string part = directory.substr(pos, slash - pos);
    pos = slash + 1;
    done += done.empty() ? part : "/" + part;
    int fd = -1;
    if (PathError e = open_component(at, part, create, mode, fd)) {
      e.path = absolute(done);
      return e;
    }
    current = FileDescriptor(fd);
    at = fd;
  }
  out = std::move(current);
  return {};
}

}  // namespace kvtier::detail
