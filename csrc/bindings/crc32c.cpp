// CRC32C bindings beyond crc32c()/crc32c_is_hardware() (module.cpp): which implementation
// runs, the fused copy and CRC (crc32c_copy), and loops that let bench/crc32c_speed.py time
// the kernels on small blocks without a Python call per block.
#include "bindings.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include <kvtier/format.hpp>

namespace kvtier::python {

using namespace pybind11::literals;

namespace {

// A C-contiguous view of any buffer-protocol object (writable if asked), released on scope
// exit.
class View {
 public:
  explicit View(const py::handle& object, bool writable = false) {
    if (PyObject_GetBuffer(object.ptr(), &view_,
                           PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) != 0)
      throw py::error_already_set();
  }
  ~View() { PyBuffer_Release(&view_); }
  View(const View&) = delete;
  View& operator=(const View&) = delete;

  unsigned char* data() const noexcept { return static_cast<unsigned char*>(view_.buf); }
  std::size_t size() const noexcept { return static_cast<std::size_t>(view_.len); }

 private:
  Py_buffer view_{};
};

// Views `dst` (writable) and `src` as the two sides of a copy: the same length, and not
// overlapping, which memcpy and the fused kernels assume.
void check_copy(const char* function, const View& dst, const View& src) {
  if (dst.size() != src.size())
    throw py::value_error(std::string(function) + ": dst has " + std::to_string(dst.size()) +
                          " bytes and src " + std::to_string(src.size()) +
                          "; they must be the same length");
  const auto d = reinterpret_cast<std::uintptr_t>(dst.data());
  const auto s = reinterpret_cast<std::uintptr_t>(src.data());
  if (src.size() > 0 && d < s + src.size() && s < d + dst.size())
    throw py::value_error(std::string(function) + ": dst and src overlap");
}

std::uint32_t crc32c_copy(const py::buffer& dst, const py::buffer& src, std::uint32_t crc) {
  View to(dst, /*writable=*/true), from(src);
  check_copy("crc32c_copy", to, from);
  GilReleased release;
  return kvtier::crc32c_copy(crc, to.data(), from.data(), from.size());
}

// Each `chunk_bytes` piece of src (a shorter last piece included) to the same offset of dst,
// `passes` times over, in one of the ways bench/crc32c_speed.py compares: "memcpy" (the copy
// alone), "crc" (crc32c() of src alone), "memcpy+crc" (memcpy, then crc32c() of the copy) or
// "fused" (crc32c_copy()) or "fused-uncached" (crc32c_copy_uncached()). Returns the XOR of the
// pieces' CRCs (0 for "memcpy").
std::uint32_t crc32c_copy_chunks(const py::buffer& dst, const py::buffer& src,
                                 std::size_t chunk_bytes, std::size_t passes,
                                 const std::string& mode) {
  if (chunk_bytes == 0)
    throw py::value_error("_crc32c_copy_chunks: chunk_bytes must be at least 1, got 0");
  enum class Mode { kMemcpy, kCrc, kMemcpyThenCrc, kFused, kFusedUncached };
  Mode m;
  if (mode == "memcpy") {
    m = Mode::kMemcpy;
  } else if (mode == "crc") {
    m = Mode::kCrc;
  } else if (mode == "memcpy+crc") {
    m = Mode::kMemcpyThenCrc;
  } else if (mode == "fused") {
    m = Mode::kFused;
  } else if (mode == "fused-uncached") {
    m = Mode::kFusedUncached;
  } else {
    throw py::value_error("_crc32c_copy_chunks: mode must be 'memcpy', 'crc', 'memcpy+crc', "
                          "'fused' or 'fused-uncached', got '" + mode + "'");
  }
  View to(dst, /*writable=*/true), from(src);
  check_copy("_crc32c_copy_chunks", to, from);
  GilReleased release;
  std::uint32_t combined = 0;
  for (std::size_t pass = 0; pass < passes; ++pass)
    for (std::size_t at = 0; at < from.size(); at += chunk_bytes) {
      const std::size_t n = from.size() - at < chunk_bytes ? from.size() - at : chunk_bytes;
      unsigned char* d = to.data() + at;
      const unsigned char* s = from.data() + at;
      switch (m) {
        case Mode::kMemcpy:
          std::memcpy(d, s, n);
          break;
        case Mode::kCrc:
          combined ^= kvtier::crc32c(s, n);
          break;
        case Mode::kMemcpyThenCrc:
          std::memcpy(d, s, n);
          combined ^= kvtier::crc32c(d, n);
          break;
        case Mode::kFused:
          combined ^= kvtier::crc32c_copy(0, d, s, n);
          break;
        case Mode::kFusedUncached:
          combined ^= kvtier::crc32c_copy_uncached(0, d, s, n);
          break;
      }
    }
  return combined;
}

// The CRC32C of each `chunk_bytes` piece of `data` (a shorter last piece included), `passes`
// times over, XORed together so the work cannot be skipped and the result can be checked.
std::uint32_t crc32c_chunks(const py::buffer& data, std::size_t chunk_bytes, std::size_t passes) {
  if (chunk_bytes == 0)
    throw py::value_error("_crc32c_chunks: chunk_bytes must be at least 1, got 0");
  View view(data);
  GilReleased release;
  std::uint32_t combined = 0;
  for (std::size_t pass = 0; pass < passes; ++pass)
    for (std::size_t at = 0; at < view.size(); at += chunk_bytes) {
      const std::size_t n = view.size() - at < chunk_bytes ? view.size() - at : chunk_bytes;
      combined ^= kvtier::crc32c(view.data() + at, n);
    }
  return combined;
}

}  // namespace

void register_crc32c(py::module_& m) {
  m.def("crc32c_implementation", &kvtier::crc32c_implementation,
        "The CRC32C implementation crc32c() runs: 'avx512-vpclmul', 'avx2-vpclmul', 'sse42', "
        "'armv8-pmull', 'armv8-crc' or 'table' (KVTIER_CRC32C_IMPL, read once, forces one).");
  m.def("_crc32c_chunks", &crc32c_chunks, "data"_a, "chunk_bytes"_a, "passes"_a = 1,
        "XOR of the CRC32C of every chunk_bytes piece of data, passes times over (a benchmark "
        "hook for bench/crc32c_speed.py).");
  m.def("crc32c_copy", &crc32c_copy, "dst"_a, "src"_a, "crc"_a = 0,
        "Copies src into dst (C-contiguous buffers of the same length that do not overlap; dst "
        "writable) and returns the CRC32C of the bytes, continuing from crc: memcpy then crc32c "
        "in one pass, on the implementation crc32c() runs.");
  m.def("_crc32c_copy_chunks", &crc32c_copy_chunks, "dst"_a, "src"_a, "chunk_bytes"_a,
        "passes"_a = 1, "mode"_a = "fused",
        "Copies src into dst chunk_bytes at a time, passes times over, as 'memcpy', 'crc' (of src "
        "only), 'memcpy+crc', 'fused' (crc32c_copy) or 'fused-uncached' "
        "(crc32c_copy_uncached); returns the XOR of the chunks' CRC32C (0 for 'memcpy'). A "
        "benchmark hook for bench/crc32c_speed.py.");
}

}  // namespace kvtier::python
