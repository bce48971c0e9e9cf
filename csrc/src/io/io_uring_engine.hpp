#pragma once

#include <cstddef>

#include <kvtier/format.hpp>
#include <kvtier/job.hpp>

#include "device/cuda_runtime.hpp"
#include "io/block_io.hpp"
#include "io/ring.hpp"

namespace kvtier::detail {

/// Entries of a worker's ring: it holds a whole batch, every entry of which is reaped before
/// the next batch is prepared.
inline constexpr unsigned kRingEntries = 64;

/// Bytes of the worker's batch pages per block of a batch: one header page, one tail page.
inline constexpr std::size_t kRingPagesPerBlock = kHeaderSize + kAlignment;

/// run_blocks() on a worker that has a ring: the blocks' operations reach the kernel in one
/// submission, each block a linked chain; blocks the ring cannot take, or whose outcome needs
/// the psync engine's decision, run there. Returns 0, or the errno for which the ring had to
/// be given up (io_uring_enter kept failing): every result is set all the same (the blocks
/// the kernel never took ran on the psync path), and the caller must not use the ring again.
/// `crc` (may be null): a CrcPlan per op, as run_blocks takes it. Never throws.
int run_ring_batch(const IoContext& ctx, WorkerContext& worker, Ring& ring, bool is_load,
                   const BlockOp* const* ops, std::size_t n, cuda::Event ready,
                   BlockResult* results, const CrcPlan* crc = nullptr) noexcept;

}  // namespace kvtier::detail
