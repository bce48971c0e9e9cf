// CRC32C by carry-less-multiply folding on aarch64: PMULL/PMULL2 (the crypto extension's
// 64 x 64-bit polynomial multiply) on eight 128-bit accumulators, and the CRC32 extension's
// crc32cx/crc32cb for the reduction and the last bytes. The arithmetic and its constants are in
// crc32c_fold.hpp; the x86 kernels (crc32c_x86.cpp) have the same shape, and a similar
// Stream: written once, the kernel either only reads its bytes or also stores every vector it
// loaded to a destination (crc32c_copy).
#if defined(__aarch64__)

#include <arm_acle.h>
#include <arm_neon.h>
#include <asm/hwcap.h>
#include <sys/auxv.h>

#include <cstring>

#include "crc32c_fold.hpp"
#include "crc32c_kernels.hpp"

#define KVTIER_CRC_TARGET_PMULL __attribute__((target("+crc+crypto")))
#define KVTIER_CRC_INLINE_PMULL __attribute__((target("+crc+crypto"), always_inline)) inline

namespace kvtier::detail {
namespace {

using crc32c_fold::FoldConstants;
using crc32c_fold::kFoldBy;
using crc32c_fold::kOntoLast;

constexpr std::size_t kChunk = 16;
// Eight chains of multiply + XOR keep a core with two or more multiply pipes busy despite the
// multiplies' latency (Neoverse N1/V1/V2: 2-3 cycles, up to 4 per cycle).
constexpr std::size_t kAccumulators = 8;

/// Where the kernel's bytes come from, and where they go when it copies too (kCopy): every
/// vector loaded from `src` is stored at the same offset of `dst`.
template <bool kCopy>
struct Stream {
  const unsigned char* src;
  unsigned char* dst;  // unused without kCopy
  void advance(std::size_t k) {
    src += k;
    if constexpr (kCopy) dst += k;
  }
  /// Copies the last `n` bytes, which the scalar steps then read from src (kCopy only).
  void copy_rest(std::size_t n) const {
    if constexpr (kCopy) std::memcpy(dst, src, n);
  }
};

template <bool kCopy>
KVTIER_CRC_INLINE_PMULL uint64x2_t load128(const Stream<kCopy>& s, std::size_t at) {
  const uint8x16_t v = vld1q_u8(s.src + at);
  if constexpr (kCopy) vst1q_u8(s.dst + at, v);
  return vreinterpretq_u64_u8(v);
}

KVTIER_CRC_INLINE_PMULL poly64x2_t constants128(FoldConstants k) {
  const std::uint64_t lanes[2] = {k.high_half, k.low_half};
  return vreinterpretq_p64_u64(vld1q_u64(lanes));
}

/// x folded forward by the distance k was made for: low lanes multiplied, high lanes
/// multiplied, XORed.
KVTIER_CRC_INLINE_PMULL uint64x2_t fold128(uint64x2_t x, poly64x2_t k) {
  const poly64x2_t px = vreinterpretq_p64_u64(x);
  const poly128_t low = vmull_p64(vgetq_lane_p64(px, 0), vgetq_lane_p64(k, 0));
  const poly128_t high = vmull_high_p64(px, k);
  return veorq_u64(vreinterpretq_u64_p128(low), vreinterpretq_u64_p128(high));
}

KVTIER_CRC_INLINE_PMULL std::uint32_t crc_bytes(std::uint32_t c, const unsigned char* p,
                                                std::size_t n) {
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c = __crc32cd(c, word);
  }
  for (; n > 0; --n) c = __crc32cb(c, *p++);
  return c;
}

template <bool kCopy>
KVTIER_CRC_INLINE_PMULL std::uint32_t pmull_fold(Stream<kCopy> s, std::size_t n,
                                                 std::uint32_t state) {
  if (n < kAccumulators * kChunk) {
    s.copy_rest(n);
    return crc_bytes(state, s.src, n);
  }
  const std::uint64_t start_lanes[2] = {state, 0};
  uint64x2_t x[kAccumulators];
  // The loops over the accumulators are unrolled, so that they live in registers.
#pragma GCC unroll 16
  for (std::size_t i = 0; i < kAccumulators; ++i) x[i] = load128(s, i * kChunk);
  x[0] = veorq_u64(x[0], vld1q_u64(start_lanes));
  s.advance(kAccumulators * kChunk);
  n -= kAccumulators * kChunk;

  constexpr std::size_t kRound = kAccumulators * kChunk;
  const poly64x2_t k_round = constants128(kFoldBy<kRound>);
  for (; n >= kRound; s.advance(kRound), n -= kRound)
#pragma GCC unroll 16
    for (std::size_t i = 0; i < kAccumulators; ++i)
      x[i] = veorq_u64(fold128(x[i], k_round), load128(s, i * kChunk));

  // Every accumulator onto the last one, (kAccumulators - 1 - i) chunks ahead.
  uint64x2_t acc = x[kAccumulators - 1];
#pragma GCC unroll 16
  for (std::size_t i = 0; i + 1 < kAccumulators; ++i)
    acc = veorq_u64(acc,
                    fold128(x[i], constants128(kOntoLast<kAccumulators, kChunk>.by_register[i])));

  const poly64x2_t k16 = constants128(kFoldBy<kChunk>);
  for (; n >= kChunk; s.advance(kChunk), n -= kChunk)
    acc = veorq_u64(fold128(acc, k16), load128(s, 0));
  std::uint32_t c = __crc32cd(0, vgetq_lane_u64(acc, 0));
  c = __crc32cd(c, vgetq_lane_u64(acc, 1));
  s.copy_rest(n);
  return crc_bytes(c, s.src, n);
}

}  // namespace

KVTIER_CRC_TARGET_PMULL std::uint32_t crc32c_armv8_pmull(const unsigned char* p, std::size_t n,
                                                         std::uint32_t state) noexcept {
  return pmull_fold(Stream<false>{p, nullptr}, n, state);
}

KVTIER_CRC_TARGET_PMULL std::uint32_t crc32c_copy_armv8_pmull(unsigned char* dst,
                                                              const unsigned char* src,
                                                              std::size_t n,
                                                              std::uint32_t state) noexcept {
  return pmull_fold(Stream<true>{src, dst}, n, state);
}

// The kernel reports the optional extensions in the auxiliary vector; reading it needs no
// privileged instruction. Every core with PMULL that kvtier targets also has CRC32, but both
// are checked, since the reduction uses crc32cx.
bool crc32c_armv8_pmull_supported() noexcept {
  const unsigned long hwcap = ::getauxval(AT_HWCAP);
  return (hwcap & HWCAP_PMULL) != 0 && (hwcap & HWCAP_CRC32) != 0;
}

}  // namespace kvtier::detail

#endif  // __aarch64__
