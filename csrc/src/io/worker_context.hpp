#pragma once

#include <memory>

#include <kvtier/format.hpp>

#include "device/aligned_buffer.hpp"
#include "device/segment_copier.hpp"
#include "io/block_io.hpp"
#include "io/ring.hpp"

namespace kvtier::detail {

/// What each worker owns, so the hot path allocates nothing: scratch pages, once it has moved
/// device memory its own CUDA stream (so workers' copies overlap), and with the io_uring
/// engine its own ring (made on the worker thread, the only one that submits to it). Made
/// and used by one worker thread.
class WorkerContext {
 public:
  explicit WorkerContext(const IoContext& ctx) : stream(ctx.cuda, ctx.cuda_device), ctx_(ctx) {}
  WorkerContext(const WorkerContext&) = delete;
  WorkerContext& operator=(const WorkerContext&) = delete;

  /// The worker's io_uring, set up on first use; null with the psync engine, or when the
  /// kernel refused this worker a ring (it then works with psync, like the engine's fallback).
  Ring* ring() noexcept;

  /// Gives the ring up for good (io_uring_enter kept failing): every entry the kernel took has
  /// completed, the rest are dropped with it, and this worker goes on with psync.
  void retire_ring() noexcept { ring_.reset(); }

  /// The worker's CUDA stream (created on first use).
  WorkerStream stream;
  AlignedBuffer header{kHeaderSize};
  AlignedBuffer tail{kAlignment};
  /// With a ring: a header page and a tail page for each block of a batch.
  AlignedBuffer batch_pages;

 private:
  const IoContext& ctx_;
  std::unique_ptr<Ring> ring_;
  bool ring_tried_ = false;
};

}  // namespace kvtier::detail
