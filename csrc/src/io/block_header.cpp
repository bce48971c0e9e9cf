#include "io/block_header.hpp"

#include <cstring>

#include <kvtier/format.hpp>

namespace kvtier::detail {
namespace {

// Headers are little-endian on disk; the supported hosts (x86-64, aarch64) are too, so these
// are plain copies. A big-endian port would byte-swap here and nowhere else.
template <typename T>
void put(unsigned char* p, std::size_t offset, T value) {
  std::memcpy(p + offset, &value, sizeof(T));
}
template <typename T>
T get(const unsigned char* p, std::size_t offset) {
  T value;
  std::memcpy(&value, p + offset, sizeof(T));
  return value;
}

std::uint32_t header_crc(const unsigned char* header) {
  // CRC over the whole header with the CRC field itself read as zero.
  std::uint32_t crc = crc32c(header, header_offset::kHeaderCrc);
  const unsigned char zero[4] = {0, 0, 0, 0};
  crc = crc32c(zero, 4, crc);
  constexpr std::size_t rest = header_offset::kHeaderCrc + 4;
  return crc32c(header + rest, kHeaderSize - rest, crc);
}

}  // namespace

void encode_header(unsigned char* out, std::string_view key, std::string_view fingerprint,
                   std::uint64_t payload_length, Checksum checksum, std::uint32_t payload_crc) {
  std::memset(out, 0, kHeaderSize);
  std::memcpy(out + header_offset::kMagic, kMagic, sizeof(kMagic));
  put<std::uint32_t>(out, header_offset::kVersion, kFormatVersion);
  put<std::uint64_t>(out, header_offset::kPayloadLength, payload_length);
  const bool crc = checksum == Checksum::kCrc32c;
  put<std::uint32_t>(out, header_offset::kChecksumKind,
                     crc ? kChecksumKindCrc32c : kChecksumKindNone);
  put<std::uint32_t>(out, header_offset::kPayloadCrc, crc ? payload_crc : 0);
  put<std::uint32_t>(out, header_offset::kKeyLength, static_cast<std::uint32_t>(key.size()));
  put<std::uint32_t>(out, header_offset::kFingerprintLength,
                     static_cast<std::uint32_t>(fingerprint.size()));
  std::memcpy(out + header_offset::kFingerprint, fingerprint.data(), fingerprint.size());
  std::memcpy(out + header_offset::kKey, key.data(), key.size());
  put<std::uint32_t>(out, header_offset::kHeaderCrc, header_crc(out));
}

std::string verify_header(const unsigned char* in, std::string_view key,
                          std::string_view fingerprint, std::uint64_t expected_payload_length,
                          DecodedHeader& out) {
  if (std::memcmp(in + header_offset::kMagic, kMagic, sizeof(kMagic)) != 0)
    return "not a kvtier block file (bad magic)";
  const auto version = get<std::uint32_t>(in, header_offset::kVersion);
  if (version != kFormatVersion) return "unsupported format version " + std::to_string(version);
  if (get<std::uint32_t>(in, header_offset::kHeaderCrc) != header_crc(in))
    return "header checksum mismatch";
  const auto key_length = get<std::uint32_t>(in, header_offset::kKeyLength);
  if (key_length != key.size() ||
      std::memcmp(in + header_offset::kKey, key.data(), key.size()) != 0)
    return "key mismatch";
  const auto fp_length = get<std::uint32_t>(in, header_offset::kFingerprintLength);
  if (fp_length != fingerprint.size() ||
      std::memcmp(in + header_offset::kFingerprint, fingerprint.data(), fingerprint.size()) != 0)
    return "layout fingerprint mismatch";
  out.payload_length = get<std::uint64_t>(in, header_offset::kPayloadLength);
  if (out.payload_length != expected_payload_length)
    return "payload length " + std::to_string(out.payload_length) + " != expected " +
           std::to_string(expected_payload_length);
  out.checksum_kind = get<std::uint32_t>(in, header_offset::kChecksumKind);
  if (out.checksum_kind != kChecksumKindNone && out.checksum_kind != kChecksumKindCrc32c)
    return "unknown payload checksum kind " + std::to_string(out.checksum_kind);
  out.payload_crc = get<std::uint32_t>(in, header_offset::kPayloadCrc);
  return {};
}

}  // namespace kvtier::detail
