#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <vector>

#include "aligned_buffer.hpp"
#include "cuda_runtime.hpp"

namespace kvtier::detail {

/// A bounded pool of equally sized staging buffers, allocated on first use and pinned
/// (registered with CUDA) when a runtime is given, so device copies run at full speed.
/// acquire() blocks while all buffers are lent out; the total never exceeds the cap.
class StagingPool {
 public:
  StagingPool(std::size_t buffer_size, std::size_t total_bytes)
      : buffer_size_(align_up(buffer_size)),
        max_buffers_(total_bytes / buffer_size_ > 0 ? total_bytes / buffer_size_ : 1) {}
  ~StagingPool() { release_all(); }
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  /// Pin buffers allocated from now on with this runtime (call before the first acquire()).
  void pin_with(const cuda::Api* api) noexcept { cuda_ = api; }

  std::size_t buffer_size() const noexcept { return buffer_size_; }

  /// A buffer on loan; returns itself to the pool when destroyed.
  class Lease {
   public:
    Lease(StagingPool* pool, AlignedBuffer buffer) : pool_(pool), buffer_(std::move(buffer)) {}
    ~Lease() {
      if (pool_ != nullptr) pool_->release(std::move(buffer_));
    }
    Lease(Lease&& other) noexcept : pool_(other.pool_), buffer_(std::move(other.buffer_)) {
      other.pool_ = nullptr;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;
    unsigned char* data() const noexcept { return buffer_.data(); }
    std::size_t size() const noexcept { return buffer_.size(); }

   private:
    StagingPool* pool_;
    AlignedBuffer buffer_;
  };

  Lease acquire() {
    std::unique_lock lock(mutex_);
    available_.wait(lock, [&] { return !free_.empty() || allocated_ < max_buffers_; });
    if (!free_.empty()) {
      AlignedBuffer buffer = std::move(free_.back());
      free_.pop_back();
      return Lease(this, std::move(buffer));
    }
    ++allocated_;
    lock.unlock();
    try {
      AlignedBuffer buffer(buffer_size_);
      // Unpinned memory still works (the runtime stages it itself), only slower, so a failed
      // registration is not an error. Portable: pinned for every device, not only the one
      // current on the worker thread that happens to allocate the buffer.
      if (cuda_ != nullptr &&
          cuda_->cudaHostRegister(buffer.data(), buffer.size(), cuda::kHostRegisterPortable) ==
              cuda::kSuccess) {
        std::lock_guard relock(mutex_);
        pinned_.push_back(buffer.data());
      } else if (cuda_ != nullptr) {
        cuda_->cudaGetLastError();
      }
      return Lease(this, std::move(buffer));
    } catch (...) {
      std::lock_guard relock(mutex_);
      --allocated_;
      available_.notify_one();
      throw;
    }
  }

  /// Frees every buffer not on loan (at shutdown, when none are).
  void release_all() noexcept {
    std::lock_guard lock(mutex_);
    for (AlignedBuffer& buffer : free_) {
      auto it = std::find(pinned_.begin(), pinned_.end(), buffer.data());
      if (it != pinned_.end()) {
        cuda_->cudaHostUnregister(buffer.data());
        pinned_.erase(it);
      }
    }
    allocated_ -= free_.size();
    free_.clear();
  }

 private:
  void release(AlignedBuffer buffer) {
    {
      std::lock_guard lock(mutex_);
      free_.push_back(std::move(buffer));
    }
    available_.notify_one();
  }

  const std::size_t buffer_size_;
  const std::size_t max_buffers_;
  const cuda::Api* cuda_ = nullptr;
  std::mutex mutex_;
  std::condition_variable available_;
  std::vector<AlignedBuffer> free_;
  std::vector<unsigned char*> pinned_;
  std::size_t allocated_ = 0;
};

}  // namespace kvtier::detail
