#include "device/segment_copier.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kvtier::detail {
namespace {

StepError cuda_failure(const cuda::Api& api, cuda::Error e, const char* operation) {
  // CUDA errors have no errno; EIO marks them as I/O failures, the message names them.
  return {EIO, operation, cuda::describe(api, e)};
}

}  // namespace

WorkerStream::~WorkerStream() {
  if (stream_ != nullptr && api_ != nullptr) api_->cudaStreamDestroy(stream_);
}

cuda::Error WorkerStream::get(cuda::Stream& out) {
  if (stream_ == nullptr) {
    // Runtime state is per thread: select the device before creating the stream on it.
    if (cuda::Error e = api_->cudaSetDevice(device_)) return e;
    if (cuda::Error e = api_->cudaStreamCreateWithFlags(&stream_, cuda::kStreamNonBlocking))
      return e;
  }
  out = stream_;
  return cuda::kSuccess;
}

// Work left on the stream after a failure (copies queued before the failing call, a wait on
// the submitter's event) must retire before the staging buffer is reused and the job's event
// is destroyed.
SegmentCopier::~SegmentCopier() {
  if (!unsynchronized_) return;
  cuda::Stream stream = nullptr;
  if (stream_.get(stream) == cuda::kSuccess) api_->cudaStreamSynchronize(stream);
  api_->cudaGetLastError();
}

StepError SegmentCopier::copy(unsigned char* staging, std::size_t n, bool to_staging) {
  dsts_.clear();
  srcs_.clear();
  sizes_.clear();
  std::size_t done = 0;
  while (done < n) {
    const Segment& seg = segments_[index_];
    const std::size_t take = std::min(seg.length - offset_, n - done);
    auto* mem = static_cast<unsigned char*>(seg.address) + offset_;
    unsigned char* stage = staging + done;
    if (seg.kind == MemoryKind::kHost) {
      if (to_staging)
        std::memcpy(stage, mem, take);
      else
        std::memcpy(mem, stage, take);
    } else {
      dsts_.push_back(to_staging ? static_cast<void*>(stage) : mem);
      srcs_.push_back(to_staging ? static_cast<const void*>(mem) : stage);
      sizes_.push_back(take);
    }
    done += take;
    offset_ += take;
    if (offset_ == seg.length) {
      ++index_;
      offset_ = 0;
    }
  }
  return dsts_.empty() ? StepError{} : copy_device(to_staging);
}

StepError SegmentCopier::wait_for(cuda::Event ready) {
  if (ready == nullptr || api_ == nullptr) return {};
  cuda::Stream stream = nullptr;
  if (cuda::Error e = stream_.get(stream)) return cuda_failure(*api_, e, "cudaStreamCreate");
  if (cuda::Error e = api_->cudaStreamWaitEvent(stream, ready, 0))
    return cuda_failure(*api_, e, "cudaStreamWaitEvent");
  unsynchronized_ = true;
  return {};
}

StepError SegmentCopier::copy_device(bool to_staging) {
  const cuda::Api& api = *api_;
  cuda::Stream stream = nullptr;
  if (cuda::Error e = stream_.get(stream)) return cuda_failure(api, e, "cudaStreamCreate");
  const cuda::MemcpyKind kind = to_staging ? cuda::kDeviceToHost : cuda::kHostToDevice;
  cuda::Error e = cuda::kSuccess;
  unsynchronized_ = true;
  if (sizes_.size() > 1 && (api.batch_copy_13 || api.batch_copy_12)) {
    cuda::MemcpyAttributes attrs{};
    attrs.src_access_order = cuda::kSrcAccessOrderStream;
    std::size_t attrs_index = 0;
    if (api.batch_copy_13) {
      e = api.batch_copy_13(dsts_.data(), srcs_.data(), sizes_.data(), sizes_.size(), &attrs,
                            &attrs_index, 1, stream);
    } else {
      std::size_t fail_index = 0;
      e = api.batch_copy_12(dsts_.data(), srcs_.data(), sizes_.data(), sizes_.size(), &attrs,
                            &attrs_index, 1, &fail_index, stream);
    }
    if (e != cuda::kSuccess) return cuda_failure(api, e, "cudaMemcpyBatchAsync");
  } else {
    for (std::size_t i = 0; i < sizes_.size(); ++i) {
      e = api.cudaMemcpyAsync(dsts_[i], srcs_[i], sizes_[i], kind, stream);
      if (e != cuda::kSuccess) return cuda_failure(api, e, "cudaMemcpyAsync");
    }
  }
  // The staging buffer is reused (or written to disk) next: the copies must be done.
  if ((e = api.cudaStreamSynchronize(stream)) != cuda::kSuccess)
    return cuda_failure(api, e, "cudaStreamSynchronize");
  unsynchronized_ = false;
  return {};
}

StepError copy_staged(const cuda::Api* api, WorkerStream& stream,
                      const std::vector<Segment>& segments, unsigned char* staging, std::size_t n,
                      bool to_staging, cuda::Event ready) {
  SegmentCopier copier(api, stream, segments);
  if (StepError e = copier.wait_for(ready)) return e;
  return copier.copy(staging, n, to_staging);
}

}  // namespace kvtier::detail
