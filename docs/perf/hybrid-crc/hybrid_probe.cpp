// How fast could a CRC32C kernel run on this core if it fed the scalar crc32 instruction
// beside its carry-less-multiply folds? A throughput probe, not a kernel: it runs the
// instruction mix of such a kernel's main loop over a buffer in cache and reports bytes per
// second. Its result is not a CRC (no constants, no joining of the streams), so it bounds the
// gain from above: a real kernel would add the join of four CRCs per call.
//
//   folds        the kvtier kernel's loop: 4 x 512-bit accumulators, 2 VPCLMULQDQ + 1 ternary
//                XOR per 64 bytes
//   scalar       three interleaved crc32 streams (the sse42 path's loop)
//   hybrid w=W   one loop: a round of the folds (256 bytes) and W 8-byte crc32 steps on each
//                of three streams that cover the bytes after the folds' part
//
// Build and run (pinned to one CPU):
//   g++ -O2 -o hybrid_probe hybrid_probe.cpp && taskset -c 1 ./hybrid_probe 16384 262144
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define ISA "avx512f,vpclmulqdq,sse4.2,pclmul"
#define TARGET __attribute__((target(ISA), noinline))
#define INLINE __attribute__((target(ISA), always_inline)) inline

namespace {

INLINE __m512i fold(__m512i acc, __m512i k, const unsigned char* next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(acc, k, 0x00),
                                   _mm512_clmulepi64_epi128(acc, k, 0x11),
                                   _mm512_loadu_si512(next), 0x96);
}

// `rounds` rounds of the folds over [p, p + 256 * rounds) and, with w > 0, three crc32 streams
// of 8 * w * rounds bytes each after that. Returns a value that depends on every step, so the
// compiler keeps them all.
TARGET std::uint64_t mix(const unsigned char* p, std::size_t rounds, int w) {
  const __m512i k = _mm512_set1_epi64(0x1234567);
  __m512i a0 = _mm512_loadu_si512(p), a1 = _mm512_loadu_si512(p + 64);
  __m512i a2 = _mm512_loadu_si512(p + 128), a3 = _mm512_loadu_si512(p + 192);
  const unsigned char* v = p + 256;
  const std::size_t lane = 8 * static_cast<std::size_t>(w) * rounds;
  const unsigned char* s0 = p + 256 * rounds;
  const unsigned char* s1 = s0 + lane;
  const unsigned char* s2 = s1 + lane;
  std::uint64_t c0 = 0, c1 = 0, c2 = 0;
  for (std::size_t r = 1; r < rounds; ++r, v += 256) {
    a0 = fold(a0, k, v);
    a1 = fold(a1, k, v + 64);
    a2 = fold(a2, k, v + 128);
    a3 = fold(a3, k, v + 192);
    for (int j = 0; j < w; ++j, s0 += 8, s1 += 8, s2 += 8) {
      std::uint64_t x0, x1, x2;
      std::memcpy(&x0, s0, 8);
      std::memcpy(&x1, s1, 8);
      std::memcpy(&x2, s2, 8);
      c0 = _mm_crc32_u64(c0, x0);
      c1 = _mm_crc32_u64(c1, x1);
      c2 = _mm_crc32_u64(c2, x2);
    }
  }
  const __m512i x = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
  std::uint64_t lanes[8];
  _mm512_storeu_si512(lanes, x);
  return lanes[0] ^ lanes[7] ^ c0 ^ c1 ^ c2;
}

TARGET std::uint64_t scalar(const unsigned char* p, std::size_t n) {
  const std::size_t lane = n / 3 / 8 * 8;
  std::uint64_t c0 = 0, c1 = 0, c2 = 0;
  for (std::size_t i = 0; i < lane; i += 8) {
    std::uint64_t x0, x1, x2;
    std::memcpy(&x0, p + i, 8);
    std::memcpy(&x1, p + lane + i, 8);
    std::memcpy(&x2, p + 2 * lane + i, 8);
    c0 = _mm_crc32_u64(c0, x0);
    c1 = _mm_crc32_u64(c1, x1);
    c2 = _mm_crc32_u64(c2, x2);
  }
  return c0 ^ c1 ^ c2;
}

// Median GB/s of 5 timed runs of about 0.4 s each, after one untimed run.
template <typename F>
double gbps(std::size_t bytes, F&& f, std::uint64_t& sink) {
  const int reps = static_cast<int>(std::max<std::size_t>(1, 2'000'000'000 / bytes));
  std::vector<double> runs;
  for (int t = 0; t < 6; ++t) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) sink += f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (t > 0) runs.push_back(static_cast<double>(bytes) * reps / s / 1e9);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t sink = 0;
  for (int a = 1; a < argc; ++a) {
    const std::size_t n = std::strtoul(argv[a], nullptr, 10);
    std::vector<unsigned char> buf(n + 4096);
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 131);
    // The buffer's address goes through an empty asm statement each call, so the compiler
    // cannot hoist the call out of the timing loop.
    auto at = [&] {
      const unsigned char* q = buf.data();
      __asm__ volatile("" : "+r"(q)::"memory");
      return q;
    };
    std::printf("%zu bytes in cache:\n", n);
    const double folds = gbps(n / 256 * 256, [&] { return mix(at(), n / 256, 0); }, sink);
    std::printf("  folds        %5.1f GB/s\n", folds);
    std::printf("  scalar       %5.1f GB/s\n", gbps(n / 24 * 24, [&] { return scalar(at(), n); }, sink));
    for (int w = 2; w <= 6; ++w) {
      const std::size_t per_round = 256 + 24 * static_cast<std::size_t>(w);
      const std::size_t rounds = n / per_round;
      const double g = gbps(rounds * per_round, [&] { return mix(at(), rounds, w); }, sink);
      std::printf("  hybrid w=%d   %5.1f GB/s  (%.2fx the folds)\n", w, g, g / folds);
    }
  }
  return static_cast<int>(sink & 1);
}
