#pragma once

#include <sys/types.h>

namespace kvtier::detail {

/// This process's pid without a system call per use (getpid is one since glibc 2.25): read
/// once, and again after a fork (the child's own pid). What tmp-file names carry, and how an
/// engine tells the process that started its workers from a forked child that inherited it.
pid_t current_pid() noexcept;

}  // namespace kvtier::detail
