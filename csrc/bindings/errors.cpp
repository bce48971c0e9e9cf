// Core errors as Python exceptions: each C++ error type of the core becomes what
// kvtier.errors._from_core(kind, errno, message, path, where) returns (the package's typed
// exceptions); where that module or function is missing (an older or partial install) it
// becomes the builtin Python raised before: an OSError of the errno's subclass
// (FileNotFoundError, ...), ValueError or RuntimeError.
#include <exception>
#include <stdexcept>
#include <string>

#include "bindings.hpp"

namespace kvtier::python {
namespace {

// kvtier.errors._from_core, or None when it cannot be had.
py::object core_error_factory() {
  PyObject* module = PyImport_ImportModule("kvtier.errors");
  if (module == nullptr) {
    PyErr_Clear();
    return py::none();
  }
  const py::object errors = py::reinterpret_steal<py::object>(module);
  if (!py::hasattr(errors, "_from_core")) return py::none();
  return errors.attr("_from_core");
}

void set_python_error(const py::object& exception) {
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr())), exception.ptr());
}

// Raises (sets the Python error for) one core error. `fallback` is the builtin type used
// without kvtier.errors; for PyExc_OSError it is built from errno, message and path, so that
// Python picks the errno's subclass and sets .errno, .strerror and .filename.
void raise_core_error(const char* kind, int errno_value, const char* message,
                      const std::string& path, const std::string& where, PyObject* fallback) {
  const py::object factory = core_error_factory();
  if (!factory.is_none()) {
    // An exception raised by the factory itself propagates (error_already_set).
    const py::object made = factory(kind, errno_value, message, path, where);
    if (!PyExceptionInstance_Check(made.ptr()))
      throw py::type_error(std::string("kvtier.errors._from_core returned ") +
                           Py_TYPE(made.ptr())->tp_name + ", not an exception");
    set_python_error(made);
    return;
  }
  if (fallback == PyExc_OSError) {
    set_python_error(py::reinterpret_steal<py::object>(
        PyObject_CallFunction(PyExc_OSError, "isO", errno_value, message, py::str(path).ptr())));
    return;
  }
  PyErr_SetString(fallback, message);
}

void translate_core_error(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const py::error_already_set&) {
    throw;  // a Python error already: pybind11 restores it
  } catch (const py::builtin_exception&) {
    throw;  // py::value_error and friends: pybind11 maps them (they are runtime_errors too)
  } catch (const kvtier::IoUringRefusedError& e) {
    raise_core_error("io_uring_refused", e.code().value(), e.what(), e.path(), e.where(),
                     PyExc_OSError);
  } catch (const kvtier::SystemError& e) {
    raise_core_error("system", e.code().value(), e.what(), e.path(), e.where(), PyExc_OSError);
  } catch (const kvtier::EngineShutDownError& e) {
    raise_core_error("shut_down", 0, e.what(), "", "", PyExc_RuntimeError);
  } catch (const kvtier::ForkedProcessError& e) {
    raise_core_error("forked", 0, e.what(), "", "", PyExc_RuntimeError);
  } catch (const std::invalid_argument& e) {
    raise_core_error("invalid_argument", 0, e.what(), "", "", PyExc_ValueError);
  } catch (const std::range_error&) {
    throw;  // pybind11's ValueError, as before
  } catch (const std::overflow_error&) {
    throw;  // pybind11's OverflowError, as before
  } catch (const std::runtime_error& e) {
    raise_core_error("runtime", 0, e.what(), "", "", PyExc_RuntimeError);
  }
  // Anything else (std::bad_alloc: MemoryError, std::out_of_range: IndexError, ...) leaves
  // this translator and gets pybind11's own translation.
}

}  // namespace

void register_errors(py::module_& m) {
  (void)m;
  py::register_exception_translator(&translate_core_error);
}

}  // namespace kvtier::python
