#include "engine/counters.hpp"

namespace kvtier::detail {

void Counters::record_block(bool load, const BlockResult& result) noexcept {
  if (result.o_direct_fallback) add(o_direct_fallbacks_);
  if (result.corrupt_removed) add(corrupt_files_removed_);
  if (result.ring_retired_errno != 0) {
    io_uring_retired_errno_.store(result.ring_retired_errno, std::memory_order_relaxed);
    add(io_uring_rings_retired_);
  }
  if (!result.ok()) {
    add(load ? failed_load_blocks_ : failed_store_blocks_);
    return;
  }
  add(load ? load_blocks_ : store_blocks_);
  add(load ? load_bytes_ : store_bytes_, result.bytes);
  if (result.dedup) add(dedup_skips_);
  if (result.from_memory_fs) add(load ? memory_fs_loads_ : memory_fs_stores_);
}

void Counters::record_job(bool load, bool failed) noexcept {
  add(load ? load_jobs_ : store_jobs_);
  if (failed) add(load ? failed_load_jobs_ : failed_store_jobs_);
}

void Counters::snapshot(EngineStats& out) const noexcept {
  auto get = [](const Counter& c) { return c.load(std::memory_order_relaxed); };
  out.load_jobs = get(load_jobs_);
  out.store_jobs = get(store_jobs_);
  out.failed_load_jobs = get(failed_load_jobs_);
  out.failed_store_jobs = get(failed_store_jobs_);
  out.load_blocks = get(load_blocks_);
  out.store_blocks = get(store_blocks_);
  out.failed_load_blocks = get(failed_load_blocks_);
  out.failed_store_blocks = get(failed_store_blocks_);
  out.load_bytes = get(load_bytes_);
  out.store_bytes = get(store_bytes_);
  out.dedup_skips = get(dedup_skips_);
  out.corrupt_files_removed = get(corrupt_files_removed_);
  out.o_direct_fallbacks = get(o_direct_fallbacks_);
  out.io_uring_rings_retired = get(io_uring_rings_retired_);
  out.io_timeouts = get(io_timeouts_);
  out.memory_fs_loads = get(memory_fs_loads_);
  out.memory_fs_stores = get(memory_fs_stores_);
  out.intake_submits = get(intake_submits_);
  out.watchdog_pauses = get(watchdog_pauses_);
  out.io_uring_retired_errno = io_uring_retired_errno_.load(std::memory_order_relaxed);
}

}  // namespace kvtier::detail
