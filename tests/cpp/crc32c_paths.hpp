#pragma once

#include <cstddef>
#include <cstdint>

namespace kvtier::test {

/// The slicing-by-8 software path of kvtier::crc32c, whatever the CPU has.
std::uint32_t crc32c_software_path(const void* data, std::size_t length,
                                   std::uint32_t crc = 0) noexcept;
/// Whether the CPU has the crc32 instruction the hardware path uses.
bool crc32c_hardware_path_available() noexcept;
/// The hardware path (only meaningful when crc32c_hardware_path_available()).
std::uint32_t crc32c_hardware_path(const void* data, std::size_t length,
                                   std::uint32_t crc = 0) noexcept;

}  // namespace kvtier::test
