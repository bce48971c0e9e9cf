#pragma once

#include <string>

#include <kvtier/export.hpp>
#include <kvtier/version.hpp>

namespace kvtier {
inline namespace KVTIER_ABI_NAMESPACE {

/// EngineConfig::n_read_threads / n_write_threads value meaning "sized by the machine".
inline constexpr unsigned kMachineThreads = ~0u;

/// Worker counts of an engine.
struct ThreadCounts {
  unsigned n_read_threads = 0;
  unsigned n_write_threads = 0;
};

/// The default worker counts for `cores` usable CPUs and a root on a block device whose
/// request queue holds `queue_depth` requests (0: no block device, e.g. tmpfs). Each
/// direction gets one worker per core (block operations on a fast file system are CPU work:
/// more runnable workers than cores only share the cores), raised to a sixteenth of the
/// device queue where a device makes workers wait, and kept within [2, 32]. Pure; never throws.
KVTIER_EXPORT ThreadCounts default_thread_counts(unsigned cores, unsigned queue_depth) noexcept;

/// CPUs this process may run on (its affinity mask), at least 1.
KVTIER_EXPORT unsigned usable_cores() noexcept;

/// nr_requests of the block device holding `path` (or its nearest existing ancestor), from
/// /sys/dev/block; 0 where the file system has no block device (tmpfs, overlay, network and
/// btrfs anonymous devices) or sysfs does not say.
KVTIER_EXPORT unsigned device_queue_depth(const std::string& path) noexcept;

/// default_thread_counts(usable_cores(), device_queue_depth(root_dir)).
KVTIER_EXPORT ThreadCounts machine_thread_counts(const std::string& root_dir) noexcept;

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
