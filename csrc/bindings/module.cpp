// The only translation unit that knows about Python: argument conversion, GIL handling and
// exception translation over the kvtier C++ core.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_map>

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <kvtier/kvtier.hpp>

#include "crc32c.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

kvtier::ODirectMode o_direct_from_python(const py::object& value) {
  if (py::isinstance<py::bool_>(value))
    return value.cast<bool>() ? kvtier::ODirectMode::kOn : kvtier::ODirectMode::kOff;
  if (py::isinstance<py::str>(value)) return kvtier::parse_o_direct(value.cast<std::string>());
  throw std::invalid_argument("o_direct must be 'auto', True or False, got " +
                              py::repr(value).cast<std::string>());
}

// blocks: a sequence of (path, key, address, length) tuples; path is str or os.PathLike.
std::vector<kvtier::BlockOp> blocks_from_python(const py::sequence& blocks) {
  std::vector<kvtier::BlockOp> ops;
  ops.reserve(blocks.size());
  py::object fspath = py::module_::import("os").attr("fspath");
  for (const py::handle item : blocks) {
    auto t = py::reinterpret_borrow<py::sequence>(item);
    if (t.size() != 4)
      throw std::invalid_argument("each block must be (path, key, address, length)");
    kvtier::BlockOp op;
    op.path = fspath(t[0]).cast<std::string>();
    const py::object key = t[1];
    if (!PyBytes_Check(key.ptr()))  // a str would be encoded to UTF-8 silently
      throw py::type_error(std::string("block key must be bytes, got ") +
                           Py_TYPE(key.ptr())->tp_name);
    op.key = key.cast<std::string>();
    op.data = reinterpret_cast<void*>(t[2].cast<std::uintptr_t>());
    const auto length = t[3].cast<long long>();
    if (length < 0) throw std::invalid_argument("block length must not be negative");
    op.length = static_cast<std::size_t>(length);
    ops.push_back(std::move(op));
  }
  return ops;
}

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

 private:
  // Null until keep_alive(): the engine is constructed with the GIL released, when no Python
  // object may be created.
  py::list buffers_ = py::reinterpret_steal<py::list>(py::handle());
};

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

PyEngine::PyEngine(kvtier::EngineConfig config) : kvtier::Engine(std::move(config)) {
  std::lock_guard lock(registry().mutex);
  registry().engines.emplace(this, ::getpid());
}

// The interpreter's main thread, which runs its finalization (recorded at import), and
// whether the exit hook below has started (from then on only daemon threads run beside it).
std::atomic<unsigned long> main_thread_ident{0};
std::atomic<bool> exit_hook_started{false};

bool interpreter_finalizing() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;  // an atomic read: callable without the GIL
#endif
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
  // A daemon thread that dropped the last reference while the interpreter exits must not
  // wait for the GIL again: once finalization starts, CPython ends such a thread with a
  // forced unwind through this noexcept destructor, and that is std::terminate. The engine
  // has stopped; the exiting process keeps the buffers until it is gone, so this thread
  // parks instead (only daemon threads still run once the exit hook has started).
  if ((exit_hook_started.load() || interpreter_finalizing()) &&
      PyThread_get_thread_ident() != main_thread_ident.load(std::memory_order_relaxed))
    for (;;) ::pause();
  PyEval_RestoreThread(state);
  // buffers_ goes now, with the GIL held again and no worker left to touch its memory.
}

// atexit hook: every engine of this process stops (running block operations finish, queued
// ones are cancelled). Engines inherited through fork() have no workers here to stop.
void shutdown_all_engines() {
  exit_hook_started = true;
  py::gil_scoped_release release;
  EngineRegistry& r = registry();
  std::lock_guard lock(r.mutex);
  const pid_t self = ::getpid();
  for (const auto& [engine, pid] : r.engines)
    if (pid == self) const_cast<PyEngine*>(engine)->shutdown();
}

// A buffer's bytes, refused with ValueError unless C-contiguous: a strided buffer read as if
// it were contiguous gives wrong checksums and addresses bytes outside it. Hold the GIL when
// constructing and destroying; the bytes stay valid (not resized or freed) in between.
class ContiguousBuffer {
 public:
  ContiguousBuffer(const py::handle& object, bool writable, const char* what) {
    if (PyObject_GetBuffer(object.ptr(), &view_, PyBUF_STRIDES | (writable ? PyBUF_WRITABLE : 0)))
      throw py::error_already_set();
    if (!PyBuffer_IsContiguous(&view_, 'C')) {
      std::string shape, strides;
      for (int i = 0; i < view_.ndim; ++i) {
        shape += (i ? ", " : "") + std::to_string(view_.shape[i]);
        strides += (i ? ", " : "") + std::to_string(view_.strides[i]);
      }
      PyBuffer_Release(&view_);
      throw py::value_error(std::string(what) + " must be a C-contiguous buffer, got shape (" +
                            shape + ") with strides (" + strides +
                            "); pass a contiguous copy (e.g. numpy.ascontiguousarray)");
    }
  }
  ~ContiguousBuffer() { PyBuffer_Release(&view_); }
  ContiguousBuffer(const ContiguousBuffer&) = delete;
  ContiguousBuffer& operator=(const ContiguousBuffer&) = delete;

  void* data() const noexcept { return view_.buf; }
  std::size_t size() const noexcept { return static_cast<std::size_t>(view_.len); }

 private:
  Py_buffer view_{};
};

void submit(PyEngine& engine, kvtier::JobId job_id, kvtier::Direction direction,
            const py::sequence& blocks) {
  auto ops = blocks_from_python(blocks);
  py::gil_scoped_release release;
  engine.submit(job_id, direction, std::move(ops));
}

// Blocks named by index into a BlockLayout: the segments are built here, in C++, so a job of
// many blocks over many layers costs Python one call.
void submit_blocks(PyEngine& engine, kvtier::JobId job_id, kvtier::Direction direction,
                   const std::vector<std::string>& paths, const std::vector<py::bytes>& keys,
                   const std::vector<long long>& block_ids, const kvtier::BlockLayout& layout,
                   std::uintptr_t cuda_stream) {
  if (paths.size() != block_ids.size() || keys.size() != block_ids.size())
    throw std::invalid_argument("paths, keys and block_ids must have the same length (" +
                                std::to_string(paths.size()) + ", " + std::to_string(keys.size()) +
                                ", " + std::to_string(block_ids.size()) + ")");
  std::vector<kvtier::BlockOp> ops(block_ids.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (block_ids[i] < 0)
      throw std::invalid_argument("block id " + std::to_string(block_ids[i]) + " is negative");
    ops[i].path = paths[i];
    ops[i].key = keys[i];
    ops[i].segments = layout.segments(static_cast<std::size_t>(block_ids[i]));
  }
  py::gil_scoped_release release;
  engine.submit(job_id, direction, std::move(ops), reinterpret_cast<void*>(cuda_stream));
}

py::dict stats_to_dict(const kvtier::EngineStats& s) {
  return py::dict("load_jobs"_a = s.load_jobs, "store_jobs"_a = s.store_jobs,
                  "failed_load_jobs"_a = s.failed_load_jobs,
                  "failed_store_jobs"_a = s.failed_store_jobs, "load_blocks"_a = s.load_blocks,
                  "store_blocks"_a = s.store_blocks, "failed_load_blocks"_a = s.failed_load_blocks,
                  "failed_store_blocks"_a = s.failed_store_blocks, "load_bytes"_a = s.load_bytes,
                  "store_bytes"_a = s.store_bytes, "dedup_skips"_a = s.dedup_skips,
                  "corrupt_files_removed"_a = s.corrupt_files_removed,
                  "o_direct_fallbacks"_a = s.o_direct_fallbacks, "queued_loads"_a = s.queued_loads,
                  "queued_stores"_a = s.queued_stores, "running_loads"_a = s.running_loads,
                  "running_stores"_a = s.running_stores, "jobs_in_flight"_a = s.jobs_in_flight);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "kvtier native core: block files, worker pool, completion queue";

  // errno failures become the matching OSError subclass (FileNotFoundError, ...) with
  // .errno, .strerror and .filename set, exactly as Python's own I/O raises them.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const kvtier::SystemError& e) {
      const int code = e.code().value();
      py::object error = py::reinterpret_steal<py::object>(
          PyObject_CallFunction(PyExc_OSError, "isO", code, e.what(), py::str(e.path()).ptr()));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
    }
  });

  py::enum_<kvtier::Direction>(m, "Direction")
      .value("LOAD", kvtier::Direction::kLoad)
      .value("STORE", kvtier::Direction::kStore);

  py::class_<kvtier::Completion>(m, "Completion", "A finished job, reported exactly once.")
      .def_readonly("job_id", &kvtier::Completion::job_id)
      .def_readonly("direction", &kvtier::Completion::direction)
      .def_readonly("success", &kvtier::Completion::success)
      .def_readonly("block_errnos", &kvtier::Completion::block_errnos,
                    "Per block, in submission order: 0 on success, else an errno value.")
      .def_property_readonly("errno",
                             [](const kvtier::Completion& c) { return c.error.errno_value; })
      .def_property_readonly("operation",
                             [](const kvtier::Completion& c) { return c.error.operation; })
      .def_property_readonly("path", [](const kvtier::Completion& c) { return c.error.path; })
      .def_property_readonly("message", [](const kvtier::Completion& c) { return c.error.message; })
      .def_property_readonly(
          "error",
          [](const kvtier::Completion& c) -> py::object {
            if (c.success) return py::none();
            std::string text = c.error.operation + " " + c.error.path + ": " +
                               std::strerror(c.error.errno_value) + " (errno " +
                               std::to_string(c.error.errno_value) + ")";
            if (!c.error.message.empty()) text += ": " + c.error.message;
            return py::str(text);
          },
          "The first error as one line of text, or None.")
      .def_readonly("bytes", &kvtier::Completion::bytes)
      .def_readonly("seconds", &kvtier::Completion::seconds)
      .def("__repr__", [](const kvtier::Completion& c) {
        return "Completion(job_id=" + std::to_string(c.job_id) +
               ", success=" + (c.success ? "True" : "False") +
               ", bytes=" + std::to_string(c.bytes) + ")";
      });

  py::class_<kvtier::BlockLayout>(m, "BlockLayout",
                                  "Where each block's bytes live across memory regions.")
      .def(py::init([](const py::sequence& regions) {
             // regions: (base_address, block_stride, num_blocks, [(offset, length), ...],
             // is_device)
             std::vector<kvtier::Region> out;
             for (const py::handle item : regions) {
               auto t = py::reinterpret_borrow<py::sequence>(item);
               if (t.size() != 5)
                 throw std::invalid_argument(
                     "each region must be (base, block_stride, num_blocks, runs, is_device)");
               kvtier::Region r;
               r.base = reinterpret_cast<void*>(t[0].cast<std::uintptr_t>());
               r.block_stride = t[1].cast<std::size_t>();
               r.num_blocks = t[2].cast<std::size_t>();
               for (const auto& [offset, length] :
                    t[3].cast<std::vector<std::pair<std::size_t, std::size_t>>>())
                 r.runs.push_back({offset, length});
               r.kind = t[4].cast<bool>() ? kvtier::MemoryKind::kDevice : kvtier::MemoryKind::kHost;
               out.push_back(std::move(r));
             }
             return kvtier::BlockLayout(std::move(out));
           }),
           "regions"_a)
      .def_property_readonly("payload_length", &kvtier::BlockLayout::payload_length)
      .def_property_readonly("num_blocks", &kvtier::BlockLayout::num_blocks)
      .def_property_readonly("has_device_memory", &kvtier::BlockLayout::has_device_memory)
      .def(
          "segments",
          [](const kvtier::BlockLayout& layout, std::size_t block) {
            std::vector<std::tuple<std::uintptr_t, std::size_t, bool>> out;
            for (const kvtier::Segment& seg : layout.segments(block))
              out.emplace_back(reinterpret_cast<std::uintptr_t>(seg.address), seg.length,
                               seg.kind == kvtier::MemoryKind::kDevice);
            return out;
          },
          "block"_a, "(address, length, is_device) of each segment of a block.");

  py::class_<PyEngine>(m, "Engine", "Worker pool that stores and loads block files.")
      .def(py::init([](const std::string& root_dir, std::optional<unsigned> n_read_threads,
                       std::optional<unsigned> n_write_threads, const py::object& o_direct,
                       const std::string& checksum, const std::string& durability,
                       unsigned file_mode, const py::bytes& fingerprint,
                       unsigned max_stores_in_flight_while_loading, std::size_t staging_bytes_total,
                       std::size_t staging_buffer_bytes, bool use_cuda, int cuda_device,
                       bool numa_bind, int worker_nice, bool completion_eventfd,
                       const std::string& io_engine, int load_nice, unsigned store_cap_linger_ms) {
             kvtier::EngineConfig c;
             c.root_dir = root_dir;
             // None: sized by the machine (kvtier::machine_thread_counts of root_dir).
             c.n_read_threads = n_read_threads.value_or(kvtier::kMachineThreads);
             c.n_write_threads = n_write_threads.value_or(kvtier::kMachineThreads);
             c.o_direct = o_direct_from_python(o_direct);
             c.checksum = kvtier::parse_checksum(checksum);
             c.durability = kvtier::parse_durability(durability);
             c.file_mode = static_cast<mode_t>(file_mode);
             c.fingerprint = fingerprint;
             c.max_stores_in_flight_while_loading = max_stores_in_flight_while_loading;
             c.staging_bytes_total = staging_bytes_total;
             c.staging_buffer_bytes = staging_buffer_bytes;
             c.use_cuda = use_cuda;
             c.cuda_device = cuda_device;
             c.numa_bind = numa_bind;
             c.worker_nice = worker_nice;
             c.completion_eventfd = completion_eventfd;
             c.io_engine = kvtier::parse_io_engine(io_engine);
             c.load_nice = load_nice;
             c.store_cap_linger_ms = store_cap_linger_ms;
             py::gil_scoped_release release;  // the O_DIRECT probe does I/O
             return std::make_unique<PyEngine>(std::move(c));
           }),
           "root_dir"_a = "", py::kw_only(), "n_read_threads"_a = py::none(),
           "n_write_threads"_a = py::none(),
           "o_direct"_a = "auto", "checksum"_a = "crc32c", "durability"_a = "none",
           "file_mode"_a = 0600, "fingerprint"_a = py::bytes(),
           "max_stores_in_flight_while_loading"_a = 2,
           "staging_bytes_total"_a = std::size_t{64} << 20,
           "staging_buffer_bytes"_a = std::size_t{2} << 20, "use_cuda"_a = false,
           "cuda_device"_a = -1, "numa_bind"_a = false, "worker_nice"_a = 19,
           "completion_eventfd"_a = false, "io_engine"_a = "auto", "load_nice"_a = 0,
           "store_cap_linger_ms"_a = 100)
      .def("keep_alive", &PyEngine::keep_alive, "buffers"_a,
           "Holds `buffers` (objects owning memory that block addresses point into) until the "
           "workers have stopped, whenever and however the engine goes; call it before "
           "submitting jobs over that memory.")
      .def(
          "submit_store",
          [](PyEngine& e, kvtier::JobId id, const py::sequence& blocks) {
            submit(e, id, kvtier::Direction::kStore, blocks);
          },
          "job_id"_a, "blocks"_a,
          "Queue a store of (path, key, address, length) blocks; returns at once.")
      .def(
          "submit_load",
          [](PyEngine& e, kvtier::JobId id, const py::sequence& blocks) {
            submit(e, id, kvtier::Direction::kLoad, blocks);
          },
          "job_id"_a, "blocks"_a,
          "Queue a load of (path, key, address, length) blocks; returns at once.")
      .def("submit_blocks", &submit_blocks, "job_id"_a, "direction"_a, "paths"_a, "keys"_a,
           "block_ids"_a, "layout"_a, "cuda_stream"_a = 0,
           "Queue a job over blocks of a BlockLayout; cuda_stream orders the device copies of "
           "stores and loads after the work already queued on it.")
      .def("pop_completions", &kvtier::Engine::pop_completions, "max"_a = 0,
           py::call_guard<py::gil_scoped_release>(), "Finished jobs; never blocks.")
      .def("drain", &kvtier::Engine::drain, py::call_guard<py::gil_scoped_release>())
      .def("shutdown", &kvtier::Engine::shutdown, py::call_guard<py::gil_scoped_release>())
      .def("stats", [](const PyEngine& e) { return stats_to_dict(e.stats()); })
      .def_property_readonly("is_shut_down", &kvtier::Engine::is_shut_down)
      .def_property_readonly("direct_io", &kvtier::Engine::direct_io)
      .def_property_readonly("o_direct_fallback_reason", &kvtier::Engine::o_direct_fallback_reason)
      .def_property_readonly(
          "io_engine", [](const PyEngine& e) { return kvtier::to_string(e.io_engine()); },
          "'io_uring' or 'psync': the engine moving the bytes (what 'auto' chose).")
      .def_property_readonly("io_engine_fallback_reason",
                             &kvtier::Engine::io_engine_fallback_reason,
                             "Why io_engine='auto' chose psync; empty when it did not.")
      .def_property_readonly("eventfd", &kvtier::Engine::completion_eventfd)
      .def_property_readonly("cuda_enabled", &kvtier::Engine::cuda_enabled)
      .def_property_readonly("numa_node", &kvtier::Engine::numa_node)
      .def_property_readonly(
          "n_read_threads", [](const PyEngine& e) { return e.config().n_read_threads; },
          "Load workers running (the machine-sized default resolved).")
      .def_property_readonly(
          "n_write_threads", [](const PyEngine& e) { return e.config().n_write_threads; },
          "Store-first workers running (the machine-sized default resolved).");

  m.def("cuda_available", &kvtier::cuda_available,
        "Whether a CUDA runtime and a device are present (the runtime is loaded on first call).");
  m.def("cuda_unavailable_reason", &kvtier::cuda_unavailable_reason);

  m.def(
      "crc32c",
      [](const py::buffer& data, std::uint32_t crc) {
        ContiguousBuffer bytes(data, false, "crc32c: data");
        py::gil_scoped_release release;
        return kvtier::crc32c(bytes.data(), bytes.size(), crc);
      },
      "data"_a, "crc"_a = 0, "CRC32C of a contiguous buffer (continuing from crc).");
  m.def("crc32c_is_hardware", &kvtier::crc32c_is_hardware);
  kvtier::bindings::register_crc32c(m);
  m.def("probe_o_direct", &kvtier::probe_o_direct, "dir"_a,
        py::call_guard<py::gil_scoped_release>(),
        "Empty string when O_DIRECT works in dir, else the reason it does not.");
  m.def(
      "paths_exist",
      [](const std::vector<std::string>& paths, const std::string& root_dir) {
        py::gil_scoped_release release;  // a few system calls per path: slow on a shared FS
        return kvtier::regular_files_exist(root_dir, paths);
      },
      "paths"_a, "root_dir"_a = "",
      "Whether each path is a regular file reached from root_dir without following links "
      "below it (only the last component is checked without root_dir); GIL released.");
  m.def(
      "buffer_address",
      [](const py::buffer& buffer, bool writable) {
        ContiguousBuffer bytes(buffer, writable, "buffer_address: buffer");
        return reinterpret_cast<std::uintptr_t>(bytes.data());
      },
      "buffer"_a, "writable"_a = false,
      "Address of a contiguous buffer's first byte (the buffer must outlive its use).");

  main_thread_ident = py::module_::import("threading")
                          .attr("main_thread")()
                          .attr("ident")
                          .cast<unsigned long>();
  py::module_::import("atexit").attr("register")(py::cpp_function(&shutdown_all_engines));

  m.attr("HEADER_SIZE") = kvtier::kHeaderSize;
  m.attr("ALIGNMENT") = kvtier::kAlignment;
  m.attr("FORMAT_VERSION") = kvtier::kFormatVersion;
  m.attr("FINGERPRINT_SIZE") = kvtier::kFingerprintSize;
  m.attr("MAX_KEY_SIZE") = kvtier::kMaxKeySize;

  // ---- file naming and modes shared with the Python side (kvtier/files.hpp) ---------------
  m.def(
      "directory_mode", [](unsigned file_mode) { return kvtier::directory_mode(file_mode); },
      "file_mode"_a, "Mode of the directories the tier creates for files of file_mode.");
  m.attr("TMP_FILE_PATTERN") = std::string(kvtier::kTmpFilePattern);
  m.def("host_label", &kvtier::host_label, "The host part of tmp file names.");
  m.def(
      "machine_thread_counts",
      [](const std::string& root_dir) {
        const kvtier::ThreadCounts t = kvtier::machine_thread_counts(root_dir);
        return std::make_tuple(t.n_read_threads, t.n_write_threads);
      },
      "root_dir"_a,
      "(n_read_threads, n_write_threads) an Engine on root_dir gets by default: sized by the "
      "CPUs this process may use and the request queue of root_dir's block device.");
  m.def("tmp_file_name", &kvtier::tmp_file_name, "final_name"_a,
        "A fresh tmp file name for final_name (same directory), unique on this host.");
  m.def(
      "lock_tmp_file",
      [](int fd) {
        const int e = kvtier::lock_tmp_file(fd);
        if (e == EAGAIN) throw kvtier::SystemError(e, "tmp file is locked by another process", "");
        return e == 0;
      },
      "fd"_a,
      "Mark a fresh tmp file as written by a live process (OFD lock held while fd is open). "
      "False when the file system has no such locks.");
  m.def(
      "tmp_file_writer",
      [](const std::string& path) {
        switch (kvtier::tmp_file_writer(path)) {
          case kvtier::TmpWriter::kAlive: return "alive";
          case kvtier::TmpWriter::kGone: return "gone";
          case kvtier::TmpWriter::kMissing: return "missing";
          default: return "unknown";
        }
      },
      "path"_a, py::call_guard<py::gil_scoped_release>(),
      "'alive', 'gone', 'missing' or 'unknown': whether a tmp file's writer holds its lock.");
}
