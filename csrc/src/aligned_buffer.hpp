#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>
#include <utility>

#include <kvtier/format.hpp>

namespace kvtier::detail {

// PROTOTYPE (issue #23) switches, read from the environment when an engine is created
// (proto_read_env in engine.cpp): one engine at a time in the prototype benchmarks.
inline bool g_proto_huge = false;
inline int g_proto_stage = 0;  // bit 0: loads, bit 1: stores

/// A kAlignment-aligned heap buffer (what O_DIRECT needs for addresses and lengths).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t size) : size_(align_up(size)) {
    // PROTOTYPE (issue #23): buffers of 2 MiB and more in transparent huge pages, so that a
    // read into them is one physically contiguous segment, not one per 4 KiB page.
    constexpr std::size_t kHuge = std::size_t{2} << 20;
    if (g_proto_huge && size_ >= kHuge) {
      const std::size_t len = (size_ + kHuge - 1) / kHuge * kHuge;
      data_ = static_cast<unsigned char*>(std::aligned_alloc(kHuge, len));
      if (data_ == nullptr) throw std::bad_alloc();
      ::madvise(data_, len, MADV_HUGEPAGE);
      return;
    }
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
