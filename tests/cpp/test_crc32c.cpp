// CRC32C: published check values, incremental use, the folding constants, and agreement of
// every implementation compiled in (the carry-less-multiply folds, the crc32-instruction path,
// the table) with a bit-at-a-time reference written from the definition.
//
// The run-time choice is tested too: with $KVTIER_CRC32C_IMPL unset, kvtier::crc32c() must run
// the fastest implementation the CPU supports; set (ctest runs this program once per name,
// see tests/cpp/CMakeLists.txt), it must run that one where the CPU supports it and the
// automatic choice otherwise. $KVTIER_REQUIRE_CRC32C_IMPL=<name> makes "the automatic choice
// is that implementation" a requirement instead of an observation: .ci/aarch64-crc.sh sets it
// under qemu, whose "max" CPU has PMULL and the CRC32 extension, so a detection that silently
// fell back fails there. $KVTIER_REQUIRE_CRC32C_HARDWARE=1 requires any implementation but the
// table.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include <kvtier/format.hpp>

#include "crc32c_paths.hpp"
#include "harness.hpp"
#include "util/crc32c_fold.hpp"

namespace {

using kvtier::test::crc32c_path;
using kvtier::test::crc32c_path_raw;

// Bitwise CRC32C (Castagnoli, reflected polynomial 0x82F63B78): slow and obviously right.
std::uint32_t reference_raw(const unsigned char* p, std::size_t n, std::uint32_t state) {
  for (std::size_t i = 0; i < n; ++i) {
    state ^= p[i];
    for (int k = 0; k < 8; ++k) state = (state & 1) ? (state >> 1) ^ 0x82F63B78u : state >> 1;
  }
  return state;
}

std::uint32_t reference_crc32c(const unsigned char* p, std::size_t n, std::uint32_t crc = 0) {
  return ~reference_raw(p, n, ~crc);
}

std::uint32_t crc_of(const std::string& s) {
  return kvtier::crc32c(s.data(), s.size());
}

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

/// The implementations this CPU runs, by the library's own detection.
std::vector<std::string> supported_paths() {
  std::vector<std::string> out;
  for (const std::string& name : kvtier::test::crc32c_path_names())
    if (kvtier::test::crc32c_path_supported(name)) out.push_back(name);
  return out;
}

/// Whether the CPU can run `name`, found without the library's detection: GCC's
/// __builtin_cpu_supports (which also checks that the OS saves the vector state) on x86-64,
/// the auxiliary vector on aarch64.
bool cpu_runs(const std::string& name) {
  if (name == "table") return true;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool base = __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul");
  if (name == "sse42") return __builtin_cpu_supports("sse4.2");
  if (name == "avx2-vpclmul")
    return base && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("vpclmulqdq");
  if (name == "avx512-vpclmul")
    return base && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq");
#elif defined(__aarch64__)
  const unsigned long hwcap = ::getauxval(AT_HWCAP);
  if (name == "armv8-crc") return (hwcap & HWCAP_CRC32) != 0;
  if (name == "armv8-pmull") return (hwcap & HWCAP_CRC32) != 0 && (hwcap & HWCAP_PMULL) != 0;
#endif
  return false;
}

/// A portable 64 x 64 -> 128-bit carry-less multiply (what PCLMULQDQ and PMULL compute).
void clmul64(std::uint64_t a, std::uint64_t b, std::uint64_t& low, std::uint64_t& high) {
  low = high = 0;
  for (int i = 0; i < 64; ++i)
    if ((b >> i) & 1u) {
      low ^= a << i;
      if (i != 0) high ^= a >> (64 - i);
    }
}

}  // namespace

// First, so that these threads race the library's first use: the one-time choice of an
// implementation must be safe under concurrent first calls (ThreadSanitizer checks it in CI).
KV_TEST(concurrent_first_use_agrees) {
  const auto data = kvtest::pattern(64 * 1024 + 5, 2);
  const std::uint32_t want = reference_crc32c(data.data(), data.size());
  std::vector<std::uint32_t> got(8);
  std::vector<std::string> names(8);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] {
      got[t] = kvtier::crc32c(data.data(), data.size());
      names[t] = kvtier::crc32c_implementation();
    });
  for (auto& th : threads) th.join();
  for (std::size_t t = 0; t < got.size(); ++t) {
    CHECK_EQ(got[t], want);
    CHECK_EQ(names[t], std::string(kvtier::crc32c_implementation()));
  }
}

KV_TEST(known_vectors) {
  CHECK_EQ(crc_of("123456789"), 0xE3069283u);  // the standard check value
  CHECK_EQ(crc_of(""), 0u);
  CHECK_EQ(crc_of("a"), 0xC1D04330u);
  // RFC 3720 (iSCSI) appendix B.4.
  unsigned char buf[32];
  std::memset(buf, 0, sizeof(buf));
  CHECK_EQ(kvtier::crc32c(buf, 32), 0x8A9136AAu);
  std::memset(buf, 0xFF, sizeof(buf));
  CHECK_EQ(kvtier::crc32c(buf, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(i);
  CHECK_EQ(kvtier::crc32c(buf, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(31 - i);
  CHECK_EQ(kvtier::crc32c(buf, 32), 0x113FDB5Cu);
  for (const std::string& name : supported_paths())
    CHECK_EQ(crc32c_path(name, "123456789", 9), 0xE3069283u);
}

KV_TEST(the_implementation_in_use_is_the_one_chosen) {
  const std::string in_use = kvtier::crc32c_implementation();
  const std::string forced = env("KVTIER_CRC32C_IMPL");
  const std::vector<std::string> supported = supported_paths();
  std::printf("  crc32c implementation in use: %s (KVTIER_CRC32C_IMPL=%s; supported:",
              in_use.c_str(), forced.empty() ? "<unset>" : forced.c_str());
  for (const std::string& name : supported) std::printf(" %s", name.c_str());
  std::printf(")\n");
  CHECK(!supported.empty());
  CHECK_EQ(supported.back(), std::string("table"));
  if (!forced.empty() && forced != "auto" && kvtier::test::crc32c_path_supported(forced)) {
    CHECK_EQ(in_use, forced);
  } else {
    CHECK_EQ(in_use, supported.front());  // the fastest first
  }
  CHECK_EQ(kvtier::crc32c_is_hardware(), in_use != "table");
}

KV_TEST(detection_agrees_with_the_compiler_runtime) {
  // The library reads cpuid/xgetbv (x86-64) or AT_HWCAP (aarch64) itself; GCC's runtime
  // does the same independently.
  for (const std::string& name : kvtier::test::crc32c_path_names()) {
    std::printf("  %-15s supported: %d\n", name.c_str(), kvtier::test::crc32c_path_supported(name));
    CHECK_MSG(kvtier::test::crc32c_path_supported(name) == cpu_runs(name), name);
  }
}

KV_TEST(required_implementation_in_use) {
#if defined(__x86_64__)
  std::printf("  architecture: x86-64\n");
#elif defined(__aarch64__)
  std::printf("  architecture: aarch64\n");
#else
  std::printf("  architecture: other (table only)\n");
#endif
  // The requirement is on the automatic choice, so it holds in the runs that force another
  // implementation too.
  const std::string required = env("KVTIER_REQUIRE_CRC32C_IMPL");
  if (!required.empty()) {
    CHECK(kvtier::test::crc32c_path_supported(required));
    const std::string automatic = supported_paths().front();
    CHECK_EQ(automatic, required);
    const std::string forced = env("KVTIER_CRC32C_IMPL");
    if (forced.empty() || forced == "auto")
      CHECK_EQ(std::string(kvtier::crc32c_implementation()), required);
  }
  if (env("KVTIER_REQUIRE_CRC32C_HARDWARE") == "1") CHECK(supported_paths().front() != "table");
}

KV_TEST(fold_constants_match_long_division) {
  // x^n mod P computed the other way round: the polynomial in its normal form (bit i is x^i,
  // x^32 explicit), long division one bit at a time, then bit-reversed.
  auto by_division = [](std::size_t n) {
    std::uint64_t r = 1;
    for (std::size_t i = 0; i < n; ++i) {
      r <<= 1;
      if (r & (std::uint64_t{1} << 32)) r ^= 0x11EDC6F41u;
    }
    std::uint32_t reflected = 0;
    for (int b = 0; b < 32; ++b)
      if ((r >> b) & 1u) reflected |= 1u << (31 - b);
    return reflected;
  };
  for (std::size_t n = 0; n < 3000; ++n)
    CHECK_MSG(kvtier::detail::crc32c_fold::x_pow_mod(n) == by_division(n), std::to_string(n));
}

KV_TEST(each_fold_preserves_the_crc) {
  // Folding a 16-byte chunk X forward by D bytes must leave the CRC unchanged: the register
  // after X and D zero bytes equals the register after the folded 16 bytes alone, both from
  // state 0 (leading zero bytes do not move it). This checks the constants' form (which half
  // each multiplies, the x^33 offset of a reflected multiply) without any vector code.
  std::mt19937_64 rng(99);
  for (std::size_t distance : {16, 32, 48, 64, 80, 96, 112, 128, 192, 256}) {
    const auto k = kvtier::detail::crc32c_fold::fold_by(distance);
    for (int trial = 0; trial < 50; ++trial) {
      const std::uint64_t first = rng(), second = rng();  // X's low and high 64 bits
      std::vector<unsigned char> message(16 + distance, 0);
      std::memcpy(message.data(), &first, 8);
      std::memcpy(message.data() + 8, &second, 8);
      std::uint64_t a_low, a_high, b_low, b_high;
      clmul64(first, k.high_half, a_low, a_high);
      clmul64(second, k.low_half, b_low, b_high);
      const std::uint64_t folded[2] = {a_low ^ b_low, a_high ^ b_high};
      unsigned char folded_bytes[16];
      std::memcpy(folded_bytes, folded, 16);
      CHECK_MSG(
          reference_raw(message.data(), message.size(), 0) == reference_raw(folded_bytes, 16, 0),
          "fold by " + std::to_string(distance));
    }
  }
}

KV_TEST(every_implementation_matches_the_reference_on_every_short_length) {
  // Every length up to a few KiB (each kernel's own thresholds: 16-byte chunks, 64 or 128 bytes
  // of accumulators, 256-byte rounds, the crc32 path's 12 KiB rounds below), at misaligned
  // starts, from the initial state and from an arbitrary previous CRC.
  const auto data = kvtest::pattern(5000, 7);
  const std::vector<std::string> paths = supported_paths();
  for (std::size_t offset : {0, 1, 3, 7, 8, 13, 31, 63}) {
    for (std::size_t n = 0; n <= 2100; ++n) {
      if (n > 600 && offset % 2 == 1 && n % 7 != 0) continue;  // thinner at odd offsets
      const unsigned char* p = data.data() + offset;
      const std::uint32_t seed = static_cast<std::uint32_t>(n * 2654435761u);
      const std::uint32_t want = reference_crc32c(p, n);
      const std::uint32_t want_seeded = reference_crc32c(p, n, seed);
      CHECK_EQ(kvtier::crc32c(p, n), want);
      for (const std::string& path : paths) {
        if (crc32c_path(path, p, n) != want || crc32c_path(path, p, n, seed) != want_seeded)
          FAIL(path + ": length " + std::to_string(n) + " at offset " + std::to_string(offset));
      }
    }
  }
}

KV_TEST(every_implementation_matches_the_reference_on_long_spans) {
  const auto data = kvtest::pattern((2u << 20) + 4096 + 64, 5);
  const std::vector<std::string> paths = supported_paths();
  for (std::size_t n :
       {std::size_t{4095}, std::size_t{4096}, std::size_t{4097}, std::size_t{3 * 4096 - 1},
        std::size_t{3 * 4096}, std::size_t{3 * 4096 + 1}, std::size_t{6 * 4096 + 7},
        std::size_t{65536 + 17}, std::size_t{100003}, std::size_t{256 * 1024},
        std::size_t{(1u << 20) + 13}, std::size_t{(2u << 20) + 4096}}) {
    for (std::size_t offset : {std::size_t{0}, std::size_t{3}, std::size_t{32}}) {
      const unsigned char* p = data.data() + offset;
      const std::uint32_t seed = 0xA5A5A5A5u ^ static_cast<std::uint32_t>(n);
      const std::uint32_t want = reference_crc32c(p, n, seed);
      CHECK_EQ(kvtier::crc32c(p, n, seed), want);
      for (const std::string& path : paths)
        CHECK_MSG(crc32c_path(path, p, n, seed) == want,
                  path + ": length " + std::to_string(n) + " at offset " + std::to_string(offset));
    }
  }
}

KV_TEST(implementations_agree_on_random_spans_and_chain_into_each_other) {
  // Random spans, alignments and starting states against the table; and a span's first part
  // through one implementation continued through another (the raw register is their contract).
  const auto data = kvtest::pattern(200 * 1024, 21);
  const std::vector<std::string> paths = supported_paths();
  std::mt19937 rng(12345);
  std::uniform_int_distribution<std::size_t> offset_of(0, 63);
  std::uniform_int_distribution<std::size_t> length_of(0, 150 * 1024);
  for (int i = 0; i < 300; ++i) {
    const unsigned char* p = data.data() + offset_of(rng);
    const std::size_t n = length_of(rng);
    const std::size_t split = std::uniform_int_distribution<std::size_t>(0, n)(rng);
    const auto state = static_cast<std::uint32_t>(rng());
    const std::uint32_t want = crc32c_path_raw("table", p, n, state);
    for (const std::string& first : paths) {
      CHECK_MSG(crc32c_path_raw(first, p, n, state) == want, first);
      const std::string& second = paths[static_cast<std::size_t>(i) % paths.size()];
      const std::uint32_t mid = crc32c_path_raw(first, p, split, state);
      CHECK_MSG(crc32c_path_raw(second, p + split, n - split, mid) == want, first + "+" + second);
    }
  }
}

KV_TEST(incremental_equals_one_shot) {
  const auto data = kvtest::pattern(40000, 11);
  const std::uint32_t whole = kvtier::crc32c(data.data(), data.size());
  CHECK_EQ(whole, reference_crc32c(data.data(), data.size()));
  for (std::size_t split :
       {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{63},
        std::size_t{64}, std::size_t{255}, std::size_t{256}, std::size_t{4096}, std::size_t{9999},
        std::size_t{10000}, std::size_t{12289}, std::size_t{25000}}) {
    const std::uint32_t first = kvtier::crc32c(data.data(), split);
    CHECK_EQ(kvtier::crc32c(data.data() + split, data.size() - split, first), whole);
    for (const std::string& path : supported_paths())
      CHECK_EQ(crc32c_path(path, data.data() + split, data.size() - split,
                           crc32c_path(path, data.data(), split)),
               whole);
  }
}

KV_TEST(a_flipped_bit_changes_the_checksum) {
  auto data = kvtest::pattern(8192, 3);
  const std::uint32_t before = kvtier::crc32c(data.data(), data.size());
  for (std::size_t i : {std::size_t{0}, std::size_t{4095}, std::size_t{8191}}) {
    for (int bit : {0, 7}) {
      data[i] ^= static_cast<unsigned char>(1u << bit);
      for (const std::string& path : supported_paths())
        CHECK_MSG(crc32c_path(path, data.data(), data.size()) != before, path);
      data[i] ^= static_cast<unsigned char>(1u << bit);
    }
  }
  CHECK_EQ(kvtier::crc32c(data.data(), data.size()), before);
}

// ---- crc32c_copy: the fused copy and CRC ------------------------------------------------

namespace {

constexpr const char* kUncached = "/uncached";

/// A copy path by name: "" is kvtier::crc32c_copy itself, "/uncached" kvtier::
/// crc32c_copy_uncached, an implementation's name its copy, and that name + "/uncached" its
/// uncached copy.
std::uint32_t copy_by(const std::string& path, void* dst, const void* src, std::size_t n,
                      std::uint32_t seed) {
  const std::size_t slash = path.find('/');
  const bool uncached = slash != std::string::npos;
  const std::string name = path.substr(0, slash);
  if (name.empty())
    return uncached ? kvtier::crc32c_copy_uncached(seed, dst, src, n)
                    : kvtier::crc32c_copy(seed, dst, src, n);
  return uncached ? kvtier::test::crc32c_copy_uncached_path(name, dst, src, n, seed)
                  : kvtier::test::crc32c_copy_path(name, dst, src, n, seed);
}

/// Checks that the copy path `path` (copy_by's names) copied exactly src[0, n) to dst at
/// `dst_offset` past a 64-byte boundary of a buffer filled with a guard byte (no byte before
/// or after it touched) and returned the reference CRC from `seed`. The boundary makes
/// dst % 64 == dst_offset % 64 whatever the allocator returns, so `dst_offset` decides where
/// an uncached copy's first cache line ends.
bool copy_agrees(const std::string& path, const unsigned char* src, std::size_t n,
                 std::size_t dst_offset, std::uint32_t seed, std::vector<unsigned char>& out,
                 std::string& why) {
  constexpr unsigned char kGuard = 0xA7;
  out.assign(64 + dst_offset + n + 64, kGuard);
  const std::size_t to_line = (64 - reinterpret_cast<std::uintptr_t>(out.data()) % 64) % 64;
  const std::size_t at = to_line + dst_offset;  // dst's offset in `out`
  unsigned char* dst = out.data() + at;
  const std::uint32_t got = copy_by(path, dst, src, n, seed);
  const std::uint32_t want = reference_crc32c(src, n, seed);
  const std::string where = (path.rfind("/", 0) == 0 || path.empty() ? "crc32c_copy" + path
                                                                     : path) +
                            ": length " + std::to_string(n) + ", dst offset " +
                            std::to_string(dst_offset);
  if (got != want) {
    why = where + ": wrong CRC";
    return false;
  }
  if (n > 0 && std::memcmp(dst, src, n) != 0) {
    why = where + ": bytes not copied";
    return false;
  }
  for (std::size_t i = 0; i < at; ++i)
    if (out[i] != kGuard) {
      why = where + ": wrote before dst";
      return false;
    }
  for (std::size_t i = at + n; i < out.size(); ++i)
    if (out[i] != kGuard) {
      why = where + ": wrote past dst + length";
      return false;
    }
  return true;
}

/// The copy paths to check: kvtier::crc32c_copy and crc32c_copy_uncached (the ones the
/// dispatch chose) and both copies of every implementation the CPU runs.
std::vector<std::string> copy_paths() {
  std::vector<std::string> paths{"", kUncached};
  for (const std::string& name : supported_paths()) {
    paths.push_back(name);
    paths.push_back(name + kUncached);
  }
  return paths;
}

}  // namespace

KV_TEST(copy_matches_memcpy_then_crc_on_every_length_to_4096) {
  // Every length 0..4096 (each kernel's 16-, 32-, 64-byte steps and 128- and 256-byte rounds,
  // the blocked paths' short blocks), with source and destination misaligned differently,
  // from 0 and from a previous CRC; the destination's neighbours must stay untouched.
  // (The uncached copies split at the destination's first 64-byte boundary: destination
  // offsets 0 to 63 (copy_agrees aligns them to a line) put it before and after each of the
  // 16-, 32- and 64-byte steps.)
  const auto data = kvtest::pattern(4096 + 128, 13);
  std::vector<unsigned char> out;
  std::string why;
  for (const std::string& path : copy_paths()) {
    const std::pair<std::size_t, std::size_t> offsets[] = {
        {0, 0}, {1, 0}, {0, 3}, {7, 5}, {13, 63}, {32, 1}, {0, 16}, {5, 31}, {2, 33}, {9, 48}};
    for (const auto& [src_offset, dst_offset] : offsets) {
      for (std::size_t n = 0; n <= 4096; ++n) {
        // Every length at the aligned pair and one pair more; a sample at the others.
        if (src_offset + dst_offset > 1 && n > 600 && n % 5 != 0) continue;
        const auto seed = static_cast<std::uint32_t>(n * 2654435761u) * (n % 2);
        if (!copy_agrees(path, data.data() + src_offset, n, dst_offset, seed, out, why)) {
          FAIL(why);
          return;
        }
      }
    }
  }
}

KV_TEST(copy_matches_memcpy_then_crc_on_large_spans) {
  // Past the blocked paths' 12 KiB blocks and the prefetch distance, up to a few MiB, with
  // the source and destination at different misalignments.
  const auto data = kvtest::pattern((4u << 20) + 4096 + 64, 17);
  std::vector<unsigned char> out;
  std::string why;
  const std::pair<std::size_t, std::size_t> offsets[] = {{0, 0},  {3, 0},  {0, 5},
                                                         {33, 17}, {1, 32}, {0, 63}};
  for (const std::string& path : copy_paths())
    for (std::size_t n :
         {std::size_t{3 * 4096 - 1}, std::size_t{3 * 4096}, std::size_t{3 * 4096 + 1},
          std::size_t{65536 + 17}, std::size_t{256 * 1024}, std::size_t{(1u << 20) + 13},
          std::size_t{2u << 20}, std::size_t{(2u << 20) + 4096}, std::size_t{(4u << 20) + 7}})
      for (const auto& [src_offset, dst_offset] : offsets) {
        const auto seed = 0x5A5A5A5Au ^ static_cast<std::uint32_t>(n);
        CHECK_MSG(copy_agrees(path, data.data() + src_offset, n, dst_offset, seed, out, why),
                  why);
      }
}

KV_TEST(copy_chains_with_crc32c_and_itself) {
  // A span copied in two pieces, or checksummed in one piece and copied in the other,
  // through any mix of implementations: the CRC register is the same contract.
  const auto data = kvtest::pattern(300 * 1024, 23);
  const std::vector<std::string> paths = supported_paths();
  std::vector<unsigned char> out(data.size());
  std::mt19937 rng(777);
  for (int i = 0; i < 200; ++i) {
    const std::size_t n = std::uniform_int_distribution<std::size_t>(0, data.size())(rng);
    const std::size_t split = std::uniform_int_distribution<std::size_t>(0, n)(rng);
    const auto seed = static_cast<std::uint32_t>(rng());
    const std::uint32_t want = reference_crc32c(data.data(), n, seed);
    // Every third piece through an uncached copy.
    const std::string first =
        paths[static_cast<std::size_t>(i) % paths.size()] + (i % 3 == 0 ? kUncached : "");
    const std::string second =
        paths[static_cast<std::size_t>(i / 2) % paths.size()] + (i % 3 == 1 ? kUncached : "");
    std::fill(out.begin(), out.end(), 0);
    const std::uint32_t mid = copy_by(first, out.data(), data.data(), split, seed);
    CHECK_EQ(mid, reference_crc32c(data.data(), split, seed));
    CHECK_MSG(copy_by(second, out.data() + split, data.data() + split, n - split, mid) == want,
              first + "+" + second);
    CHECK(std::memcmp(out.data(), data.data(), n) == 0);
    // The first piece by crc32c() (no copy), the rest by the copy.
    CHECK_EQ(kvtier::crc32c_copy(kvtier::crc32c(data.data(), split, seed), out.data() + split,
                                 data.data() + split, n - split),
             want);
  }
}

KV_TEST(copy_runs_the_implementation_crc32c_runs) {
  // The dispatch picks one implementation for both entry points (KVTIER_CRC32C_IMPL forces
  // both): a flipped bit in the source changes the copy's CRC exactly as crc32c()'s, and the
  // copy reports the same value as crc32c() over the destination.
  auto data = kvtest::pattern(64 * 1024 + 9, 29);
  std::vector<unsigned char> out(data.size());
  std::printf("  crc32c_copy implementation in use: %s\n", kvtier::crc32c_implementation());
  for (std::size_t i : {std::size_t{0}, std::size_t{4097}, data.size() - 1}) {
    data[i] ^= 0x10;
    const std::uint32_t copied = kvtier::crc32c_copy(0, out.data(), data.data(), data.size());
    CHECK_EQ(copied, kvtier::crc32c(out.data(), out.size()));
    CHECK_EQ(copied, reference_crc32c(data.data(), data.size()));
    std::fill(out.begin(), out.end(), 0);
    CHECK_EQ(kvtier::crc32c_copy_uncached(0, out.data(), data.data(), data.size()), copied);
    CHECK(out == data);
    data[i] ^= 0x10;
  }
}
