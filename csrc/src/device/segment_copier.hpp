#pragma once

#include <cstddef>
#include <vector>

#include <kvtier/job.hpp>

#include "device/cuda_runtime.hpp"
#include "util/step_error.hpp"

namespace kvtier::detail {

/// A worker's own CUDA stream on the engine's device, created on first use (so that the
/// workers' copies overlap) and destroyed with it. Used by its worker thread only.
class WorkerStream {
 public:
  /// `api` may be null (an engine without CUDA): get() is then never called.
  WorkerStream(const cuda::Api* api, int device) noexcept : api_(api), device_(device) {}
  ~WorkerStream();
  WorkerStream(const WorkerStream&) = delete;
  WorkerStream& operator=(const WorkerStream&) = delete;

  /// The stream, created on first use. Returns kSuccess or the CUDA error.
  cuda::Error get(cuda::Stream& out);

 private:
  const cuda::Api* api_;
  int device_;
  cuda::Stream stream_ = nullptr;
};

/// Walks a block's segments piece by piece, copying between them and a staging buffer. Host
/// runs are memcpy'd; device runs become one batched CUDA copy (or one copy per run on
/// runtimes without the batch call), followed by one stream synchronisation per piece. CUDA
/// failures are EIO steps named after the CUDA call. `api` may be null when every segment is
/// host memory.
class SegmentCopier {
 public:
  SegmentCopier(const cuda::Api* api, WorkerStream& stream, const std::vector<Segment>& segments)
      : api_(api), stream_(stream), segments_(segments) {}
  /// Retires work a failure left on the stream (see the definition).
  ~SegmentCopier();
  SegmentCopier(const SegmentCopier&) = delete;
  SegmentCopier& operator=(const SegmentCopier&) = delete;

  /// Copies the next `n` payload bytes between the segments and `staging`: into `staging`
  /// when `to_staging`, out of it otherwise. Device copies are done when this returns.
  StepError copy(unsigned char* staging, std::size_t n, bool to_staging);

  /// Makes the worker's stream wait for the submitter's event (jobs over device memory): the
  /// copies queued after this start once the caller's stream has reached `ready` (may be
  /// null: no wait).
  StepError wait_for(cuda::Event ready);

 private:
  StepError copy_device(bool to_staging);

  const cuda::Api* api_;
  WorkerStream& stream_;
  const std::vector<Segment>& segments_;
  std::size_t index_ = 0, offset_ = 0;
  bool unsynchronized_ = false;  // work queued on the worker's stream since the last sync
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<std::size_t> sizes_;
};

/// Copies the first `n` payload bytes between `segments` and `staging` in one piece, as the
/// psync path copies each piece: waits for `ready` (may be null), then copies. The stream is
/// idle again when this returns.
StepError copy_staged(const cuda::Api* api, WorkerStream& stream,
                      const std::vector<Segment>& segments, unsigned char* staging, std::size_t n,
                      bool to_staging, cuda::Event ready);

}  // namespace kvtier::detail
