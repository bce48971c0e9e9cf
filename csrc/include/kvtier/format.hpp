#pragma once

#include <cstddef>
#include <cstdint>

#include <kvtier/export.hpp>
#include <kvtier/version.hpp>

/// The on-disk block file format. docs/FORMAT.md specifies it byte by byte.
namespace kvtier {
inline namespace KVTIER_ABI_NAMESPACE {

/// Size of the header at the start of every block file; the payload starts here.
inline constexpr std::size_t kHeaderSize = 4096;
/// Alignment of payload padding, buffers and offsets (the O_DIRECT unit).
inline constexpr std::size_t kAlignment = 4096;
inline constexpr std::uint32_t kFormatVersion = 1;
/// Bytes at offset 0 of every block file.
inline constexpr char kMagic[8] = {'K', 'V', 'T', 'I', 'E', 'R', 'B', 'K'};
/// The layout fingerprint field holds at most this many bytes.
inline constexpr std::size_t kFingerprintSize = 32;
/// Keys longer than this do not fit in the header.
inline constexpr std::size_t kMaxKeySize = 1024;

/// CRC32C (Castagnoli), on the fastest implementation the CPU runs (see
/// crc32c_implementation()). `crc` is a previous result to continue from (0 to start).
KVTIER_EXPORT std::uint32_t crc32c(const void* data, std::size_t length,
                                   std::uint32_t crc = 0) noexcept;

/// Copies `length` bytes from `src` to `dst` and returns their CRC32C continued from `crc`:
/// the result of memcpy(dst, src, length) then crc32c(dst, length, crc), in one pass over the
/// bytes (the implementation crc32c() runs, copying as it reads). For a copy the bytes make
/// anyway, such as into or out of an engine-owned buffer, the checksum then costs almost
/// nothing more. As for memcpy, `dst` and `src` must not overlap.
KVTIER_EXPORT std::uint32_t crc32c_copy(std::uint32_t crc, void* dst, const void* src,
                                        std::size_t length) noexcept;

/// crc32c_copy() writing `dst` around the CPU's caches where the implementation can
/// (non-temporal stores on the x86-64 folding paths; elsewhere it is crc32c_copy()): every
/// whole 64-byte line of `dst` goes to memory without first being read into the cache (the
/// partial lines at either end, and spans too short for the vector loop, are written through
/// the cache). For a destination
/// the CPU will not read soon (memory a device reads next, a buffer larger than the cache),
/// that saves the memory traffic of fetching each line it overwrites; for one the CPU reads
/// next, crc32c_copy() is faster. The bytes are visible to other threads when it returns, as
/// after crc32c_copy().
KVTIER_EXPORT std::uint32_t crc32c_copy_uncached(std::uint32_t crc, void* dst, const void* src,
                                                 std::size_t length) noexcept;

/// Whether crc32c() runs on CRC or carry-less-multiply instructions (any implementation but
/// "table").
KVTIER_EXPORT bool crc32c_is_hardware() noexcept;

/// The implementation crc32c() runs, chosen on first use: "avx512-vpclmul", "avx2-vpclmul",
/// "sse42" (x86-64), "armv8-pmull", "armv8-crc" (aarch64) or "table" (software). The
/// environment variable KVTIER_CRC32C_IMPL, read once, forces one of those the CPU supports
/// (for tests and measurements; another name is reported on stderr and ignored).
KVTIER_EXPORT const char* crc32c_implementation() noexcept;

/// Round `n` up to a multiple of kAlignment.
constexpr std::size_t align_up(std::size_t n) noexcept {
  return (n + kAlignment - 1) / kAlignment * kAlignment;
}

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
