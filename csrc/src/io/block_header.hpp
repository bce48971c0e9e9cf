#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <kvtier/config.hpp>

namespace kvtier::detail {

/// Field offsets of the 4096-byte block header (all integers little-endian).
/// docs/FORMAT.md is the normative description; keep the two in step.
namespace header_offset {
inline constexpr std::size_t kMagic = 0;           // 8 bytes
inline constexpr std::size_t kVersion = 8;         // u32
inline constexpr std::size_t kHeaderCrc = 12;      // u32, CRC32C of the header with this field 0
inline constexpr std::size_t kPayloadLength = 16;  // u64
inline constexpr std::size_t kChecksumKind = 24;   // u32: 0 none, 1 crc32c
inline constexpr std::size_t kPayloadCrc = 28;     // u32
inline constexpr std::size_t kKeyLength = 32;      // u32
inline constexpr std::size_t kFingerprintLength = 36;  // u32
inline constexpr std::size_t kFingerprint = 40;        // 32 bytes, zero padded
inline constexpr std::size_t kKey = 72;                // key_length bytes
}  // namespace header_offset

inline constexpr std::uint32_t kChecksumKindNone = 0;
inline constexpr std::uint32_t kChecksumKindCrc32c = 1;

/// Writes a complete header into `out` (kHeaderSize bytes, zero-filled first).
void encode_header(unsigned char* out, std::string_view key, std::string_view fingerprint,
                   std::uint64_t payload_length, Checksum checksum, std::uint32_t payload_crc);

/// What a header says, once its own checksum has been verified.
struct DecodedHeader {
  std::uint64_t payload_length = 0;
  std::uint32_t checksum_kind = kChecksumKindNone;
  std::uint32_t payload_crc = 0;
};

/// Verifies magic, version, header CRC, key, fingerprint and payload length.
/// Returns an empty string and fills `out` when the header is valid, else what is wrong.
std::string verify_header(const unsigned char* in, std::string_view key,
                          std::string_view fingerprint, std::uint64_t expected_payload_length,
                          DecodedHeader& out);

}  // namespace kvtier::detail
