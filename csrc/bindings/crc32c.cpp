// CRC32C bindings beyond crc32c()/crc32c_is_hardware() (module.cpp): which implementation
// runs, and a loop that lets bench/crc32c_speed.py time the kernel on small blocks without
// a Python call per block.
#include "bindings.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

#include <kvtier/format.hpp>

namespace kvtier::python {

using namespace pybind11::literals;

namespace {

// A C-contiguous read-only view of any buffer-protocol object, released on scope exit.
class ReadView {
 public:
  explicit ReadView(const py::handle& object) {
    if (PyObject_GetBuffer(object.ptr(), &view_, PyBUF_C_CONTIGUOUS) != 0)
      throw py::error_already_set();
  }
  ~ReadView() { PyBuffer_Release(&view_); }
  ReadView(const ReadView&) = delete;
  ReadView& operator=(const ReadView&) = delete;

  const unsigned char* data() const noexcept {
    return static_cast<const unsigned char*>(view_.buf);
  }
  std::size_t size() const noexcept { return static_cast<std::size_t>(view_.len); }

 private:
  Py_buffer view_{};
};

// The CRC32C of each `chunk_bytes` piece of `data` (a shorter last piece included), `passes`
// times over, XORed together so the work cannot be skipped and the result can be checked.
std::uint32_t crc32c_chunks(const py::buffer& data, std::size_t chunk_bytes, std::size_t passes) {
  if (chunk_bytes == 0)
    throw py::value_error("_crc32c_chunks: chunk_bytes must be at least 1, got 0");
  ReadView view(data);
  py::gil_scoped_release release;
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
}

}  // namespace kvtier::python
