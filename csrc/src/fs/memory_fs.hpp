#pragma once

// Whether reading a file can only copy memory: the test behind loads that skip the worker's
// arena under a deadline (worker.cpp, docs/core.md "Loads from memory").
//
// A deadline (EngineConfig::io_timeout_s) exists for storage that stops answering. A file of
// ramfs, or of tmpfs on a machine without swap, has no storage behind it: its pages are in
// memory and cannot be anywhere else, so a read of it is a copy out of the page cache, which
// cannot wait on a device. The exceptions are named here because they decide the answer:
// - tmpfs with swap: an idle tmpfs page may be swapped out, and reading it waits for the swap
//   device (which can hang like any disk). So tmpfs counts only while no swap is configured
//   (sysinfo's totalswap, asked per batch, one cheap system call);
// - file systems stacked on tmpfs (FUSE, overlayfs, NFS exporting it): each reports its own
//   f_type, never tmpfs's, so they are not memory here;
// - a privileged fanotify listener with FAN_ACCESS_PERM can hold any read, on any file
//   system, until it answers: not storage, and not covered (see docs/core.md).

namespace kvtier::detail {

/// True when the file open at `fd` lives on ramfs, or on tmpfs while the machine has no swap
/// configured. False on any failure. Never throws.
bool reads_only_memory(int fd) noexcept;

}  // namespace kvtier::detail
