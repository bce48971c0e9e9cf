#pragma once
// The carry-less-multiply CRC32C kernels. kvtier::crc32c (crc32c.cpp) runs one of them, chosen
// once at run time, or its own crc32-instruction and table paths. Each kernel is compiled for
// its instruction set alone (function target attributes), so the rest of the library keeps the
// baseline ISA; calling one on a CPU whose *_supported() is false is undefined.
//
// A kernel takes and returns the raw CRC register (the caller applies the definition's
// inversions), so calls chain: kernel(b, nb, kernel(a, na, s)) == kernel(a || b, na + nb, s).
//
// Each folding kernel has a copying twin (crc32c_copy_*): the same CRC of `src`, with every
// byte also written to `dst` from the registers the fold loaded it into (one pass over the
// bytes instead of a memcpy and a CRC). `dst` and `src` must not overlap. On x86-64 each also
// has an uncached twin (crc32c_copy_uncached_*): the same copy with non-temporal stores and a
// store fence at the end (kvtier::crc32c_copy_uncached).

#include <cstddef>
#include <cstdint>

namespace kvtier::detail {

using Crc32cKernel = std::uint32_t (*)(const unsigned char* data, std::size_t length,
                                       std::uint32_t state) noexcept;
using Crc32cCopyKernel = std::uint32_t (*)(unsigned char* dst, const unsigned char* src,
                                           std::size_t length, std::uint32_t state) noexcept;

#if defined(__x86_64__)
/// 4 x 64-byte folds with AVX-512 VPCLMULQDQ; needs AVX512F, VPCLMULQDQ, PCLMULQDQ, SSE4.2
/// and the OS saving the zmm state.
std::uint32_t crc32c_avx512_vpclmul(const unsigned char* data, std::size_t length,
                                    std::uint32_t state) noexcept;
std::uint32_t crc32c_copy_avx512_vpclmul(unsigned char* dst, const unsigned char* src,
                                         std::size_t length, std::uint32_t state) noexcept;
std::uint32_t crc32c_copy_uncached_avx512_vpclmul(unsigned char* dst, const unsigned char* src,
                                                  std::size_t length, std::uint32_t state) noexcept;
bool crc32c_avx512_vpclmul_supported() noexcept;

/// 4 x 32-byte folds with 256-bit VPCLMULQDQ (CPUs with AVX2 and VPCLMULQDQ but no AVX-512,
/// such as AMD Zen 3 or Intel Alder Lake); needs AVX2, VPCLMULQDQ, PCLMULQDQ, SSE4.2 and the
/// OS saving the ymm state.
std::uint32_t crc32c_avx2_vpclmul(const unsigned char* data, std::size_t length,
                                  std::uint32_t state) noexcept;
std::uint32_t crc32c_copy_avx2_vpclmul(unsigned char* dst, const unsigned char* src,
                                       std::size_t length, std::uint32_t state) noexcept;
std::uint32_t crc32c_copy_uncached_avx2_vpclmul(unsigned char* dst, const unsigned char* src,
                                                std::size_t length, std::uint32_t state) noexcept;
bool crc32c_avx2_vpclmul_supported() noexcept;
#elif defined(__aarch64__)
/// 8 x 16-byte folds with PMULL (the ARMv8 crypto extension's 64-bit polynomial multiply) and
/// the CRC32 instructions for the last bytes; needs HWCAP_PMULL and HWCAP_CRC32.
std::uint32_t crc32c_armv8_pmull(const unsigned char* data, std::size_t length,
                                 std::uint32_t state) noexcept;
std::uint32_t crc32c_copy_armv8_pmull(unsigned char* dst, const unsigned char* src,
                                      std::size_t length, std::uint32_t state) noexcept;
bool crc32c_armv8_pmull_supported() noexcept;
#endif

}  // namespace kvtier::detail
