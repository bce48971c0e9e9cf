#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::test {

/// Every CRC32C implementation compiled in for this architecture, fastest first: the names
/// kvtier::crc32c_implementation() reports, "table" last.
std::vector<std::string> crc32c_path_names();
/// Whether the library's detection says this CPU runs implementation `name`.
bool crc32c_path_supported(const std::string& name);
/// CRC32C through implementation `name` whatever kvtier::crc32c() runs, with the same contract
/// (`crc` a previous result, 0 to start). `name` must be supported.
std::uint32_t crc32c_path(const std::string& name, const void* data, std::size_t length,
                          std::uint32_t crc = 0);
/// The raw register after `length` bytes from `state` (no inversions), through `name`: what
/// the kernels pass between each other.
std::uint32_t crc32c_path_raw(const std::string& name, const void* data, std::size_t length,
                              std::uint32_t state);
/// kvtier::crc32c_copy() through implementation `name` (its fused or blocked copy), whatever
/// kvtier::crc32c_copy() runs. `name` must be supported.
std::uint32_t crc32c_copy_path(const std::string& name, void* dst, const void* src,
                               std::size_t length, std::uint32_t crc = 0);

/// kvtier::crc32c_copy_uncached() through implementation `name` (its uncached copy, or its
/// copy where it has none). `name` must be supported.
std::uint32_t crc32c_copy_uncached_path(const std::string& name, void* dst, const void* src,
                                        std::size_t length, std::uint32_t crc = 0);

}  // namespace kvtier::test
