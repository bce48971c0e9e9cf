#include "fs/memory_fs.hpp"

#include <linux/magic.h>
#include <sys/statfs.h>
#include <sys/sysinfo.h>

namespace kvtier::detail {

namespace {

bool no_swap() noexcept {
  struct sysinfo info;
  return ::sysinfo(&info) == 0 && info.totalswap == 0;
}

}  // namespace

bool reads_only_memory(int fd) noexcept {
  struct statfs fs;
  if (::fstatfs(fd, &fs) != 0) return false;
  if (fs.f_type == RAMFS_MAGIC) return true;  // never swapped, never written back
  return fs.f_type == TMPFS_MAGIC && no_swap();
}

RootMemory RootMemory::of(int root_fd) noexcept {
  RootMemory root;
  struct statfs fs;
  struct stat st;
  if (::fstatfs(root_fd, &fs) != 0 || ::fstat(root_fd, &st) != 0) return root;
  if (fs.f_type == RAMFS_MAGIC) {
    root.kind_ = Kind::kRamfs;
  } else if (fs.f_type == TMPFS_MAGIC && no_swap()) {
    root.kind_ = Kind::kTmpfs;
  } else {
    return root;
  }
  root.dev_ = st.st_dev;
  return root;
}

bool RootMemory::now() const noexcept {
  return kind_ == Kind::kRamfs || (kind_ == Kind::kTmpfs && no_swap());
}

bool RootMemory::holds(int fd, const struct stat& st, bool root_now) const noexcept {
  if (kind_ == Kind::kNone) return false;
  return st.st_dev == dev_ ? root_now : reads_only_memory(fd);
}

}  // namespace kvtier::detail
