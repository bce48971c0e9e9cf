#include <kvtier/files.hpp>

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <stdexcept>

#include <kvtier/error.hpp>

#include "fs/beneath.hpp"
#include "fs/process.hpp"
#include "io/posix_io.hpp"

namespace kvtier {
inline namespace KVTIER_ABI_NAMESPACE {

mode_t directory_mode(mode_t file_mode) noexcept {
  return (file_mode | ((file_mode & 0444) >> 2)) & 0777;
}

const char kTmpFilePattern[] =
    R"(^(.+)\.([^./]+)\.([0-9]+)\.([0-9a-f]{16})\.([0-9]+)\.tmp$)";

std::string host_label() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  // Tmp names are split on '.', so a dotted host name is reduced to its first label.
  std::string host(name);
  const auto dot = host.find('.');
  return dot == std::string::npos ? host : host.substr(0, dot);
}

std::string tmp_file_name(const std::string& final_name) {
  static const std::string host = host_label();
  // Process-wide, so two engines (or an engine and the Python side) never pick the same name.
  static std::atomic<std::uint64_t> counter{0};
  // The token, not the pid or the host, makes the name unique: containers of one host name
  // each run as pid 1 in their own PID namespace. The pid is there for people only.
  char token[17];
  std::snprintf(token, sizeof(token), "%016" PRIx64, detail::process_token());
  return final_name + "." + host + "." + std::to_string(detail::current_pid()) + "." + token +
         "." + std::to_string(counter.fetch_add(1, std::memory_order_relaxed)) + ".tmp";
}

int lock_tmp_file(int fd) noexcept {
  // An OFD lock belongs to the open file description, not to a pid: it is visible to every
  // process that opens the file, whatever PID namespace either lives in, and it vanishes
  // when the writer dies.
  struct flock lock{};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  for (;;) {
    if (::fcntl(fd, F_OFD_SETLK, &lock) == 0) return 0;
    if (errno != EINTR) return errno == EACCES ? EAGAIN : errno;
  }
}

TmpWriter tmp_file_writer(const std::string& path) noexcept {
  // O_NONBLOCK: a FIFO planted under a tmp name must not hang the caller.
  detail::FileDescriptor fd(
      ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (!fd) return errno == ENOENT ? TmpWriter::kMissing : TmpWriter::kUnknown;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return TmpWriter::kUnknown;
  struct flock lock{};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  if (::fcntl(fd.get(), F_OFD_GETLK, &lock) != 0) return TmpWriter::kUnknown;
  return lock.l_type == F_UNLCK ? TmpWriter::kGone : TmpWriter::kAlive;
}

std::vector<bool> regular_files_exist(const std::string& root_dir,
                                      const std::vector<std::string>& paths) {
  std::vector<bool> exist(paths.size(), false);
  struct stat st;
  if (root_dir.empty()) {
    for (std::size_t i = 0; i < paths.size(); ++i)
      exist[i] = ::lstat(paths[i].c_str(), &st) == 0 && S_ISREG(st.st_mode);
    return exist;
  }
  detail::RootDir root;
  try {
    root = detail::RootDir(root_dir, /*create=*/false, 0);
  } catch (const SystemError&) {
    return exist;  // no root, no blocks
  }
  std::string directory, name;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    if (root.split(paths[i], directory, name) != 0) continue;
    detail::FileDescriptor dir;
    if (root.open_directory(directory, /*create=*/false, 0, dir)) continue;
    exist[i] =
        ::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
  }
  return exist;
}

bool local_file_system(const std::string& path) noexcept {
  struct statfs fs;
  if (::statfs(path.c_str(), &fs) != 0) return false;
  switch (static_cast<unsigned long>(fs.f_type)) {
    case EXT4_SUPER_MAGIC:  // ext2 and ext3 too
    case XFS_SUPER_MAGIC:
    case BTRFS_SUPER_MAGIC:
    case F2FS_SUPER_MAGIC:
    case TMPFS_MAGIC:
    case RAMFS_MAGIC:
      return true;
    default:
      return false;
  }
}

UnlinkedFiles unlink_unchanged_files(const std::string& root_dir,
                                     const std::vector<std::string>& paths,
                                     const std::vector<timespec>& mtimes, bool dry_run,
                                     const Recycling& recycle) {
  if (mtimes.size() != paths.size())
    throw std::invalid_argument("unlink_unchanged_files: one mtime per path");
  UnlinkedFiles done;
  done.outcomes.reserve(paths.size());
  detail::RootDir root;
  if (!root_dir.empty()) {
    try {
      root = detail::RootDir(root_dir, /*create=*/false, 0);
    } catch (const SystemError& e) {
      done.error = e.code().value();
      done.operation = "open";
      done.root_failed = true;
      return done;
    }
  }
  // Consecutive blocks of one directory reuse its descriptor.
  std::string directory, name, open_directory;
  detail::FileDescriptor dir;
  struct stat st;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    int at = AT_FDCWD;
    const char* entry = paths[i].c_str();
    if (!root_dir.empty()) {
      if (root.split(paths[i], directory, name) != 0) {
        done.outcomes.push_back(kKeptFile);
        continue;
      }
      if (!dir || directory != open_directory) {
        dir = detail::FileDescriptor();
        if (const detail::PathError e = root.open_directory(directory, false, 0, dir)) {
          if (e.error == ENOENT) {
            done.outcomes.push_back(kGoneFile);
          } else if (e.error == ELOOP || e.error == ENOTDIR) {
            done.outcomes.push_back(kKeptFile);
          } else {
            done.error = e.error;
            done.operation = "open";
            return done;
          }
          continue;
        }
        open_directory = directory;
      }
      at = dir.get();
      entry = name.c_str();
    }
    if (::fstatat(at, entry, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT) {
        done.error = errno;
        done.operation = "lstat";
        return done;
      }
      done.outcomes.push_back(kGoneFile);
      continue;
    }
    if (!S_ISREG(st.st_mode) || st.st_mtim.tv_sec != mtimes[i].tv_sec ||
        st.st_mtim.tv_nsec != mtimes[i].tv_nsec) {
      done.outcomes.push_back(kKeptFile);
      continue;
    }
    if (!dry_run && !root_dir.empty() && done.recycled.size() < recycle.max_files &&
        static_cast<std::uint64_t>(st.st_size) == recycle.file_size && st.st_nlink == 1 &&
        st.st_uid == ::geteuid() &&
        (recycle.below.empty() || paths[i].rfind(recycle.below + "/", 0) == 0)) {
      std::string spare = tmp_file_name(name);
      if (::renameat(at, entry, at, spare.c_str()) == 0) {
        done.outcomes.push_back(kRecycledFile);
        done.recycled.push_back(root.path() + "/" + (directory.empty() ? "" : directory + "/") +
                                spare);
        continue;
      }
      // Gone meanwhile, or a file system that refuses: unlinked below as usual.
    }
    if (!dry_run && ::unlinkat(at, entry, 0) != 0) {
      if (errno == EACCES || errno == EPERM) {  // this file's directory or flags, not the disk
        done.outcomes.push_back(kDeniedFile);
        continue;
      }
      if (errno != ENOENT) {
        done.error = errno;
        done.operation = "unlink";
        return done;
      }
      done.outcomes.push_back(kGoneFile);  // another evictor was first: not ours to uncount
      continue;
    }
    done.outcomes.push_back(static_cast<std::int64_t>(st.st_size));
  }
  return done;
}

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
