// kvtier._core.Engine: the engine's configuration from keyword arguments (ENGINE_DEFAULTS,
// ENGINE_LIMITS), job submission with the GIL released, stats.
#include <pybind11/stl.h>

#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"

namespace kvtier::python {
namespace {

using namespace pybind11::literals;

kvtier::ODirectMode o_direct_from_python(const py::object& value) {
  if (py::isinstance<py::bool_>(value))
    return value.cast<bool>() ? kvtier::ODirectMode::kOn : kvtier::ODirectMode::kOff;
  if (py::isinstance<py::str>(value)) return kvtier::parse_o_direct(value.cast<std::string>());
  throw std::invalid_argument("o_direct must be 'auto', True or False, got " +
                              py::repr(value).cast<std::string>());
}

// Python's spelling of an ODirectMode, as o_direct_from_python() reads it back.
py::object o_direct_to_python(kvtier::ODirectMode mode) {
  if (mode == kvtier::ODirectMode::kAuto) return py::str("auto");
  return py::bool_(mode == kvtier::ODirectMode::kOn);
}

// A thread count in Python's spelling: None for "sized by the machine".
py::object threads_to_python(unsigned n) {
  if (n == kvtier::kMachineThreads) return py::none();
  return py::int_(n);
}

// ENGINE_DEFAULTS: every keyword argument of Engine with its default, read from a
// default-constructed EngineConfig (the one definition of the defaults). Engine's keyword
// defaults below are taken from this dict, so the two cannot differ.
py::dict engine_defaults() {
  const kvtier::EngineConfig d;
  py::dict out;
  out["n_read_threads"] = threads_to_python(d.n_read_threads());
  out["n_write_threads"] = threads_to_python(d.n_write_threads());
  out["o_direct"] = o_direct_to_python(d.o_direct());
  out["checksum"] = kvtier::to_string(d.checksum());
  out["durability"] = kvtier::to_string(d.durability());
  out["file_mode"] = static_cast<unsigned>(d.file_mode());
  out["fingerprint"] = py::bytes(d.fingerprint());
  out["max_stores_in_flight_while_loading"] = d.max_stores_in_flight_while_loading();
  out["staging_bytes_total"] = d.staging_bytes_total();
  out["staging_buffer_bytes"] = d.staging_buffer_bytes();
  out["use_cuda"] = d.use_cuda();
  out["cuda_device"] = d.cuda_device();
  out["numa_bind"] = d.numa_bind();
  out["worker_nice"] = d.worker_nice();
  out["completion_eventfd"] = d.completion_eventfd();
  out["io_engine"] = kvtier::to_string(d.io_engine());
  out["load_nice"] = d.load_nice();
  out["store_cap_linger_ms"] = d.store_cap_linger_ms();
  out["io_timeout_s"] = d.io_timeout_s();
  return out;
}

// ENGINE_LIMITS: name -> (lo, hi) (hi None: unbounded) for each range the Engine constructor
// checks, from the constants its checks use (kvtier::limits). Two rules are not ranges:
// staging_buffer_bytes is a multiple of "staging_buffer_bytes_multiple", and file_mode
// includes the bits "file_mode_required_bits". "n_threads_total" bounds n_read_threads +
// n_write_threads; staging_bytes_total must also be at least staging_buffer_bytes.
py::dict engine_limits() {
  namespace lim = kvtier::limits;
  const py::object unbounded = py::none();
  py::dict out;
  out["n_read_threads"] = py::make_tuple(0u, lim::kMaxThreads);
  out["n_write_threads"] = py::make_tuple(0u, lim::kMaxThreads);
  out["n_threads_total"] = py::make_tuple(lim::kMinThreadsTotal, 2 * lim::kMaxThreads);
  out["worker_nice"] = py::make_tuple(lim::kMinNice, lim::kMaxNice);
  out["load_nice"] = py::make_tuple(lim::kMinNice, lim::kMaxNice);
  // No bound of its own beyond its type's: a larger value is refused by the option parsers,
  // not turned into pybind11's TypeError here.
  out["max_stores_in_flight_while_loading"] =
      py::make_tuple(lim::kMinStoresInFlightWhileLoading, std::numeric_limits<unsigned>::max());
  out["staging_buffer_bytes"] = py::make_tuple(lim::kStagingBufferMultiple, unbounded);
  out["staging_buffer_bytes_multiple"] = lim::kStagingBufferMultiple;
  out["staging_bytes_total"] = py::make_tuple(lim::kStagingBufferMultiple, unbounded);
  out["file_mode"] = py::make_tuple(0u, static_cast<unsigned>(lim::kFileModeBits));
  out["file_mode_required_bits"] = static_cast<unsigned>(lim::kFileModeRequiredBits);
  out["fingerprint_length"] = py::make_tuple(std::size_t{0}, kvtier::kFingerprintSize);
  out["io_timeout_s"] = py::make_tuple(lim::kMinIoTimeoutSeconds, lim::kMaxIoTimeoutSeconds);
  return out;
}

// blocks: a sequence of (path, key, address, length) tuples, or of stores' (path, key,
// address, length, recycle) tuples (BlockOp::recycle: a file kept by eviction for reuse, or
// None); paths are str or os.PathLike.
std::vector<kvtier::BlockOp> blocks_from_python(const py::sequence& blocks) {
  std::vector<kvtier::BlockOp> ops;
  ops.reserve(blocks.size());
  py::object fspath = py::module_::import("os").attr("fspath");
  for (const py::handle item : blocks) {
    auto t = py::reinterpret_borrow<py::sequence>(item);
    if (t.size() != 4 && t.size() != 5)
      throw std::invalid_argument("each block must be (path, key, address, length[, recycle])");
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
    if (t.size() == 5 && !t[4].is_none()) op.recycle = fspath(t[4]).cast<std::string>();
    ops.push_back(std::move(op));
  }
  return ops;
}

// The GIL and the engine's short calls. Engine::submit of host memory and pop_completions
// never wait for I/O or a worker (a busy scheduler mutex sends a job to the intake's inbox;
// the ids' lock is held by submitters and poppers only for a set insert or erase), and the
// core never calls into Python, so they run with the GIL held. Releasing it for a call of
// microseconds cost more than the call: on return the caller must take the GIL back from
// whichever Python thread took it meanwhile (the capacity thread, unlink threads, the
// engine's own scheduler loop), which can hold it up to the interpreter's switch interval
// (5 ms). That made the slowest submit_store calls 0.3-3.8 ms with eviction running
// (docs/PERFORMANCE.md section 23). Calls that can block (drain, shutdown, a job with device
// memory, whose submit records a CUDA event) still release it.

void submit(PyEngine& engine, kvtier::JobId job_id, kvtier::Direction direction,
            const py::sequence& blocks) {
  auto ops = blocks_from_python(blocks);  // host memory only: (path, key, address, length)
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
  GilReleased release(layout.has_device_memory());  // see submit(): only around a CUDA call
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
                  "running_stores"_a = s.running_stores, "jobs_in_flight"_a = s.jobs_in_flight,
                  "io_uring_rings_retired"_a = s.io_uring_rings_retired,
                  "io_timeouts"_a = s.io_timeouts, "abandoned_ops"_a = s.abandoned_ops,
                  "workers_replaced"_a = s.workers_replaced, "workers_stuck"_a = s.workers_stuck,
                  "memory_fs_loads"_a = s.memory_fs_loads, "intake_submits"_a = s.intake_submits,
                  "watchdog_pauses"_a = s.watchdog_pauses,
                  "memory_fs_stores"_a = s.memory_fs_stores);
}

}  // namespace

void PyEngine::warn_if_ring_retired() {
  if (warned_ring_retired_) return;
  const kvtier::EngineStats s = stats();
  if (s.io_uring_rings_retired == 0) return;
  warned_ring_retired_ = true;
  py::module_::import("logging")
      .attr("getLogger")("kvtier.tiering.fs.engine")
      .attr("warning")(
          "io_uring_enter kept failing (%s); the worker that met it goes on with pread/pwrite "
          "(every job is still reported; stats()['io_uring_rings_retired'] counts such workers)",
          std::strerror(s.io_uring_retired_errno));
}

namespace {

// Engine(root_dir, *, ...): the keyword arguments are EngineConfig's settings in Python's
// spelling (ENGINE_DEFAULTS); the construction (which probes the root) runs without the GIL.
std::unique_ptr<PyEngine> make_engine(
    const std::string& root_dir, std::optional<unsigned> n_read_threads,
    std::optional<unsigned> n_write_threads, const py::object& o_direct,
    const std::string& checksum, const std::string& durability, unsigned file_mode,
    const py::bytes& fingerprint, unsigned max_stores_in_flight_while_loading,
    std::size_t staging_bytes_total, std::size_t staging_buffer_bytes, bool use_cuda,
    int cuda_device, bool numa_bind, int worker_nice, bool completion_eventfd,
    const std::string& io_engine, int load_nice, unsigned store_cap_linger_ms,
    double io_timeout_s) {
  kvtier::EngineConfig c;
  // None: sized by the machine (kvtier::machine_thread_counts of root_dir).
  c.set_root_dir(root_dir)
      .set_n_read_threads(n_read_threads.value_or(kvtier::kMachineThreads))
      .set_n_write_threads(n_write_threads.value_or(kvtier::kMachineThreads))
      .set_o_direct(o_direct_from_python(o_direct))
      .set_checksum(kvtier::parse_checksum(checksum))
      .set_durability(kvtier::parse_durability(durability))
      .set_file_mode(static_cast<mode_t>(file_mode))
      .set_fingerprint(fingerprint)
      .set_max_stores_in_flight_while_loading(max_stores_in_flight_while_loading)
      .set_staging_bytes_total(staging_bytes_total)
      .set_staging_buffer_bytes(staging_buffer_bytes)
      .set_use_cuda(use_cuda)
      .set_cuda_device(cuda_device)
      .set_numa_bind(numa_bind)
      .set_worker_nice(worker_nice)
      .set_completion_eventfd(completion_eventfd)
      .set_io_engine(kvtier::parse_io_engine(io_engine))
      .set_load_nice(load_nice)
      .set_store_cap_linger_ms(store_cap_linger_ms)
      .set_io_timeout_s(io_timeout_s);
  GilReleased release;  // the O_DIRECT probe does I/O
  return std::make_unique<PyEngine>(std::move(c));
}

}  // namespace

namespace {

// Engine's methods and properties (submission, completions, lifecycle, what it runs with).
void def_engine_methods(py::class_<PyEngine>& engine) {
  engine
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
          "Queue a store of (path, key, address, length[, recycle]) blocks; recycle names a file "
          "eviction kept for reuse (unlink_unchanged_files' recycled paths) or is None. "
          "Returns at once.")
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
      .def(
          "pop_completions",
          [](PyEngine& e, std::size_t max) {
            std::vector<kvtier::Completion> done = e.pop_completions(max);  // GIL: see submit()
            // A worker gives its ring up inside a batch, whose job is among some later pop's.
            if (!done.empty()) e.warn_if_ring_retired();
            return done;
          },
          "max"_a = 0, "Finished jobs; never blocks.")
      .def("drain", &kvtier::Engine::drain, py::call_guard<GilReleased>())
      .def("drain_for", &kvtier::Engine::drain_for, "timeout_s"_a, py::call_guard<GilReleased>(),
           "drain() for at most timeout_s seconds; False when the time ran out first.")
      .def("shutdown", &kvtier::Engine::shutdown, py::call_guard<GilReleased>())
      .def("fail_unstarted", &kvtier::Engine::fail_unstarted, "directory"_a,
           py::call_guard<GilReleased>(),
           "Fail every block not yet started beneath `directory` with ETIMEDOUT (its root is "
           "degraded), without stopping; returns how many.")
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
          "n_read_threads", [](const PyEngine& e) { return e.config().n_read_threads(); },
          "Load workers running (the machine-sized default resolved).")
      .def_property_readonly(
          "n_write_threads", [](const PyEngine& e) { return e.config().n_write_threads(); },
          "Store-first workers running (the machine-sized default resolved).");
}

}  // namespace

void register_engine(py::module_& m) {
  const py::dict defaults = engine_defaults();
  m.attr("ENGINE_DEFAULTS") = defaults;
  m.attr("ENGINE_LIMITS") = engine_limits();
  const auto default_of = [&defaults](const char* name) {
    return py::arg_v(name, py::object(defaults[name]));
  };

  py::class_<PyEngine> engine(m, "Engine", "Worker pool that stores and loads block files.");
  engine.def(py::init(&make_engine), "root_dir"_a = "", py::kw_only(), default_of("n_read_threads"),
             default_of("n_write_threads"), default_of("o_direct"), default_of("checksum"),
             default_of("durability"), default_of("file_mode"), default_of("fingerprint"),
             default_of("max_stores_in_flight_while_loading"), default_of("staging_bytes_total"),
             default_of("staging_buffer_bytes"), default_of("use_cuda"), default_of("cuda_device"),
             default_of("numa_bind"), default_of("worker_nice"), default_of("completion_eventfd"),
             default_of("io_engine"), default_of("load_nice"), default_of("store_cap_linger_ms"),
             default_of("io_timeout_s"));
  def_engine_methods(engine);
}

}  // namespace kvtier::python
