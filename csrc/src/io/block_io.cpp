#include "io/block_io.hpp"

#include "io/io_uring_engine.hpp"
#include "io/psync_engine.hpp"
#include "io/worker_context.hpp"

namespace kvtier::detail {

void run_blocks(const IoContext& ctx, WorkerContext& worker, bool is_load,
                const BlockOp* const* ops, std::size_t n, cuda::Event ready, BlockResult* results,
                const CrcPlan* crc) noexcept {
  if (Ring* ring = worker.ring()) {
    if (int e = run_ring_batch(ctx, worker, *ring, is_load, ops, n, ready, results, crc)) {
      // io_uring_enter kept failing: this worker goes on with pread/pwrite. The batch's first
      // result carries it to the engine's counters (and from there to the one warning).
      worker.retire_ring();
      if (n > 0) results[0].ring_retired_errno = e;
    }
    return;
  }
  const bool root_memory_now = ctx.root_memory.now();  // once for the batch
  for (std::size_t i = 0; i < n; ++i)
    results[i] = is_load ? load_block(ctx, worker, *ops[i], ready, crc ? &crc[i] : nullptr,
                                      root_memory_now)
                         : store_block(ctx, worker, *ops[i], ready, crc ? &crc[i] : nullptr,
                                       root_memory_now);
}

}  // namespace kvtier::detail
