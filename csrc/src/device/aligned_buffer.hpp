#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>

#include <kvtier/format.hpp>

namespace kvtier::detail {

/// The x86-64 and aarch64 (4 KiB granule) transparent huge page size; buffers at least this
/// large are huge-page buffers (see AlignedBuffer).
inline constexpr std::size_t kHugePageSize = std::size_t{2} << 20;

/// A kAlignment-aligned heap buffer (what O_DIRECT needs for addresses and lengths).
///
/// A buffer of kHugePageSize bytes or more (the engine's staging and bounce buffers) is a
/// mapping of its own, kHugePageSize-aligned, advised for transparent huge pages and
/// pre-faulted:
/// - huge pages: each whole 2 MiB of it is then one physically contiguous piece, so an
///   O_DIRECT read or write of a block is one request of one or two memory segments instead of
///   one segment per 4 KiB page. On a virtio disk without indirect descriptors that decides how
///   many bytes fit in flight: loads staged through such buffers ran about 2x faster
///   (docs/perf/disk-loads-investigation.md, section 6). Where THP is off ("never") the advice
///   changes nothing and the buffer is in 4 KiB pages, as smaller buffers are.
/// - pre-faulted: every page is written once here, so the first I/O into the buffer does not
///   pay a page fault per page (or per huge page).
/// The mapping is exactly size() bytes long: a 2 MiB + 4 KiB buffer (a block and its header)
/// is one huge page and one small page, not two huge pages.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t size) : size_(align_up(size)) {
    if (size_ >= kHugePageSize) {
      data_ = map_huge_pages(size_);
      mapped_ = true;
      return;
    }
    data_ = static_cast<unsigned char*>(std::aligned_alloc(kAlignment, size_));
    if (data_ == nullptr) throw std::bad_alloc();
  }
  ~AlignedBuffer() { release(); }
  AlignedBuffer(AlignedBuffer&& other) noexcept
      : data_(other.data_), size_(other.size_), mapped_(other.mapped_) {
    other.data_ = nullptr;
    other.size_ = 0;
    other.mapped_ = false;
  }
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(mapped_, other.mapped_);
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  unsigned char* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  /// Whether this is a huge-page buffer (its own mapping, kHugePageSize-aligned).
  bool huge_pages() const noexcept { return mapped_; }

 private:
  void release() noexcept {
    if (mapped_) {
      ::munmap(data_, size_);
    } else {
      std::free(data_);
    }
  }

  // `length` bytes (a multiple of kAlignment) at a kHugePageSize-aligned address: a mapping
  // one huge page longer than asked, its unaligned head and the tail past `length` unmapped.
  static unsigned char* map_huge_pages(std::size_t length) {
    const std::size_t reserved = length + kHugePageSize;
    void* raw = ::mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const auto base = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t start = (base + kHugePageSize - 1) & ~(kHugePageSize - 1);
    if (start > base) ::munmap(raw, start - base);
    const std::uintptr_t end = start + length;
    if (base + reserved > end) ::munmap(reinterpret_cast<void*>(end), base + reserved - end);
    auto* data = reinterpret_cast<unsigned char*>(start);
    // Before the first fault, so that the faults below allocate huge pages. Refused only where
    // the kernel has no THP at all (EINVAL), which leaves ordinary pages.
    ::madvise(data, length, MADV_HUGEPAGE);
    // A write to every page faults it in (a huge page at the first write into each 2 MiB where
    // THP grants one; the other writes then cost nothing). Volatile, so the stores of the zero
    // the page already holds are not optimised away.
    for (std::size_t at = 0; at < length; at += kAlignment)
      static_cast<volatile unsigned char*>(data)[at] = 0;
    return data;
  }

  unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
  bool mapped_ = false;
};

}  // namespace kvtier::detail
