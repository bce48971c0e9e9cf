#include "fs/memory_fs.hpp"

#include <linux/magic.h>
#include <sys/statfs.h>
#include <sys/sysinfo.h>

namespace kvtier::detail {

bool reads_only_memory(int fd) noexcept {
  struct statfs fs;
  if (::fstatfs(fd, &fs) != 0) return false;
  if (fs.f_type == RAMFS_MAGIC) return true;  // never swapped, never written back
  if (fs.f_type != TMPFS_MAGIC) return false;
  struct sysinfo info;
  return ::sysinfo(&info) == 0 && info.totalswap == 0;
}

}  // namespace kvtier::detail
