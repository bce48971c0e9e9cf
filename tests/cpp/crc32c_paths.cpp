// Gives the tests every CRC32C implementation of csrc/src/util/crc32c.cpp, which keeps its
// dispatch table private (anonymous namespace) and runs one of them. This translation unit
// compiles a renamed copy of that file (the public names get a prefix, so nothing clashes with
// the library; the test program compiles its own copy of the kernels in csrc/src/util too),
// and reaches each implementation through the copy's table.
#define crc32c kvtier_test_copy_crc32c
#define crc32c_is_hardware kvtier_test_copy_crc32c_is_hardware
#define crc32c_implementation kvtier_test_copy_crc32c_implementation
#define crc32c_copy kvtier_test_copy_crc32c_copy
#define crc32c_copy_uncached kvtier_test_copy_crc32c_copy_uncached
#include "util/crc32c.cpp"
#undef crc32c
#undef crc32c_copy
#undef crc32c_copy_uncached
#undef crc32c_is_hardware
#undef crc32c_implementation

#include <stdexcept>

#include "crc32c_paths.hpp"

namespace kvtier::test {
namespace {

const Implementation& implementation(const std::string& name) {
  for (const Implementation& impl : kImplementations)
    if (name == impl.name) {
      if (!impl.supported()) throw std::logic_error("crc32c path " + name + " not supported here");
      return impl;
    }
  throw std::logic_error("no crc32c path named " + name);
}

}  // namespace

std::vector<std::string> crc32c_path_names() {
  std::vector<std::string> names;
  for (const Implementation& impl : kImplementations) names.emplace_back(impl.name);
  return names;
}

bool crc32c_path_supported(const std::string& name) {
  for (const Implementation& impl : kImplementations)
    if (name == impl.name) return impl.supported();
  return false;
}

std::uint32_t crc32c_path(const std::string& name, const void* data, std::size_t length,
                          std::uint32_t crc) {
  return ~crc32c_path_raw(name, data, length, ~crc);
}

std::uint32_t crc32c_path_raw(const std::string& name, const void* data, std::size_t length,
                              std::uint32_t state) {
  return implementation(name).kernel(static_cast<const unsigned char*>(data), length, state);
}

std::uint32_t crc32c_copy_path(const std::string& name, void* dst, const void* src,
                               std::size_t length, std::uint32_t crc) {
  return ~implementation(name).copy(static_cast<unsigned char*>(dst),
                                    static_cast<const unsigned char*>(src), length, ~crc);
}

std::uint32_t crc32c_copy_uncached_path(const std::string& name, void* dst, const void* src,
                                        std::size_t length, std::uint32_t crc) {
  return ~implementation(name).copy_uncached(static_cast<unsigned char*>(dst),
                                             static_cast<const unsigned char*>(src), length, ~crc);
}

}  // namespace kvtier::test
