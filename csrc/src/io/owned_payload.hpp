#pragma once

// Block operations that may be abandoned (EngineConfig::io_timeout_s > 0) move bytes only
// through memory the worker owns: a store's payload is copied in before any system call, a
// load's is copied out only after the worker has claimed its batch (Batch::claim). A worker
// abandoned inside the kernel then writes into, and reads from, nothing but its own buffers,
// which it frees itself when the kernel returns.
//
// The two copy steps are one function each (copy_into_owned, copy_out_of_owned), so a fused
// copy-and-checksum kernel can replace them without touching the I/O engines.

#include <cstddef>

#include <kvtier/job.hpp>

#include "device/aligned_buffer.hpp"
#include "device/cuda_runtime.hpp"
#include "io/block_io.hpp"
#include "util/step_error.hpp"

namespace kvtier::detail {

class WorkerContext;

/// A worker's own copies of a batch's blocks: each op a copy of the caller's (path, key) with
/// its payload in one page-aligned arena the worker keeps from batch to batch (grown when a
/// batch needs more; registered with CUDA when the engine moves device memory, so device
/// copies run at pinned speed). Used by one worker thread only.
class OwnedPayloads {
 public:
  OwnedPayloads() = default;
  ~OwnedPayloads();
  OwnedPayloads(const OwnedPayloads&) = delete;
  OwnedPayloads& operator=(const OwnedPayloads&) = delete;

  /// Makes the owned copies of `ops[0..n)` (n at most kMaxBatchBlocks). Throws std::bad_alloc.
  void prepare(const IoContext& ctx, const BlockOp* const* ops, std::size_t n);

  /// The owned copy of block `i`: host memory, contiguous, page aligned.
  BlockOp& op(std::size_t i) noexcept { return ops_[i]; }
  unsigned char* payload(std::size_t i) const noexcept {
    return static_cast<unsigned char*>(ops_[i].data);
  }

 private:
  void grow(const IoContext& ctx, std::size_t bytes);
  void unregister() noexcept;

  AlignedBuffer arena_;
  const cuda::Api* registered_with_ = nullptr;  // arena_ is registered with this runtime
  BlockOp ops_[kMaxBatchBlocks];
};

/// The store's copy-in step: the caller's payload of `op` (host or device, contiguous or
/// segments) into `owned` (op.payload_length() bytes, then zeros to the page's end), after
/// the submitter's `ready` event for device memory. Never throws.
StepError copy_into_owned(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                          unsigned char* owned, cuda::Event ready) noexcept;

/// The load's copy-out step: `owned` (a verified payload) into the caller's memory of `op`.
/// Only after the worker claimed its batch. Never throws.
StepError copy_out_of_owned(const IoContext& ctx, WorkerContext& worker, const BlockOp& op,
                            const unsigned char* owned, cuda::Event ready) noexcept;

}  // namespace kvtier::detail
