#pragma once

// What the binding's translation units share. Each registers its part of kvtier._core with
// one call from PYBIND11_MODULE (module.cpp): a new part is a new file with a register_*
// function declared here and called there.

#include <pybind11/pybind11.h>

#include <kvtier/kvtier.hpp>

namespace kvtier::python {

namespace py = pybind11;

// The Engine as Python owns it. Workers hold raw addresses into caller memory, so the
// objects owning that memory (keep_alive()) are released only after the workers have stopped,
// whatever order Python tears things down in; stopping joins threads that may wait on a slow
// mount, so it runs with the GIL released. Runs with the GIL held (pybind11 dealloc).
class PyEngine final : public kvtier::Engine {
 public:
  explicit PyEngine(kvtier::EngineConfig config);
  ~PyEngine();
  PyEngine(const PyEngine&) = delete;
  PyEngine& operator=(const PyEngine&) = delete;

  // Called with the GIL held.
  void keep_alive(const py::iterable& buffers) {
    if (!buffers_) buffers_ = py::list();
    for (const py::handle buffer : buffers) buffers_.append(buffer);
  }

  /// Logs one warning through Python's logging the first time stats() shows a worker that
  /// gave its io_uring up (io_uring_enter kept failing). Called with the GIL held.
  void warn_if_ring_retired();

 private:
  bool warned_ring_retired_ = false;
  // Null until keep_alive(): the engine is constructed with the GIL released, when no Python
  // object may be created.
  py::list buffers_ = py::reinterpret_steal<py::list>(py::handle());
};

/// Releases the GIL around a call into the core, on whatever thread makes it (the tier's
/// daemon threads among them: lookups' checks, eviction's unlinks, the capacity thread's
/// CRCs). Every release in the binding is one of these, never py::gil_scoped_release.
///
/// Takes the GIL back at the end as that does, except on a thread other than the main one
/// once the interpreter is finalizing: CPython ends such a thread with a forced unwind when it
/// asks for the GIL, which through a noexcept destructor is std::terminate (an abort at exit,
/// seen with an unlink on a stalled mount that returned after exit began) and through any
/// other would run the C++ frames' cleanups (buffer releases, reference counts) without the
/// GIL. That thread parks instead and ends with the process (lifetime.cpp), whether it saw
/// finalization begin before it asked for the GIL or while it waited. Before finalization
/// (atexit hooks still running, which may wait for this thread: a finalizer that closes a
/// tier joins its capacity thread) it takes the GIL back as usual.
class GilReleased {
 public:
  /// ``release`` false holds the GIL throughout (a release only some calls need).
  explicit GilReleased(bool release = true) : state_(release ? PyEval_SaveThread() : nullptr) {}
  ~GilReleased() {
    if (state_ != nullptr) take_back_gil(state_);
  }
  GilReleased(const GilReleased&) = delete;
  GilReleased& operator=(const GilReleased&) = delete;

  /// PyEval_RestoreThread(state), or parks for ever as above.
  static void take_back_gil(PyThreadState* state) noexcept;

 private:
  PyThreadState* state_;
};

/// The exception translator: core errors become kvtier.errors' types (errors.cpp).
void register_errors(py::module_& m);
/// Engine, its defaults and limits, and job submission (engine.cpp).
void register_engine(py::module_& m);
/// crc32c_implementation() and the benchmark hook _crc32c_chunks() (crc32c.cpp).
void register_crc32c(py::module_& m);
/// The exit hook that stops every engine of the process before Python frees their memory
/// (lifetime.cpp). Call last: it records the interpreter's main thread.
void register_lifetime(py::module_& m);

}  // namespace kvtier::python
