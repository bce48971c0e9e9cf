#include <kvtier/format.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#elif defined(__aarch64__)
#include <arm_acle.h>
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include "util/crc32c_kernels.hpp"

namespace kvtier {
inline namespace KVTIER_ABI_NAMESPACE {
namespace {

constexpr std::uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli, reflected

// Slicing-by-8 tables for the software path: 8 bytes per step instead of 1.
struct Tables {
  std::uint32_t t[8][256];
  constexpr Tables() : t{} {
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
      t[0][i] = c;
    }
    for (int s = 1; s < 8; ++s)
      for (std::uint32_t i = 0; i < 256; ++i)
        t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
};
constexpr Tables kTables{};

std::uint32_t crc32c_software(const unsigned char* p, std::size_t n, std::uint32_t crc) noexcept {
  while (n >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);  // little-endian host assumed (x86-64, aarch64)
    word ^= crc;
    crc = kTables.t[7][word & 0xFF] ^ kTables.t[6][(word >> 8) & 0xFF] ^
          kTables.t[5][(word >> 16) & 0xFF] ^ kTables.t[4][(word >> 24) & 0xFF] ^
          kTables.t[3][(word >> 32) & 0xFF] ^ kTables.t[2][(word >> 40) & 0xFF] ^
          kTables.t[1][(word >> 48) & 0xFF] ^ kTables.t[0][word >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ kTables.t[0][(crc ^ *p++) & 0xFF];
  return crc;
}

// Advancing a CRC register over n zero bytes is linear over GF(2): this table applies it for
// one fixed n with four lookups. It lets independent CRC streams be joined:
//   state(A || B, from s) = advance(state(A, from s), |B|) ^ state(B, from 0).
struct ZeroAdvance {
  std::uint32_t t[4][256];
  explicit ZeroAdvance(std::size_t nbytes) : t{} {
    std::uint32_t basis[32];
    for (int bit = 0; bit < 32; ++bit) {
      std::uint32_t c = std::uint32_t{1} << bit;
      for (std::size_t i = 0; i < nbytes; ++i) c = (c >> 8) ^ kTables.t[0][c & 0xFF];
      basis[bit] = c;
    }
    for (int k = 0; k < 4; ++k)
      for (std::uint32_t b = 0; b < 256; ++b)
        for (int j = 0; j < 8; ++j)
          if (b & (1u << j)) t[k][b] ^= basis[8 * k + j];
  }
  std::uint32_t operator()(std::uint32_t c) const noexcept {
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
  }
};

// The CRC-instruction path: the CPU's CRC32C instructions (SSE4.2 crc32 on x86-64, the ARMv8
// CRC32 extension on aarch64), compiled for that feature only in these functions and chosen at
// run time, so one binary runs on CPUs with and without it. Where the CPU also has a wide
// carry-less multiply, the folding kernels (util/crc32c_x86.cpp, util/crc32c_arm.cpp) run
// instead: they are several times faster on blocks of a few KiB and more.
#if defined(__x86_64__)
#define KVTIER_CRC32C_TARGET __attribute__((target("sse4.2")))
KVTIER_CRC32C_TARGET inline std::uint32_t crc_word(std::uint32_t c, std::uint64_t w) noexcept {
  return static_cast<std::uint32_t>(_mm_crc32_u64(c, w));
}
KVTIER_CRC32C_TARGET inline std::uint32_t crc_byte(std::uint32_t c, unsigned char b) noexcept {
  return _mm_crc32_u8(c, b);
}
bool cpu_has_crc32c() noexcept {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  return (ecx & bit_SSE4_2) != 0;
}
#elif defined(__aarch64__)
#define KVTIER_CRC32C_TARGET __attribute__((target("+crc")))
KVTIER_CRC32C_TARGET inline std::uint32_t crc_word(std::uint32_t c, std::uint64_t w) noexcept {
  return __crc32cd(c, w);
}
KVTIER_CRC32C_TARGET inline std::uint32_t crc_byte(std::uint32_t c, unsigned char b) noexcept {
  return __crc32cb(c, b);
}
// The kernel reports the optional CRC32 extension (Graviton, Grace, Ampere and every ARMv8.1+
// core have it) in the auxiliary vector; reading it needs no privileged instruction.
bool cpu_has_crc32c() noexcept {
  return (::getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
}
#endif

#if defined(KVTIER_CRC32C_TARGET)
// Bytes each of the three interleaved streams covers per round.
constexpr std::size_t kLane = 4096;

KVTIER_CRC32C_TARGET std::uint32_t crc32c_hardware(const unsigned char* p, std::size_t n,
                                                   std::uint32_t crc) noexcept {
  // A crc32 instruction has a latency of 2-3 cycles but issues every cycle (x86-64 and ARM
  // server cores alike): three independent streams over adjacent lanes keep it busy (about 3x
  // one stream), then are joined.
  static const ZeroAdvance by_lane(kLane), by_two_lanes(2 * kLane);
  std::uint32_t c = crc;
  while (n >= 3 * kLane) {
    std::uint32_t c1 = 0, c2 = 0;
    for (std::size_t i = 0; i < kLane; i += 8) {
      std::uint64_t w0, w1, w2;
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p + kLane + i, 8);
      std::memcpy(&w2, p + 2 * kLane + i, 8);
      c = crc_word(c, w0);
      c1 = crc_word(c1, w1);
      c2 = crc_word(c2, w2);
    }
    c = by_two_lanes(c) ^ by_lane(c1) ^ c2;
    p += 3 * kLane;
    n -= 3 * kLane;
  }
  while (n >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c = crc_word(c, word);
    p += 8;
    n -= 8;
  }
  while (n--) c = crc_byte(c, *p++);
  return c;
}

#endif

// ---- copy and CRC -------------------------------------------------------------------------

// The folding kernels copy from the registers they fold (crc32c_copy_* in crc32c_x86.cpp and
// crc32c_arm.cpp). The other paths copy a block small enough to stay in the L1 data cache
// with its source (2 x 12 KiB of at least 32 KiB on every x86-64 and ARMv8 server core), then
// run the CRC over the block just written: the CRC reads the cache, not memory, so the second
// pass costs little. 12 KiB is one round of the crc32 path's three 4 KiB lanes.
constexpr std::size_t kCopyBlock = 3 * 4096;

template <detail::Crc32cKernel kKernel>
std::uint32_t copy_in_blocks(unsigned char* dst, const unsigned char* src, std::size_t n,
                             std::uint32_t state) noexcept {
  while (n > 0) {
    const std::size_t block = n < kCopyBlock ? n : kCopyBlock;
    std::memcpy(dst, src, block);
    state = kKernel(dst, block, state);
    dst += block;
    src += block;
    n -= block;
  }
  return state;
}

// ---- dispatch ---------------------------------------------------------------------------

struct Implementation {
  const char* name;
  detail::Crc32cKernel kernel;
  detail::Crc32cCopyKernel copy;  // the same CRC, the bytes copied on the way
  // The copy with non-temporal stores; the same as `copy` where there are none.
  detail::Crc32cCopyKernel copy_uncached;
  bool (*supported)() noexcept;
  bool hardware;  // runs on CRC or carry-less-multiply instructions
};

bool always() noexcept {
  return true;
}

// Fastest first: the first one this CPU supports runs, unless $KVTIER_CRC32C_IMPL names
// another supported one.
constexpr Implementation kImplementations[] = {
#if defined(__x86_64__)
    {"avx512-vpclmul", detail::crc32c_avx512_vpclmul, detail::crc32c_copy_avx512_vpclmul,
     detail::crc32c_copy_uncached_avx512_vpclmul, detail::crc32c_avx512_vpclmul_supported, true},
    {"avx2-vpclmul", detail::crc32c_avx2_vpclmul, detail::crc32c_copy_avx2_vpclmul,
     detail::crc32c_copy_uncached_avx2_vpclmul, detail::crc32c_avx2_vpclmul_supported, true},
    {"sse42", crc32c_hardware, copy_in_blocks<crc32c_hardware>, copy_in_blocks<crc32c_hardware>,
     cpu_has_crc32c, true},
#elif defined(__aarch64__)
    {"armv8-pmull", detail::crc32c_armv8_pmull, detail::crc32c_copy_armv8_pmull,
     detail::crc32c_copy_armv8_pmull, detail::crc32c_armv8_pmull_supported, true},
    {"armv8-crc", crc32c_hardware, copy_in_blocks<crc32c_hardware>, copy_in_blocks<crc32c_hardware>,
     cpu_has_crc32c, true},
#endif
    {"table", crc32c_software, copy_in_blocks<crc32c_software>, copy_in_blocks<crc32c_software>,
     always, false},
};

const Implementation* find_supported(const char* name) noexcept {
  for (const Implementation& impl : kImplementations)
    if (std::strcmp(impl.name, name) == 0) return impl.supported() ? &impl : nullptr;
  return nullptr;
}

const Implementation& choose() noexcept {
  const Implementation* automatic = nullptr;
  for (const Implementation& impl : kImplementations) {
    if (impl.supported()) {
      automatic = &impl;
      break;
    }
  }
  // Forcing a path is for tests and measurements; a name this CPU cannot run is reported and
  // ignored, since crc32c() cannot fail.
  const char* forced = std::getenv("KVTIER_CRC32C_IMPL");
  if (forced == nullptr || *forced == '\0' || std::strcmp(forced, "auto") == 0) return *automatic;
  if (const Implementation* impl = find_supported(forced)) return *impl;
  std::string names;
  for (const Implementation& impl : kImplementations)
    if (impl.supported()) names += std::string(names.empty() ? "" : ", ") + impl.name;
  std::fprintf(stderr,
               "kvtier: KVTIER_CRC32C_IMPL=%s is not a CRC32C implementation this CPU runs "
               "(supported here: auto, %s); using %s\n",
               forced, names.c_str(), automatic->name);
  return *automatic;
}

/// The implementation crc32c() runs, chosen on first use (thread-safe static).
const Implementation& selected() noexcept {
  static const Implementation& impl = choose();
  return impl;
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t length, std::uint32_t crc) noexcept {
  return ~selected().kernel(static_cast<const unsigned char*>(data), length, ~crc);
}

std::uint32_t crc32c_copy(std::uint32_t crc, void* dst, const void* src,
                          std::size_t length) noexcept {
  return ~selected().copy(static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src),
                          length, ~crc);
}

std::uint32_t crc32c_copy_uncached(std::uint32_t crc, void* dst, const void* src,
                                   std::size_t length) noexcept {
  return ~selected().copy_uncached(static_cast<unsigned char*>(dst),
                                   static_cast<const unsigned char*>(src), length, ~crc);
}

bool crc32c_is_hardware() noexcept {
  return selected().hardware;
}

const char* crc32c_implementation() noexcept {
  return selected().name;
}

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
