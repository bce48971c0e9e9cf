#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include <kvtier/format.hpp>

namespace kvtier::detail {

/// A kAlignment-aligned heap buffer (what O_DIRECT needs for addresses and lengths).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t size) : size_(align_up(size)) {
    data_ = static_cast<unsigned char*>(std::aligned_alloc(kAlignment, size_));
    if (data_ == nullptr) throw std::bad_alloc();
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(AlignedBuffer&& other) noexcept : data_(other.data_), size_(other.size_) {
    other.data_ = nullptr;
    other.size_ = 0;
  }
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  unsigned char* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

/// A bounded pool of equally sized staging buffers, allocated on first use.
/// acquire() blocks while all buffers are lent out; the total never exceeds the cap.
class StagingPool {
 public:
  StagingPool(std::size_t buffer_size, std::size_t total_bytes)
      : buffer_size_(align_up(buffer_size)),
        max_buffers_(total_bytes / buffer_size_ > 0 ? total_bytes / buffer_size_ : 1) {}

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
      return Lease(this, AlignedBuffer(buffer_size_));
    } catch (...) {
      std::lock_guard relock(mutex_);
      --allocated_;
      available_.notify_one();
      throw;
    }
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
  std::mutex mutex_;
  std::condition_variable available_;
  std::vector<AlignedBuffer> free_;
  std::size_t allocated_ = 0;
};

}  // namespace kvtier::detail
