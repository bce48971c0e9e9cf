// CRC32C: published check values, incremental use, and agreement between the hardware path,
// the software path and a bit-at-a-time reference written from the definition.
//
// $KVTIER_REQUIRE_CRC32C_HARDWARE=1 makes "the hardware path is in use" a requirement instead
// of an observation: .ci/aarch64-crc.sh sets it under qemu, whose default CPU has the ARMv8
// CRC32 extension, so a detection that silently fell back to software fails there.
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <kvtier/format.hpp>

#include "crc32c_paths.hpp"
#include "harness.hpp"

namespace {

// Bitwise CRC32C (Castagnoli, reflected polynomial 0x82F63B78): slow and obviously right.
std::uint32_t reference_crc32c(const unsigned char* p, std::size_t n, std::uint32_t crc = 0) {
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

std::uint32_t crc_of(const std::string& s) {
  return kvtier::crc32c(s.data(), s.size());
}

}  // namespace

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
}

KV_TEST(software_and_hardware_paths_match_known_vectors) {
  const std::string check = "123456789";
  CHECK_EQ(kvtier::test::crc32c_software_path(check.data(), check.size()), 0xE3069283u);
  if (kvtier::test::crc32c_hardware_path_available())
    CHECK_EQ(kvtier::test::crc32c_hardware_path(check.data(), check.size()), 0xE3069283u);
  // The library reports the path it actually uses: the hardware one whenever the CPU has the
  // instructions (SSE4.2 on x86-64, the CRC32 extension on aarch64).
  CHECK_EQ(kvtier::crc32c_is_hardware(), kvtier::test::crc32c_hardware_path_available());
  std::printf("  crc32c path in use: %s\n", kvtier::crc32c_is_hardware() ? "hardware" : "software");
}

KV_TEST(hardware_path_in_use_where_required) {
  const char* required = std::getenv("KVTIER_REQUIRE_CRC32C_HARDWARE");
#if defined(__x86_64__)
  std::printf("  architecture: x86-64 (SSE4.2 crc32)\n");
#elif defined(__aarch64__)
  std::printf("  architecture: aarch64 (ARMv8 CRC32)\n");
#else
  std::printf("  architecture: other (software only)\n");
#endif
  if (required == nullptr || std::string(required) != "1") return;
  CHECK(kvtier::test::crc32c_hardware_path_available());
  CHECK(kvtier::crc32c_is_hardware());
}

KV_TEST(hardware_and_software_paths_agree_on_random_spans) {
  if (!kvtier::test::crc32c_hardware_path_available()) {
    std::printf("  skipped: this CPU has no CRC32C instructions\n");
    return;
  }
  // Lengths up to five interleaved rounds (3 x 4096 bytes each) plus a tail, at every
  // alignment, from arbitrary starting states: the joins of the three streams and the word
  // and byte tails all get exercised.
  const auto data = kvtest::pattern(6 * 3 * 4096 + 128, 21);
  std::mt19937 rng(12345);
  std::uniform_int_distribution<std::size_t> offset_of(0, 63);
  std::uniform_int_distribution<std::size_t> length_of(0, 5 * 3 * 4096 + 100);
  for (int i = 0; i < 2000; ++i) {
    const unsigned char* p = data.data() + offset_of(rng);
    const std::size_t n = length_of(rng);
    const std::uint32_t seed = static_cast<std::uint32_t>(rng());
    const std::uint32_t want = kvtier::test::crc32c_software_path(p, n, seed);
    CHECK_EQ(kvtier::test::crc32c_hardware_path(p, n, seed), want);
    CHECK_EQ(kvtier::crc32c(p, n, seed), want);
  }
}

KV_TEST(all_paths_agree_on_every_length_and_alignment) {
  const auto data = kvtest::pattern((1u << 20) + 64, 7);
  const bool hw = kvtier::test::crc32c_hardware_path_available();
  // Every start offset 0..15 (unaligned word loads) and lengths around the 8-byte steps.
  for (std::size_t offset = 0; offset < 16; ++offset) {
    for (std::size_t n = 0; n < 300; ++n) {
      const unsigned char* p = data.data() + offset;
      const std::uint32_t want = reference_crc32c(p, n);
      CHECK_EQ(kvtier::crc32c(p, n), want);
      CHECK_EQ(kvtier::test::crc32c_software_path(p, n), want);
      if (hw) CHECK_EQ(kvtier::test::crc32c_hardware_path(p, n), want);
    }
  }
  for (std::size_t n :
       {std::size_t{1000}, std::size_t{4095}, std::size_t{4096}, std::size_t{4096 + 63},
        // around the hardware path's interleaved rounds of 3 x 4096 bytes
        std::size_t{3 * 4096 - 1}, std::size_t{3 * 4096}, std::size_t{3 * 4096 + 1},
        std::size_t{6 * 4096 + 7}, std::size_t{100003}, std::size_t{(1u << 20) + 13}}) {
    for (std::size_t offset : {std::size_t{0}, std::size_t{3}}) {
      const unsigned char* p = data.data() + offset;
      const std::uint32_t want = reference_crc32c(p, n);
      CHECK_EQ(kvtier::crc32c(p, n), want);
      CHECK_EQ(kvtier::test::crc32c_software_path(p, n), want);
      if (hw) CHECK_EQ(kvtier::test::crc32c_hardware_path(p, n), want);
    }
  }
}

KV_TEST(incremental_equals_one_shot) {
  const auto data = kvtest::pattern(40000, 11);
  const std::uint32_t whole = kvtier::crc32c(data.data(), data.size());
  for (std::size_t split :
       {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{4096},
        std::size_t{9999}, std::size_t{10000}, std::size_t{12289}, std::size_t{25000}}) {
    const std::uint32_t first = kvtier::crc32c(data.data(), split);
    CHECK_EQ(kvtier::crc32c(data.data() + split, data.size() - split, first), whole);
    CHECK_EQ(
        kvtier::test::crc32c_software_path(data.data() + split, data.size() - split,
                                           kvtier::test::crc32c_software_path(data.data(), split)),
        whole);
  }
}

KV_TEST(a_flipped_bit_changes_the_checksum) {
  auto data = kvtest::pattern(8192, 3);
  const std::uint32_t before = kvtier::crc32c(data.data(), data.size());
  for (std::size_t i : {std::size_t{0}, std::size_t{4095}, std::size_t{8191}}) {
    data[i] ^= 0x01;
    CHECK(kvtier::crc32c(data.data(), data.size()) != before);
    data[i] ^= 0x01;
  }
  CHECK_EQ(kvtier::crc32c(data.data(), data.size()), before);
}
