// Gives the tests both CRC32C code paths of csrc/src/util/crc32c.cpp, which keeps them private
// (anonymous namespace) and picks one at start-up. This translation unit compiles a renamed
// copy of that file (the public names get a prefix, so nothing clashes with the library),
// and wraps its internals so hardware and software results can be compared on one machine.
#define crc32c kvtier_test_copy_crc32c
#define crc32c_is_hardware kvtier_test_copy_crc32c_is_hardware
#include "util/crc32c.cpp"
#undef crc32c
#undef crc32c_is_hardware

#include "crc32c_paths.hpp"

namespace kvtier::test {

std::uint32_t crc32c_software_path(const void* data, std::size_t length,
                                   std::uint32_t crc) noexcept {
  return ~crc32c_software(static_cast<const unsigned char*>(data), length, ~crc);
}

bool crc32c_hardware_path_available() noexcept {
  return kHardware;
}

std::uint32_t crc32c_hardware_path(const void* data, std::size_t length,
                                   std::uint32_t crc) noexcept {
#if defined(KVTIER_CRC32C_TARGET)
  if (kHardware) return ~crc32c_hardware(static_cast<const unsigned char*>(data), length, ~crc);
#endif
  (void)data;
  (void)length;
  (void)crc;
  return 0;
}

}  // namespace kvtier::test
