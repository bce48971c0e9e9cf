#pragma once

#include <sys/stat.h>
#include <sys/types.h>

// Whether reading or writing a file can only copy memory: the test behind loads and stores
// that skip the worker's arena under a deadline (worker.cpp, docs/core.md "Loads from memory",
// "Stores to memory"); both move a large payload there in checked pieces (psync_engine.cpp).
//
// A deadline (EngineConfig::io_timeout_s) exists for storage that stops answering. A file of
// ramfs, or of tmpfs on a machine without swap, has no storage behind it: its pages are in
// memory and cannot be anywhere else, so a read of it is a copy out of the page cache, which
// cannot wait on a device. The exceptions are named here because they decide the answer:
// - tmpfs with swap: an idle tmpfs page may be swapped out, and reading it waits for the swap
//   device (which can hang like any disk). So tmpfs counts only while no swap is configured
//   (sysinfo's totalswap, asked once per batch: RootMemory::now);
// - file systems stacked on tmpfs (FUSE, overlayfs, NFS exporting it): each reports its own
//   f_type, never tmpfs's, and its own st_dev, so they are not memory here;
// - a privileged fanotify listener with FAN_ACCESS_PERM can hold any read, on any file
//   system, until it answers: not storage, and not covered (see docs/core.md).

namespace kvtier::detail {

/// True when the file open at `fd` lives on ramfs, or on tmpfs while the machine has no swap
/// configured. False on any failure. Never throws.
bool reads_only_memory(int fd) noexcept;

/// What an engine learns of its root's file system once, at start, so that a load asks the
/// kernel per batch (swap) rather than per file (fstatfs and sysinfo: two of the six system
/// calls of a 256 KiB load from tmpfs). A file whose st_dev is the root's lies on the root's
/// own file system (one superblock, one type); any other is asked itself.
class RootMemory {
 public:
  RootMemory() = default;
  /// Of the root directory open at `root_fd`: none when it is not ramfs, nor tmpfs without
  /// swap, at start.
  static RootMemory of(int root_fd) noexcept;

  /// The root's file system is memory (as at start): loads may ask now() and holds().
  bool possible() const noexcept { return kind_ != Kind::kNone; }
  /// Whether files on the root's own file system read only memory now: ramfs always, tmpfs
  /// while no swap is configured (one sysinfo). False when !possible(). Asked once per batch.
  bool now() const noexcept;
  /// Whether the open file `fd`, whose fstat is `st`, reads only memory, given `root_now`
  /// (now()'s answer for this batch): on the root's file system that answer; on another one
  /// (mounted below the root) reads_only_memory(fd). False when !possible().
  bool holds(int fd, const struct stat& st, bool root_now) const noexcept;

 private:
  enum class Kind { kNone, kTmpfs, kRamfs };
  Kind kind_ = Kind::kNone;
  dev_t dev_ = 0;
};

}  // namespace kvtier::detail
