// AlignedBuffer: kAlignment-aligned below 2 MiB as before; from 2 MiB a mapping of its own,
// 2 MiB-aligned, advised for transparent huge pages and pre-faulted (every page resident when
// the constructor returns), unmapped when destroyed; moves keep the memory.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "device/aligned_buffer.hpp"
#include "harness.hpp"

namespace {

using kvtier::kAlignment;
using kvtier::detail::AlignedBuffer;
using kvtier::detail::kHugePageSize;

std::uintptr_t address(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

/// Every page of [p, p + n) is resident (mincore), i.e. was faulted in.
bool all_resident(const unsigned char* p, std::size_t n) {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> present((n + page - 1) / page);
  if (::mincore(const_cast<unsigned char*>(p), n, present.data()) != 0) return false;
  for (unsigned char v : present)
    if ((v & 1u) == 0) return false;
  return true;
}

/// Whether [p, p + n) is mapped at all: mincore fails with ENOMEM on an unmapped range.
bool mapped(const unsigned char* p, std::size_t n) {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> present((n + page - 1) / page);
  if (::mincore(const_cast<unsigned char*>(p), n, present.data()) == 0) return true;
  CHECK_EQ(errno, ENOMEM);
  return false;
}

/// The /proc/self/smaps entry of the mapping holding `p`: its "VmFlags:" and "AnonHugePages:"
/// lines (empty if not found).
struct Smaps {
  std::string vm_flags;
  std::string anon_huge_pages;
};
Smaps smaps_of(const void* p) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false;
  Smaps out;
  while (std::getline(in, line)) {
    unsigned long long start = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    // A mapping's first line is "start-end perms ...", in hex; the fields after it are
    // "Name:   value".
    if (head >> std::hex >> start >> dash >> end && dash == '-') {
      inside = start <= address(p) && address(p) < end;
      continue;
    }
    if (!inside) continue;
    if (line.rfind("VmFlags:", 0) == 0) out.vm_flags = line;
    if (line.rfind("AnonHugePages:", 0) == 0) out.anon_huge_pages = line;
  }
  return out;
}

bool kernel_has_thp() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  return static_cast<bool>(in);
}

/// Every byte writable and read back (a pattern that differs per page).
void check_usable(const AlignedBuffer& b) {
  for (std::size_t at = 0; at < b.size(); at += 512)
    b.data()[at] = static_cast<unsigned char>(at / 512);
  b.data()[b.size() - 1] = 0x5A;
  for (std::size_t at = 0; at < b.size(); at += 512)
    if (b.data()[at] != static_cast<unsigned char>(at / 512)) FAIL("byte " + std::to_string(at));
  CHECK_EQ(b.data()[b.size() - 1], static_cast<unsigned char>(0x5A));
}

}  // namespace

KV_TEST(small_buffers_are_page_aligned_heap_buffers) {
  for (std::size_t size : {std::size_t{1}, kAlignment, kAlignment + 1, std::size_t{256 << 10},
                           kHugePageSize - kAlignment}) {
    AlignedBuffer b(size);
    CHECK(b.data() != nullptr);
    CHECK_EQ(address(b.data()) % kAlignment, std::uintptr_t{0});
    CHECK_EQ(b.size(), kvtier::align_up(size));
    CHECK(!b.huge_pages());
    check_usable(b);
  }
  AlignedBuffer none;
  CHECK(none.data() == nullptr);
  CHECK_EQ(none.size(), std::size_t{0});
}

KV_TEST(buffers_from_2_mib_are_huge_page_aligned_and_pre_faulted) {
  // 2 MiB - 1 rounds up to 2 MiB; 2 MiB + 4 KiB is a block with its header.
  for (std::size_t size : {kHugePageSize - 1, kHugePageSize, kHugePageSize + kAlignment,
                           3 * kHugePageSize + 17}) {
    AlignedBuffer b(size);
    CHECK(b.huge_pages());
    CHECK_EQ(b.size(), kvtier::align_up(size));
    CHECK_EQ(address(b.data()) % kHugePageSize, std::uintptr_t{0});
    // Pre-faulted: present before anything wrote to it, and (fresh anonymous memory) zero.
    CHECK(all_resident(b.data(), b.size()));
    bool zero = true;
    for (std::size_t at = 0; at < b.size(); ++at) zero = zero && b.data()[at] == 0;
    CHECK(zero);
    const Smaps s = smaps_of(b.data());
    std::printf("  %zu bytes at %p: %s; %s\n", b.size(), static_cast<void*>(b.data()),
                s.vm_flags.c_str(), s.anon_huge_pages.c_str());
    // Advised (VmFlags "hg") wherever the kernel has THP; whether it granted huge pages depends
    // on free contiguous memory, so AnonHugePages is shown, not required.
    if (kernel_has_thp()) CHECK_MSG(s.vm_flags.find(" hg") != std::string::npos, s.vm_flags);
    check_usable(b);
  }
}

KV_TEST(a_huge_page_buffer_maps_exactly_its_size_and_unmaps_when_destroyed) {
  unsigned char* data = nullptr;
  std::size_t size = 0;
  {
    AlignedBuffer b(kHugePageSize + kAlignment);
    data = b.data();
    size = b.size();
    CHECK(mapped(data, size));
  }
  // Nothing else maps memory between the destructor and this check (one thread).
  CHECK(!mapped(data, size));
}

KV_TEST(moves_keep_the_memory) {
  for (std::size_t size : {std::size_t{8192}, kHugePageSize + kAlignment}) {
    AlignedBuffer a(size);
    std::memset(a.data(), 0xC3, a.size());
    unsigned char* const data = a.data();
    AlignedBuffer b(std::move(a));
    CHECK(b.data() == data);
    CHECK_EQ(b.size(), kvtier::align_up(size));
    CHECK(a.data() == nullptr);
    CHECK_EQ(a.size(), std::size_t{0});
    CHECK(!a.huge_pages());
    CHECK_EQ(b.huge_pages(), size >= kHugePageSize);
    AlignedBuffer c(4096);
    c = std::move(b);
    CHECK(c.data() == data);
    CHECK_EQ(c.data()[c.size() - 1], static_cast<unsigned char>(0xC3));
    // A vector of buffers relocating them (the staging pool's free list).
    std::vector<AlignedBuffer> many;
    for (int i = 0; i < 5; ++i) many.emplace_back(size);
    many.push_back(std::move(c));
    CHECK(many.back().data() == data);
    for (const AlignedBuffer& m : many) check_usable(m);
  }
}
