#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <utility>

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

}  // namespace kvtier::detail
