#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "device/aligned_buffer.hpp"
#include "device/cuda_runtime.hpp"

namespace kvtier::detail {

/// A bounded pool of equally sized staging buffers, allocated on first use and pinned
/// (registered with CUDA) when a runtime is given, so device copies run at full speed.
/// acquire() blocks while all buffers are lent out; the total never exceeds the cap.
///
/// Each buffer has an index below max_buffers(), kept while it lives, and an id no other
/// buffer of the process ever gets: an io_uring's fixed-buffer table (io/io_uring_engine.cpp)
/// holds buffer `index` in slot `index` and re-registers the slot when the id changes (a
/// buffer freed and reallocated may come back at the same address on other pages).
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
  std::size_t max_buffers() const noexcept { return max_buffers_; }

  /// A staging buffer with its index in the pool and its process-wide unique id.
  struct Buffer {
    AlignedBuffer memory;
    std::size_t index = 0;
    std::uint64_t id = 0;
  };

  /// A buffer on loan; returns itself to the pool when destroyed.
  class Lease {
   public:
    Lease(StagingPool* pool, Buffer buffer) : pool_(pool), buffer_(std::move(buffer)) {}
    ~Lease() {
      if (pool_ != nullptr) pool_->release(std::move(buffer_));
    }
    Lease(Lease&& other) noexcept : pool_(other.pool_), buffer_(std::move(other.buffer_)) {
      other.pool_ = nullptr;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;
    unsigned char* data() const noexcept { return buffer_.memory.data(); }
    std::size_t size() const noexcept { return buffer_.memory.size(); }
    std::size_t index() const noexcept { return buffer_.index; }
    std::uint64_t id() const noexcept { return buffer_.id; }

   private:
    StagingPool* pool_;
    Buffer buffer_;
  };

  Lease acquire() {
    std::unique_lock lock(mutex_);
    available_.wait(lock, [&] { return !free_.empty() || allocated_ < max_buffers_; });
    return lend(lock);
  }

  /// A buffer if one is free or may still be allocated, without waiting. For a caller that
  /// already holds leases: waiting for a buffer while holding others could wait forever.
  std::optional<Lease> try_acquire() {
    std::unique_lock lock(mutex_);
    if (free_.empty() && allocated_ >= max_buffers_) return std::nullopt;
    return lend(lock);
  }

  /// Frees every buffer not on loan (at shutdown, when none are).
  void release_all() noexcept {
    std::lock_guard lock(mutex_);
    for (Buffer& buffer : free_) {
      auto it = std::find(pinned_.begin(), pinned_.end(), buffer.memory.data());
      if (it != pinned_.end()) {
        cuda_->cudaHostUnregister(buffer.memory.data());
        pinned_.erase(it);
      }
      spare_indices_.push_back(buffer.index);
    }
    allocated_ -= free_.size();
    free_.clear();
  }

 private:
  // Called with `lock` held and a buffer free or allocatable.
  Lease lend(std::unique_lock<std::mutex>& lock) {
    if (!free_.empty()) {
      Buffer buffer = std::move(free_.back());
      free_.pop_back();
      return Lease(this, std::move(buffer));
    }
    // Room for everything a buffer adds to the pool's lists, made while nothing has changed
    // yet: giving a buffer back (the lease's destructor) and putting its index back then
    // never allocate.
    free_.reserve(allocated_ + 1);
    spare_indices_.reserve(next_index_ + 1);
    pinned_.reserve(allocated_ + 1);
    ++allocated_;
    std::size_t index = next_index_;
    if (spare_indices_.empty()) {
      ++next_index_;
    } else {
      index = spare_indices_.back();
      spare_indices_.pop_back();
    }
    const std::uint64_t id = next_id();
    lock.unlock();
    try {
      Buffer buffer{AlignedBuffer(buffer_size_), index, id};
      // Unpinned memory still works (the runtime stages it itself), only slower, so a failed
      // registration is not an error. Portable: pinned for every device, not only the one
      // current on the worker thread that happens to allocate the buffer.
      unsigned char* data = buffer.memory.data();
      if (cuda_ != nullptr &&
          cuda_->cudaHostRegister(data, buffer_size_, cuda::kHostRegisterPortable) ==
              cuda::kSuccess) {
        std::lock_guard relock(mutex_);
        pinned_.push_back(data);
      } else if (cuda_ != nullptr) {
        cuda_->cudaGetLastError();
      }
      return Lease(this, std::move(buffer));
    } catch (...) {
      std::lock_guard relock(mutex_);
      --allocated_;
      spare_indices_.push_back(index);
      available_.notify_one();
      throw;
    }
  }

  // Never allocates: lend() reserved room for every buffer there is.
  void release(Buffer buffer) noexcept {
    {
      std::lock_guard lock(mutex_);
      free_.push_back(std::move(buffer));
    }
    available_.notify_one();
  }

  static std::uint64_t next_id() noexcept {
    static std::atomic<std::uint64_t> last{0};
    return last.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  const std::size_t buffer_size_;
  const std::size_t max_buffers_;
  const cuda::Api* cuda_ = nullptr;
  std::mutex mutex_;
  std::condition_variable available_;
  std::vector<Buffer> free_;
  std::vector<unsigned char*> pinned_;
  std::vector<std::size_t> spare_indices_;  // indices below next_index_ no buffer holds
  std::size_t next_index_ = 0;
  std::size_t allocated_ = 0;
};

}  // namespace kvtier::detail
