#pragma once

#include <sys/types.h>

#include <cstdint>

namespace kvtier::detail {

/// This process's pid without a system call per use (getpid is one since glibc 2.25): read
/// once, and again after a fork (the child's own pid). What tmp-file names carry, and how an
/// engine tells the process that started its workers from a forked child that inherited it.
pid_t current_pid() noexcept;

/// 64 random bits chosen once per process (and again in a forked child), never 0: what makes
/// a tmp-file name unique where pid and host name are not (containers of one host name each
/// run their writer as pid 1 in their own PID namespace).
std::uint64_t process_token() noexcept;

}  // namespace kvtier::detail
