#pragma once

#include <atomic>
#include <cstdint>

#include <kvtier/engine.hpp>

#include "io/block_io.hpp"

namespace kvtier::detail {

/// The engine's counters since it started. Written with the scheduler's mutex held and read
/// by Engine::stats() without it: relaxed atomics, so a snapshot is consistent enough, never
/// torn.
class Counters {
 public:
  /// One finished (or cancelled) block operation of a load or a store.
  void record_block(bool load, const BlockResult& result) noexcept;
  /// Blocks failed by their deadline (EngineConfig::io_timeout_s).
  void record_timeouts(std::uint64_t blocks) noexcept { add(io_timeouts_, blocks); }
  /// A job left in the scheduler's inbox by its submit (Scheduler::submit).
  void record_intake_submit() noexcept { add(intake_submits_); }
  /// The watchdog gave running batches back the time it was paused (Scheduler::watch).
  void record_watchdog_pause() noexcept { add(watchdog_pauses_); }
  /// One completed job.
  void record_job(bool load, bool failed) noexcept;
  /// Copies every counter into `out` (the queue and running counts are the scheduler's).
  void snapshot(EngineStats& out) const noexcept;

 private:
  using Counter = std::atomic<std::uint64_t>;
  static void add(Counter& c, std::uint64_t n = 1) noexcept {
    c.fetch_add(n, std::memory_order_relaxed);
  }

  Counter load_jobs_{0}, store_jobs_{0}, failed_load_jobs_{0}, failed_store_jobs_{0};
  Counter load_blocks_{0}, store_blocks_{0}, failed_load_blocks_{0}, failed_store_blocks_{0};
  Counter load_bytes_{0}, store_bytes_{0}, dedup_skips_{0}, corrupt_files_removed_{0};
  Counter o_direct_fallbacks_{0}, io_uring_rings_retired_{0}, io_timeouts_{0};
  Counter memory_fs_loads_{0}, memory_fs_stores_{0}, intake_submits_{0}, watchdog_pauses_{0};
  std::atomic<int> io_uring_retired_errno_{0};
};

}  // namespace kvtier::detail
