#pragma once

#include <sys/types.h>

#include <ctime>

#include <cstdint>
#include <string>
#include <vector>

#include <kvtier/export.hpp>
#include <kvtier/version.hpp>

namespace kvtier {
inline namespace KVTIER_ABI_NAMESPACE {

/// Mode of every directory the tier creates for files of `file_mode`: the file's permission
/// bits plus search (x) wherever they grant read (0600 -> 0700, 0660 -> 0770, 0666 -> 0777).
/// The one definition of this rule; Python reads it through kvtier._core.directory_mode.
KVTIER_EXPORT mode_t directory_mode(mode_t file_mode) noexcept;

/// Regular expression (the subset Python's `re` and ECMAScript share) matching the name of a
/// tmp file: `<final name>.<host>.<pid>.<token>.<n>.tmp` (token: 16 lowercase hex digits),
/// groups 1 to 5 in that order. Python's sweep and capacity code match with it
/// (kvtier._core.TMP_FILE_PATTERN); tmp_file_name() writes it.
KVTIER_EXPORT extern const char kTmpFilePattern[];

/// The host part of tmp file names: the first label of the host name ("localhost" if unknown).
KVTIER_EXPORT std::string host_label();

/// A fresh tmp file name for `final_name` in the same directory:
/// `<final_name>.<host_label()>.<pid>.<token>.<n>.tmp` with `token` 64 random bits drawn once
/// per process (again after a fork) and `n` from a process-wide counter. The token makes it
/// unique whatever the pid and host name (containers of one host name, each writer pid 1);
/// the host tells a sweep whose files it may judge, the pid is informational.
KVTIER_EXPORT std::string tmp_file_name(const std::string& final_name);

/// Marks a freshly created tmp file as written by a live process: an OFD write lock on the
/// whole file, held until `fd`'s open file description is closed. Other processes, also in
/// other PID namespaces, see it through tmp_file_writer(). Returns 0; EAGAIN when another
/// process holds a lock on the file; ENOLCK, EINVAL, EOPNOTSUPP or ENOSYS when the file system
/// has no such locks (the file then carries no liveness mark).
KVTIER_EXPORT int lock_tmp_file(int fd) noexcept;

/// Whether the process writing a tmp file still runs, as far as locks can tell.
enum class TmpWriter {
  kAlive,    ///< the writer's lock is held
  kGone,     ///< the file exists and nobody holds its lock
  kMissing,  ///< no such file (already renamed or removed)
  kUnknown,  ///< cannot tell (locks unsupported, file unreadable, not a regular file)
};

/// Checks the lock of the tmp file at `path` (never follows a final symlink, never blocks on
/// a FIFO). A kGone file may still be in the instant between its creation and its lock:
/// writers verify after locking that their file was not removed meanwhile, and retry.
KVTIER_EXPORT TmpWriter tmp_file_writer(const std::string& path) noexcept;

/// Whether each of `paths` is a regular file reached from `root_dir` without following any
/// symbolic link below it; a path that is not below `root_dir` is absent. With an empty
/// `root_dir` only the last component of each path must not be a link.
KVTIER_EXPORT std::vector<bool> regular_files_exist(const std::string& root_dir,
                                                    const std::vector<std::string>& paths);

/// What unlink_unchanged_files() did with each path it reached.
struct UnlinkedFiles {
  /// Per path, in order, for the paths handled: the size of the regular file unlinked (or, in
  /// a dry run, found unchanged); kKeptFile when the entry was left alone (not a regular file,
  /// a link on the way, not below the root, or its mtime is no longer the one listed: used
  /// since); kGoneFile when nothing was there (another deleter was first); kDeniedFile when
  /// the unlink was refused with EACCES or EPERM (another user's directory, an immutable
  /// file): that file only, the walk goes on.
  std::vector<std::int64_t> outcomes;
  /// 0, or the errno that stopped the walk at paths[outcomes.size()], which `operation`
  /// ("lstat", "open" or "unlink") failed on; the paths before it were handled.
  int error = 0;
  std::string operation;
  /// With `error`: true when it was root_dir itself that could not be opened (no path was
  /// handled), rather than a directory or file on the way to paths[outcomes.size()].
  bool root_failed = false;
  /// The paths the files kept for reuse (outcome kRecycledFile) were renamed to, in order.
  std::vector<std::string> recycled;
};
inline constexpr std::int64_t kKeptFile = -1;
inline constexpr std::int64_t kGoneFile = -2;
inline constexpr std::int64_t kDeniedFile = -3;
/// Evicted, but renamed for reuse instead of unlinked (Recycling): its bytes stay on disk.
inline constexpr std::int64_t kRecycledFile = -4;

/// Whether `path` lies on a file system of this host's kernel alone (ext2/3/4, XFS, btrfs,
/// F2FS, tmpfs, ramfs), where a rename is seen by every later lookup at once. False for
/// network and FUSE file systems (NFS, GlusterFS, CephFS), whose clients may resolve a name
/// from a cache after the file was renamed away, and when statfs fails.
KVTIER_EXPORT bool local_file_system(const std::string& path) noexcept;

/// Eviction that keeps files for a later store to overwrite (BlockOp::recycle), which costs
/// the file system less than an unlink and a new file (on tmpfs no pages are freed and
/// allocated again; on a disk no blocks are discarded and allocated again). Of the files
/// unlink_unchanged_files() would unlink, up to `max_files` that are regular files of exactly
/// `file_size` bytes with one link, owned by the caller's effective user, are renamed in their
/// directory to a tmp file name (tmp_file_name(), unlocked: a sweep may still remove them)
/// instead, if their path lies below `below` (any path when empty): the directory of the
/// engine whose stores take them (their root, see BlockOp::recycle). None while `max_files`
/// is 0. Meant for local file systems (local_file_system()): on a shared one, a reader on
/// another host may still reach a kept file by its old name through its client's cache.
struct Recycling {
  std::uint64_t file_size = 0;
  std::size_t max_files = 0;
  std::string below;
};

/// The evictor's system calls for a batch of block files in one call (Python calls it with the
/// GIL released: a check, an lstat and an unlink per file each handed the GIL over): each of
/// `paths` whose lstat shows a regular file with mtime `mtimes[i]` is unlinked, unless
/// `dry_run`. With a non-empty `root_dir` every path is reached from it without following
/// any symbolic link below it, as regular_files_exist() does. Throws std::invalid_argument
/// when `mtimes` and `paths` differ in length; the file system's failures are reported in
/// the result (UnlinkedFiles::error), never thrown. `recycle` keeps some files for reuse
/// instead (Recycling; only with a non-empty `root_dir`, and never in a dry run).
KVTIER_EXPORT UnlinkedFiles unlink_unchanged_files(const std::string& root_dir,
                                                   const std::vector<std::string>& paths,
                                                   const std::vector<timespec>& mtimes,
                                                   bool dry_run, const Recycling& recycle = {});

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
