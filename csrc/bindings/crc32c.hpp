#pragma once

#include <pybind11/pybind11.h>

namespace kvtier::bindings {

/// Adds crc32c_implementation() and the benchmark hook _crc32c_chunks() to the module.
void register_crc32c(pybind11::module_& m);

}  // namespace kvtier::bindings
