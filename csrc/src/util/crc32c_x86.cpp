// CRC32C by carry-less-multiply folding on x86-64: VPCLMULQDQ on 512-bit (AVX-512) or 256-bit
// (AVX2) registers for the bulk, PCLMULQDQ on 128 bits and the SSE4.2 crc32 instruction for the
// end. The arithmetic and its constants are in crc32c_fold.hpp.
//
// Why folding: the crc32 instruction takes 8 bytes per cycle at best (one per cycle, three
// interleaved streams to cover its latency). A fold takes two independent multiplies per 128
// bits with no serial dependency between lanes, so a 512-bit register moves 64 bytes per two
// multiplies and the loop keeps up with the L2 cache.
//
// Each kernel is written once, over a Stream that either only reads the bytes (the CRC) or
// also stores every vector it loaded to a destination (the fused copy, crc32c_copy): the
// bytes are in a register anyway, so the copy costs one store per load and no second pass.
// The uncached copy (crc32c_copy_uncached) stores the vectors with non-temporal stores, which
// write whole lines to memory without reading them into the cache first: for a destination the
// CPU will not read soon, that saves the memory traffic of fetching every line it overwrites.
#if defined(__x86_64__)

#include <cpuid.h>
#include <immintrin.h>

#include <cstring>

#include "crc32c_fold.hpp"
#include "crc32c_kernels.hpp"

// GCC 12 reports -Wmaybe-uninitialized inside its own AVX-512 headers for intrinsics built on
// _mm*_undefined_* (GCC bug 105593, fixed in GCC 13), a false positive that -Werror turns into a
// failed build.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// Each group of helpers is compiled for exactly the instructions it uses; the kernels that
// call them enable a superset, which lets the compiler inline them.
#define KVTIER_CRC_TARGET_SSE __attribute__((target("sse4.2,pclmul"), always_inline)) inline
#define KVTIER_CRC_TARGET_AVX2 __attribute__((target("avx2,vpclmulqdq,sse4.2,pclmul")))
#define KVTIER_CRC_TARGET_AVX512 __attribute__((target("avx512f,vpclmulqdq,sse4.2,pclmul")))

namespace kvtier::detail {
namespace {

using crc32c_fold::FoldConstants;
using crc32c_fold::kFoldBy;
using crc32c_fold::kOntoLast;

// ---- 128-bit steps (SSE4.2 + PCLMULQDQ): the end of every kernel ----------------------------

KVTIER_CRC_TARGET_SSE __m128i constants128(FoldConstants k) {
  return _mm_set_epi64x(static_cast<long long>(k.low_half), static_cast<long long>(k.high_half));
}

/// x folded forward by the distance k was made for (add the chunk there to it).
KVTIER_CRC_TARGET_SSE __m128i fold128(__m128i x, __m128i k) {
  return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

KVTIER_CRC_TARGET_SSE std::uint32_t crc_bytes(std::uint32_t crc, const unsigned char* p,
                                              std::size_t n) {
  std::uint64_t c = crc;
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  auto c32 = static_cast<std::uint32_t>(c);
  for (; n > 0; --n) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

/// What a kernel does with the bytes besides the CRC.
enum class Copy {
  kNone,      // nothing: the CRC alone
  kCached,    // every vector loaded from `src` stored at the same offset of `dst`
  kUncached,  // the same with non-temporal stores for the wide vectors; `dst` must be aligned
              // to 64 bytes, and the caller fences (copy_uncached)
};

/// Where a kernel's bytes come from, and where they go when it copies too.
template <Copy kCopy>
struct Stream {
  const unsigned char* src;
  unsigned char* dst;  // unused with Copy::kNone
  void advance(std::size_t k) {
    src += k;
    if constexpr (kCopy != Copy::kNone) dst += k;
  }
  /// Copies the last `n` bytes, which the scalar steps then read from src.
  void copy_rest(std::size_t n) const {
    if constexpr (kCopy != Copy::kNone) std::memcpy(dst, src, n);
  }
};

// The 128-bit steps (the last few vectors of a span) store through the cache either way.
template <Copy kCopy>
KVTIER_CRC_TARGET_SSE __m128i load128(const Stream<kCopy>& s, std::size_t at) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s.src + at));
  if constexpr (kCopy != Copy::kNone) _mm_storeu_si128(reinterpret_cast<__m128i*>(s.dst + at), v);
  return v;
}

/// Folds the remaining whole 16-byte chunks into x (the state of everything before s.src), reduces
/// it to the 32-bit register and runs the last bytes through crc32.
template <Copy kCopy>
KVTIER_CRC_TARGET_SSE std::uint32_t finish(__m128i x, Stream<kCopy> s, std::size_t n) {
  const __m128i k16 = constants128(kFoldBy<16>);
  for (; n >= 16; s.advance(16), n -= 16) x = _mm_xor_si128(fold128(x, k16), load128(s, 0));
  std::uint64_t c = _mm_crc32_u64(0, static_cast<std::uint64_t>(_mm_cvtsi128_si64(x)));
  c = _mm_crc32_u64(c, static_cast<std::uint64_t>(_mm_extract_epi64(x, 1)));
  s.copy_rest(n);
  return crc_bytes(static_cast<std::uint32_t>(c), s.src, n);
}

/// A span too short for the vector loop: copied (if kCopy says so), then through crc32.
template <Copy kCopy>
KVTIER_CRC_TARGET_SSE std::uint32_t short_span(std::uint32_t state, Stream<kCopy> s,
                                               std::size_t n) {
  s.copy_rest(n);
  return crc_bytes(state, s.src, n);
}

// ---- 512-bit (AVX-512) ------------------------------------------------------------------

constexpr std::size_t kZmmBytes = 64;
constexpr std::size_t kZmmAccumulators = 4;  // 256 bytes per round: 8 multiplies in flight
constexpr std::size_t kPrefetchAhead = 1024;

#define KVTIER_CRC_INLINE_AVX512 \
  __attribute__((target("avx512f,vpclmulqdq,sse4.2,pclmul"), always_inline)) inline

// Every 512-bit load is at a multiple of 64 bytes from where the kernel started, so an
// uncached copy's destination, aligned there, stays aligned for the streaming store.
template <Copy kCopy>
KVTIER_CRC_INLINE_AVX512 __m512i load512(const Stream<kCopy>& s, std::size_t at) {
  const __m512i v = _mm512_loadu_si512(s.src + at);
  if constexpr (kCopy == Copy::kCached) _mm512_storeu_si512(s.dst + at, v);
  if constexpr (kCopy == Copy::kUncached)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(s.dst + at), v);
  return v;
}

KVTIER_CRC_INLINE_AVX512 __m512i constants512(FoldConstants k) {
  return _mm512_broadcast_i32x4(constants128(k));
}

KVTIER_CRC_INLINE_AVX512 __m512i fold512(__m512i x, __m512i k) {
  return _mm512_xor_si512(_mm512_clmulepi64_epi128(x, k, 0x00),
                          _mm512_clmulepi64_epi128(x, k, 0x11));
}

/// fold512(x, k) ^ next in one three-way XOR.
KVTIER_CRC_INLINE_AVX512 __m512i fold512_into(__m512i x, __m512i k, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00),
                                   _mm512_clmulepi64_epi128(x, k, 0x11), next, 0x96);
}

template <Copy kCopy>
KVTIER_CRC_INLINE_AVX512 std::uint32_t avx512_fold(Stream<kCopy> s, std::size_t n,
                                                   std::uint32_t state) {
  if (n < kZmmBytes) return short_span(state, s, n);
  const __m512i start = _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(state)));
  constexpr std::size_t kRound = kZmmAccumulators * kZmmBytes;
  __m512i x;
  if (n >= kRound) {
    __m512i acc[kZmmAccumulators];
    // Unrolled, so that the accumulators live in registers.
#pragma GCC unroll 16
    for (std::size_t i = 0; i < kZmmAccumulators; ++i) acc[i] = load512(s, i * kZmmBytes);
    acc[0] = _mm512_xor_si512(acc[0], start);
    s.advance(kRound);
    n -= kRound;
    const __m512i k_round = constants512(kFoldBy<kRound>);
    for (; n >= kRound; s.advance(kRound), n -= kRound) {
      // At this speed the hardware prefetchers fall behind once the data is beyond L1: asking
      // for the lines 1 KiB ahead measured about 15% faster on 256 KiB and 2 MiB blocks here
      // (a prefetch past the end of the buffer never faults; its address is formed as an
      // integer, since a pointer past the end would not be valid C++).
      const std::uintptr_t ahead = reinterpret_cast<std::uintptr_t>(s.src) + kPrefetchAhead;
#pragma GCC unroll 16
      for (std::size_t i = 0; i < kZmmAccumulators; ++i)
        _mm_prefetch(reinterpret_cast<const char*>(ahead + i * kZmmBytes), _MM_HINT_T0);
#pragma GCC unroll 16
      for (std::size_t i = 0; i < kZmmAccumulators; ++i)
        acc[i] = fold512_into(acc[i], k_round, load512(s, i * kZmmBytes));
    }
    // Every accumulator onto the last one, (kZmmAccumulators - 1 - i) registers ahead.
    x = acc[kZmmAccumulators - 1];
#pragma GCC unroll 16
    for (std::size_t i = 0; i + 1 < kZmmAccumulators; ++i)
      x = fold512_into(acc[i], constants512(kOntoLast<kZmmAccumulators, kZmmBytes>.by_register[i]),
                       x);
  } else {
    x = _mm512_xor_si512(load512(s, 0), start);
    s.advance(kZmmBytes);
    n -= kZmmBytes;
  }
  const __m512i k_zmm = constants512(kFoldBy<kZmmBytes>);
  for (; n >= kZmmBytes; s.advance(kZmmBytes), n -= kZmmBytes)
    x = fold512_into(x, k_zmm, load512(s, 0));

  // The four 128-bit lanes onto the last: lanes 0-2 fold 48, 32 and 16 bytes ahead, lane 3
  // stays (its constants are zero, and its own value is put back).
  constexpr FoldConstants k48 = kFoldBy<48>, k32 = kFoldBy<32>, k16 = kFoldBy<16>;
  const __m512i k_lanes = _mm512_set_epi64(
      0, 0, static_cast<long long>(k16.low_half), static_cast<long long>(k16.high_half),
      static_cast<long long>(k32.low_half), static_cast<long long>(k32.high_half),
      static_cast<long long>(k48.low_half), static_cast<long long>(k48.high_half));
  const __m512i lanes = _mm512_mask_mov_epi64(fold512(x, k_lanes), 0xC0, x);
  const __m256i half =
      _mm256_xor_si256(_mm512_castsi512_si256(lanes), _mm512_extracti64x4_epi64(lanes, 1));
  return finish(_mm_xor_si128(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1)), s,
                n);
}

/// An uncached copy: the bytes up to the destination's first 64-byte boundary through the
/// kernel's own copy (`kCached`, a crc32c_copy_*), the rest through the same kernel with
/// streaming stores (`kStreaming`, which needs `dst` aligned to 64 bytes), then a store fence,
/// so that the copy is visible to other threads (the job's completion is published after this
/// returns) like a copy through the cache. Non-temporal stores are weakly ordered: without the
/// fence a thread that sees the completion could read the old bytes.
template <Crc32cCopyKernel kCached, Crc32cCopyKernel kStreaming>
KVTIER_CRC_TARGET_SSE std::uint32_t copy_uncached(unsigned char* dst, const unsigned char* src,
                                                  std::size_t n, std::uint32_t state) {
  const std::size_t to_line = (64 - reinterpret_cast<std::uintptr_t>(dst) % 64) % 64;
  const std::size_t head = n < to_line ? n : to_line;
  if (head > 0) state = kCached(dst, src, head, state);
  state = kStreaming(dst + head, src + head, n - head, state);
  _mm_sfence();
  return state;
}

KVTIER_CRC_TARGET_AVX512 std::uint32_t avx512_streaming(unsigned char* dst,
                                                        const unsigned char* src, std::size_t n,
                                                        std::uint32_t state) noexcept {
  return avx512_fold(Stream<Copy::kUncached>{src, dst}, n, state);
}

}  // namespace

KVTIER_CRC_TARGET_AVX512 std::uint32_t crc32c_avx512_vpclmul(const unsigned char* p, std::size_t n,
                                                             std::uint32_t state) noexcept {
  return avx512_fold(Stream<Copy::kNone>{p, nullptr}, n, state);
}

KVTIER_CRC_TARGET_AVX512 std::uint32_t crc32c_copy_avx512_vpclmul(unsigned char* dst,
                                                                  const unsigned char* src,
                                                                  std::size_t n,
                                                                  std::uint32_t state) noexcept {
  return avx512_fold(Stream<Copy::kCached>{src, dst}, n, state);
}

KVTIER_CRC_TARGET_AVX512 std::uint32_t crc32c_copy_uncached_avx512_vpclmul(
    unsigned char* dst, const unsigned char* src, std::size_t n, std::uint32_t state) noexcept {
  return copy_uncached<crc32c_copy_avx512_vpclmul, avx512_streaming>(dst, src, n, state);
}

// ---- 256-bit (AVX2 + VPCLMULQDQ) --------------------------------------------------------

namespace {

constexpr std::size_t kYmmBytes = 32;
constexpr std::size_t kYmmAccumulators = 4;  // 128 bytes per round: 8 multiplies in flight

#define KVTIER_CRC_INLINE_AVX2 \
  __attribute__((target("avx2,vpclmulqdq,sse4.2,pclmul"), always_inline)) inline

// As load512: every 256-bit load is at a multiple of 32 bytes from the start.
template <Copy kCopy>
KVTIER_CRC_INLINE_AVX2 __m256i load256(const Stream<kCopy>& s, std::size_t at) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.src + at));
  if constexpr (kCopy == Copy::kCached)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(s.dst + at), v);
  if constexpr (kCopy == Copy::kUncached)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(s.dst + at), v);
  return v;
}

KVTIER_CRC_INLINE_AVX2 __m256i constants256(FoldConstants k) {
  return _mm256_broadcastsi128_si256(constants128(k));
}

KVTIER_CRC_INLINE_AVX2 __m256i fold256(__m256i x, __m256i k) {
  return _mm256_xor_si256(_mm256_clmulepi64_epi128(x, k, 0x00),
                          _mm256_clmulepi64_epi128(x, k, 0x11));
}

KVTIER_CRC_INLINE_AVX2 __m256i fold256_into(__m256i x, __m256i k, __m256i next) {
  return _mm256_xor_si256(fold256(x, k), next);
}

template <Copy kCopy>
KVTIER_CRC_INLINE_AVX2 std::uint32_t avx2_fold(Stream<kCopy> s, std::size_t n,
                                               std::uint32_t state) {
  if (n < kYmmBytes) return short_span(state, s, n);
  const __m256i start = _mm256_zextsi128_si256(_mm_cvtsi32_si128(static_cast<int>(state)));
  __m256i x;
  if (n >= kYmmAccumulators * kYmmBytes) {
    __m256i x0 = _mm256_xor_si256(load256(s, 0), start);
    __m256i x1 = load256(s, kYmmBytes);
    __m256i x2 = load256(s, 2 * kYmmBytes);
    __m256i x3 = load256(s, 3 * kYmmBytes);
    s.advance(kYmmAccumulators * kYmmBytes);
    n -= kYmmAccumulators * kYmmBytes;
    const __m256i k_round = constants256(kFoldBy<kYmmAccumulators * kYmmBytes>);
    for (; n >= kYmmAccumulators * kYmmBytes;
         s.advance(kYmmAccumulators * kYmmBytes), n -= kYmmAccumulators * kYmmBytes) {
      x0 = fold256_into(x0, k_round, load256(s, 0));
      x1 = fold256_into(x1, k_round, load256(s, kYmmBytes));
      x2 = fold256_into(x2, k_round, load256(s, 2 * kYmmBytes));
      x3 = fold256_into(x3, k_round, load256(s, 3 * kYmmBytes));
    }
    x = _mm256_xor_si256(_mm256_xor_si256(fold256(x0, constants256(kFoldBy<3 * kYmmBytes>)),
                                          fold256(x1, constants256(kFoldBy<2 * kYmmBytes>))),
                         fold256_into(x2, constants256(kFoldBy<kYmmBytes>), x3));
  } else {
    x = _mm256_xor_si256(load256(s, 0), start);
    s.advance(kYmmBytes);
    n -= kYmmBytes;
  }
  const __m256i k_ymm = constants256(kFoldBy<kYmmBytes>);
  for (; n >= kYmmBytes; s.advance(kYmmBytes), n -= kYmmBytes)
    x = fold256_into(x, k_ymm, load256(s, 0));

  // Lane 0 onto lane 1 (16 bytes ahead).
  const __m128i lane0 = fold128(_mm256_castsi256_si128(x), constants128(kFoldBy<16>));
  return finish(_mm_xor_si128(lane0, _mm256_extracti128_si256(x, 1)), s, n);
}

KVTIER_CRC_TARGET_AVX2 std::uint32_t avx2_streaming(unsigned char* dst, const unsigned char* src,
                                                    std::size_t n, std::uint32_t state) noexcept {
  return avx2_fold(Stream<Copy::kUncached>{src, dst}, n, state);
}

}  // namespace

KVTIER_CRC_TARGET_AVX2 std::uint32_t crc32c_avx2_vpclmul(const unsigned char* p, std::size_t n,
                                                         std::uint32_t state) noexcept {
  return avx2_fold(Stream<Copy::kNone>{p, nullptr}, n, state);
}

KVTIER_CRC_TARGET_AVX2 std::uint32_t crc32c_copy_avx2_vpclmul(unsigned char* dst,
                                                              const unsigned char* src,
                                                              std::size_t n,
                                                              std::uint32_t state) noexcept {
  return avx2_fold(Stream<Copy::kCached>{src, dst}, n, state);
}

KVTIER_CRC_TARGET_AVX2 std::uint32_t crc32c_copy_uncached_avx2_vpclmul(
    unsigned char* dst, const unsigned char* src, std::size_t n, std::uint32_t state) noexcept {
  return copy_uncached<crc32c_copy_avx2_vpclmul, avx2_streaming>(dst, src, n, state);
}

// ---- detection ----------------------------------------------------------------------------

namespace {

struct X86Features {
  bool sse42 = false, pclmul = false, avx2 = false, avx512f = false, vpclmulqdq = false;
  bool os_saves_ymm = false, os_saves_zmm = false;
};

X86Features detect() noexcept {
  X86Features f;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  f.sse42 = (ecx & bit_SSE4_2) != 0;
  f.pclmul = (ecx & bit_PCLMUL) != 0;
  // The vector registers are usable only if the OS saves them on context switches (XCR0):
  // bits 1-2 for xmm/ymm, 5-7 for the AVX-512 opmask and zmm state.
  if ((ecx & bit_OSXSAVE) != 0 && (ecx & bit_AVX) != 0) {
    unsigned lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    f.os_saves_ymm = (lo & 0x06u) == 0x06u;
    f.os_saves_zmm = (lo & 0xE6u) == 0xE6u;
  }
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    f.avx2 = (ebx & bit_AVX2) != 0;
    f.avx512f = (ebx & bit_AVX512F) != 0;
    f.vpclmulqdq = (ecx & (1u << 10)) != 0;  // CPUID.(EAX=7,ECX=0):ECX[10]
  }
  return f;
}

const X86Features& features() noexcept {
  static const X86Features f = detect();
  return f;
}

}  // namespace

bool crc32c_avx512_vpclmul_supported() noexcept {
  const X86Features& f = features();
  return f.sse42 && f.pclmul && f.avx512f && f.vpclmulqdq && f.os_saves_zmm;
}

bool crc32c_avx2_vpclmul_supported() noexcept {
  const X86Features& f = features();
  return f.sse42 && f.pclmul && f.avx2 && f.vpclmulqdq && f.os_saves_ymm;
}

}  // namespace kvtier::detail

#endif  // __x86_64__
