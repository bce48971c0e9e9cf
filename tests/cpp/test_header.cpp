// The block header (csrc/src/io/block_header.hpp): what is encoded is verified, and every field
// that can go wrong is caught with a message that says which.
#include <cstring>
#include <string>
#include <vector>

#include <kvtier/format.hpp>

#include "harness.hpp"
#include "io/block_header.hpp"

namespace {

namespace off = kvtier::detail::header_offset;
using kvtier::detail::DecodedHeader;
using kvtier::detail::encode_header;
using kvtier::detail::verify_header;

std::vector<unsigned char> make_header(const std::string& key, const std::string& fingerprint,
                                       std::uint64_t length, std::uint32_t crc) {
  std::vector<unsigned char> h(kvtier::kHeaderSize, 0xCC);
  encode_header(h.data(), key, fingerprint, length, kvtier::Checksum::kCrc32c, crc);
  return h;
}

std::string verify(const std::vector<unsigned char>& h, const std::string& key,
                   const std::string& fingerprint, std::uint64_t length) {
  DecodedHeader out;
  return verify_header(h.data(), key, fingerprint, length, out);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

KV_TEST(round_trip) {
  const std::string key("\x00\x01key\xff", 6);  // keys are bytes, not C strings
  auto h = make_header(key, "fp-1", 12345, 0xDEADBEEF);
  DecodedHeader out;
  CHECK_EQ(verify_header(h.data(), key, "fp-1", 12345, out), std::string());
  CHECK_EQ(out.payload_length, std::uint64_t{12345});
  CHECK_EQ(out.payload_crc, 0xDEADBEEFu);
  CHECK_EQ(out.checksum_kind, kvtier::detail::kChecksumKindCrc32c);
  CHECK(std::memcmp(h.data(), kvtier::kMagic, sizeof(kvtier::kMagic)) == 0);
  // Everything past the key is zero (the encoder clears the whole header first).
  for (std::size_t i = off::kKey + key.size(); i < h.size(); ++i)
    CHECK_MSG(h[i] == 0, "byte " + std::to_string(i));
}

KV_TEST(checksum_none_is_recorded) {
  std::vector<unsigned char> h(kvtier::kHeaderSize);
  encode_header(h.data(), "k", "", 10, kvtier::Checksum::kNone, 0x1234);
  DecodedHeader out;
  CHECK_EQ(verify_header(h.data(), "k", "", 10, out), std::string());
  CHECK_EQ(out.checksum_kind, kvtier::detail::kChecksumKindNone);
  CHECK_EQ(out.payload_crc, 0u);
}

KV_TEST(mismatches_are_named) {
  const auto good = make_header("key", "fp", 100, 1);
  CHECK(contains(verify(good, "kez", "fp", 100), "key mismatch"));
  CHECK(contains(verify(good, "ke", "fp", 100), "key mismatch"));
  CHECK(contains(verify(good, "key", "fq", 100), "fingerprint"));
  CHECK(contains(verify(good, "key", "", 100), "fingerprint"));
  CHECK(contains(verify(good, "key", "fp", 101), "payload length"));

  auto bad_magic = good;
  bad_magic[off::kMagic] ^= 1;
  CHECK(contains(verify(bad_magic, "key", "fp", 100), "magic"));

  auto bad_version = good;
  bad_version[off::kVersion] ^= 0x7F;
  CHECK(contains(verify(bad_version, "key", "fp", 100), "version"));

  // Any other flipped byte, even in the zero padding, breaks the header's own CRC.
  for (std::size_t at : {off::kPayloadLength, off::kPayloadCrc, off::kKey, std::size_t{2000},
                         kvtier::kHeaderSize - 1}) {
    auto flipped = good;
    flipped[at] ^= 0x40;
    CHECK_MSG(contains(verify(flipped, "key", "fp", 100), "header checksum"),
              "flipped byte " + std::to_string(at));
  }
}
