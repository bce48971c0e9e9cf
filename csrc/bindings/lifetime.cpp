// How Python-owned engines end: the registry of live engines, the interpreter exit hook that
// stops them before Python frees the memory their workers address, the fork handler that
// keeps the registry usable in a child, and the destructor that runs without the GIL.
#include <pthread.h>
#include <unistd.h>

#include <cxxabi.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "bindings.hpp"

namespace kvtier::python {
namespace {

// Engines alive in this process: interpreter exit stops them before Python frees the memory
// they address (an engine in a module global may otherwise be destroyed after its buffers,
// or never). Leaked on purpose so it outlives every engine, even in static destruction.
struct EngineRegistry {
  std::mutex mutex;  // held while the exit hook stops engines: a destructor waits for it
  std::unordered_map<const PyEngine*, pid_t> engines;  // engine -> pid that created it
};

EngineRegistry& registry() {
  static auto* r = [] {
    auto* made = new EngineRegistry;
    // A child forked while another thread held the mutex (creating or dropping an engine)
    // would wait for it for ever: fork() waits for the mutex instead, and both sides
    // release it.
    ::pthread_atfork([] { registry().mutex.lock(); }, [] { registry().mutex.unlock(); },
                     [] { registry().mutex.unlock(); });
    return made;
  }();
  return *r;
}

// The interpreter's main thread, which runs its finalization (recorded at import).
std::atomic<unsigned long> main_thread_ident{0};

bool interpreter_finalizing() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;  // an atomic read: callable without the GIL
#endif
}

// atexit hook: every engine of this process stops (running block operations finish, queued
// ones are cancelled). Engines inherited through fork() have no workers here to stop.
void shutdown_all_engines() {
  GilReleased release;
  EngineRegistry& r = registry();
  std::lock_guard lock(r.mutex);
  const pid_t self = ::getpid();
  for (const auto& [engine, pid] : r.engines)
    if (pid == self) const_cast<PyEngine*>(engine)->shutdown();
}

}  // namespace

PyEngine::PyEngine(kvtier::EngineConfig config) : kvtier::Engine(std::move(config)) {
  std::lock_guard lock(registry().mutex);
  registry().engines.emplace(this, ::getpid());
}

PyEngine::~PyEngine() {
  PyThreadState* state = PyEval_SaveThread();
  // Stop first, then leave the registry: an exit hook stopping this engine at the same time
  // holds the registry and waits in the same (serialised, idempotent) shutdown().
  shutdown();
  {
    std::lock_guard lock(registry().mutex);
    registry().engines.erase(this);
  }
  // A daemon thread that dropped the last reference while the interpreter finalizes parks
  // (GilReleased): the engine has stopped; the exiting process keeps the buffers until it is
  // gone.
  GilReleased::take_back_gil(state);
  // buffers_ goes now, with the GIL held again and no worker left to touch its memory.
}

namespace {

bool on_main_thread() noexcept {
  return PyThread_get_thread_ident() == main_thread_ident.load(std::memory_order_relaxed);
}

[[noreturn]] void park() noexcept {
  for (;;) ::pause();
}

}  // namespace

void GilReleased::take_back_gil(PyThreadState* state) noexcept {
  if (!on_main_thread() && interpreter_finalizing()) park();
#if defined(__GLIBCXX__)
  try {
    PyEval_RestoreThread(state);
  } catch (abi::__forced_unwind&) {
    // Finalization began while this thread waited for the GIL. Never leaving the handler is
    // what makes catching a forced unwind legal (leaving it without a rethrow aborts).
    park();
  }
#else
  PyEval_RestoreThread(state);
#endif
}

void register_lifetime(py::module_& m) {
  (void)m;
  main_thread_ident =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  py::module_::import("atexit").attr("register")(py::cpp_function(&shutdown_all_engines));
}

}  // namespace kvtier::python
