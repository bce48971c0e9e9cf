// kvtier._core, the Python module over the kvtier C++ core: PYBIND11_MODULE registers each
// part (bindings.hpp lists them); this file holds the small parts, jobs, block layouts and
// the core's free functions and constants. The binding is the only code that knows Python.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.hpp"

namespace kvtier::python {
namespace {

using namespace pybind11::literals;

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

// A path as the file system takes it: bytes as they are, str (or os.PathLike) as os.fsencode
// encodes it (surrogate escapes back to the bytes they stand for). Refused with ValueError,
// as os functions refuse it, when it holds a NUL byte: the system call would see only the
// part before it, another file.
std::string fs_path(const py::handle& path) {
  auto fspath = py::reinterpret_steal<py::object>(PyOS_FSPath(path.ptr()));
  if (!fspath) throw py::error_already_set();
  if (PyUnicode_Check(fspath.ptr())) {
    fspath = py::reinterpret_steal<py::object>(PyUnicode_EncodeFSDefault(fspath.ptr()));
    if (!fspath) throw py::error_already_set();
  }
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(fspath.ptr(), &data, &size) < 0) throw py::error_already_set();
  std::string bytes(data, static_cast<std::size_t>(size));
  if (bytes.find('\0') != std::string::npos) throw py::value_error("embedded null byte");
  return bytes;
}

// A file time as st_mtime_ns gives it: an int of any size (a tmpfs keeps mtimes whose
// nanoseconds overflow 64 bits, years before 1678 or after 2262).
py::object nanoseconds(const timespec& t) {
  constexpr std::int64_t kSafe = INT64_MAX / 1000000000 - 1;
  if (t.tv_sec > -kSafe && t.tv_sec < kSafe)
    return py::int_(static_cast<std::int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec);
  return py::int_(static_cast<std::int64_t>(t.tv_sec)) * py::int_(1000000000) +
         py::int_(static_cast<std::int64_t>(t.tv_nsec));
}

// A name or path as os functions return it: os.fsdecode of its bytes.
py::object fs_name(const std::string& bytes) {
  auto name = py::reinterpret_steal<py::object>(
      PyUnicode_DecodeFSDefaultAndSize(bytes.data(), static_cast<Py_ssize_t>(bytes.size())));
  if (!name) throw py::error_already_set();
  return name;
}

// OSError(errno, "<strerror> (<operation>)", path) for a failed system call the core reports
// without throwing: Python picks the errno's subclass (FileNotFoundError, ...).
py::object os_error(int error, const std::string& operation, const py::object& path) {
  const std::string text = std::string(std::strerror(error)) + " (" + operation + ")";
  return py::reinterpret_borrow<py::object>(PyExc_OSError)(error, text, path);
}

// A RootSurvey for Python: its calls release the GIL, so threads sharing one take turns.
struct SharedSurvey {
  SharedSurvey(const std::string& root, std::int64_t want_bytes, std::size_t max_candidates)
      : walk(root, want_bytes, max_candidates) {}
  std::mutex mutex;
  kvtier::RootSurvey walk;
};

void register_jobs(py::module_& m) {
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
}

void register_block_layout(py::module_& m) {
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
}

void register_functions(py::module_& m) {
  m.def("cuda_available", &kvtier::cuda_available,
        "Whether a CUDA runtime and a device are present (the runtime is loaded on first call).");
  m.def("cuda_unavailable_reason", &kvtier::cuda_unavailable_reason);

  m.def(
      "crc32c",
      [](const py::buffer& data, std::uint32_t crc) {
        ContiguousBuffer bytes(data, false, "crc32c: data");
        GilReleased release;
        return kvtier::crc32c(bytes.data(), bytes.size(), crc);
      },
      "data"_a, "crc"_a = 0, "CRC32C of a contiguous buffer (continuing from crc).");
  m.def("crc32c_is_hardware", &kvtier::crc32c_is_hardware);
  m.def("probe_o_direct", &kvtier::probe_o_direct, "dir"_a, py::call_guard<GilReleased>(),
        "Empty string when O_DIRECT works in dir, else the reason it does not.");
  m.def(
      "paths_exist",
      [](const std::vector<std::string>& paths, const std::string& root_dir) {
        GilReleased released;  // a few system calls per path: slow on a shared FS
        return kvtier::regular_files_exist(root_dir, paths);
      },
      "paths"_a, "root_dir"_a = "",
      "Whether each path is a regular file reached from root_dir without following links "
      "below it (only the last component is checked without root_dir); GIL released.");
  m.def(
      "unlink_unchanged_files",
      [](const py::sequence& path_objects, const std::vector<std::pair<std::int64_t, long>>& mtimes,
         const py::object& root_object, bool dry_run, std::uint64_t recycle_size,
         std::size_t recycle_files, const py::object& recycle_below) -> py::tuple {
        // Paths as os.fsencode spells them: a scanned directory whose name is not UTF-8 (str
        // with surrogate escapes) is still a path the evictor must reach. One tuple, held
        // throughout: a sequence may make its items on demand.
        if (py::isinstance<py::str>(path_objects) || py::isinstance<py::bytes>(path_objects))
          throw py::type_error("unlink_unchanged_files: paths must be a sequence of paths");
        const auto items = py::reinterpret_steal<py::tuple>(PySequence_Tuple(path_objects.ptr()));
        if (!items) throw py::error_already_set();
        std::vector<std::string> paths;
        paths.reserve(items.size());
        for (const py::handle path : items) paths.push_back(fs_path(path));
        const std::string root_dir = fs_path(root_object);
        const std::string below = recycle_below.is_none() ? "" : fs_path(recycle_below);
        if (recycle_files > 0 && root_dir.empty())
          throw std::invalid_argument("unlink_unchanged_files: recycling needs root_dir");
        if (paths.empty() && mtimes.empty())
          return py::make_tuple(py::list(), py::none(), py::list());  // nothing to open
        std::vector<timespec> when(mtimes.size());
        for (std::size_t i = 0; i < mtimes.size(); ++i)
          when[i] = {static_cast<time_t>(mtimes[i].first), mtimes[i].second};
        // Before anything is removed, as os.remove raises "os.remove": audit hooks see (and
        // may veto) the evictor's removals though no os.remove runs.
        if (!dry_run && PySys_Audit("kvtier.unlink_unchanged_files", "(OO)", items.ptr(),
                                    root_object.ptr()) < 0)
          throw py::error_already_set();
        kvtier::UnlinkedFiles done;
        {
          GilReleased released;  // the unlink threads hand the GIL over once a batch
          done = kvtier::unlink_unchanged_files(root_dir, paths, when, dry_run,
                                                {recycle_size, recycle_files, below});
        }
        py::object error = py::none();
        if (done.error != 0)  // e.g. "[Errno 13] Permission denied (unlink): '<path>'"
          error =
              os_error(done.error, done.operation,
                       done.root_failed ? root_object : py::object(items[done.outcomes.size()]));
        return py::make_tuple(done.outcomes, error, done.recycled);
      },
      "paths"_a, "mtimes"_a, "root_dir"_a = "", "dry_run"_a = false, "recycle_size"_a = 0,
      "recycle_files"_a = 0, "recycle_below"_a = py::none(),
      "Unlink each path (str, bytes or os.PathLike, as os functions take them) that lstat "
      "shows a regular file of mtime mtimes[i], a (seconds, nanoseconds) pair "
      "(divmod(st_mtime_ns, 10**9)); "
      "GIL released. Returns (outcomes, error, recycled): per path handled, the bytes freed, "
      "UNLINK_KEPT (left: not a regular file, a link, or used since), UNLINK_GONE (nothing "
      "there), UNLINK_DENIED (the unlink failed with EACCES or EPERM; the walk goes on) or "
      "UNLINK_RECYCLED (kept for reuse, below); error "
      "is None or the OSError (with the path and the failed call) that stopped "
      "the walk at paths[len(outcomes)]. With root_dir, paths are reached from it without "
      "following links below it, and up to recycle_files files of exactly recycle_size bytes "
      "with one link, owned by this user (and below the directory recycle_below, if given), "
      "are renamed to tmp file names instead of unlinked: "
      "recycled lists those names, for stores to overwrite (the 5th item of a store's block). "
      "Unless dry_run, raises the audit event "
      "kvtier.unlink_unchanged_files with (paths, root_dir) first.");
  m.attr("UNLINK_KEPT") = kvtier::kKeptFile;
  m.attr("UNLINK_GONE") = kvtier::kGoneFile;
  m.attr("UNLINK_DENIED") = kvtier::kDeniedFile;
  m.attr("UNLINK_RECYCLED") = kvtier::kRecycledFile;
  m.def("local_file_system", &kvtier::local_file_system, "path"_a, py::call_guard<GilReleased>(),
        "Whether path lies on a file system of this host's kernel alone (ext2/3/4, XFS, "
        "btrfs, F2FS, tmpfs, ramfs), where every later lookup sees a rename at once; False for "
        "network and FUSE file systems and when statfs fails. GIL released.");
  m.def(
      "buffer_address",
      [](const py::buffer& buffer, bool writable) {
        ContiguousBuffer bytes(buffer, writable, "buffer_address: buffer");
        return reinterpret_cast<std::uintptr_t>(bytes.data());
      },
      "buffer"_a, "writable"_a = false,
      "Address of a contiguous buffer's first byte (the buffer must outlive its use).");
}

void register_files(py::module_& m) {
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
        if (e == EAGAIN) throw KVTIER_SYSTEM_ERROR(e, "tmp file is locked by another process", "");
        return e == 0;
      },
      "fd"_a,
      "Mark a fresh tmp file as written by a live process (OFD lock held while fd is open). "
      "False when the file system has no such locks.");
  m.def(
      "tmp_file_writer",
      [](const std::string& path) {
        switch (kvtier::tmp_file_writer(path)) {
          case kvtier::TmpWriter::kAlive:
            return "alive";
          case kvtier::TmpWriter::kGone:
            return "gone";
          case kvtier::TmpWriter::kMissing:
            return "missing";
          default:
            return "unknown";
        }
      },
      "path"_a, py::call_guard<GilReleased>(),
      "'alive', 'gone', 'missing' or 'unknown': whether a tmp file's writer holds its lock.");

  // ---- what lies below a root (kvtier/root_survey.hpp) -------------------------------------
  m.attr("BLOCK_SUFFIX") = std::string(kvtier::kBlockSuffix);
  m.attr("STATE_DIR_NAME") = std::string(kvtier::kStateDirName);
  py::class_<SharedSurvey>(m, "RootSurvey",
                           "One walk over a root (kvtier/root_survey.hpp): usage per namespace "
                           "and the least recently used blocks. Calls from several threads take "
                           "turns.")
      .def(
          py::init([](const py::object& root, std::int64_t want_bytes, std::size_t max_candidates) {
            const std::string path = fs_path(root);
            GilReleased released;  // opens the root: may wait on a stalled mount
            return std::make_unique<SharedSurvey>(path, want_bytes, max_candidates);
          }),
          "root"_a, "want_bytes"_a, "max_candidates"_a)
      .def(
          "advance",
          [](SharedSurvey& shared, std::size_t max_files) {
            bool ended = false;
            int error = 0;
            std::string operation, path;
            {
              GilReleased released;  // directory reads and an lstat per file
              const std::lock_guard<std::mutex> turn(shared.mutex);
              ended = shared.walk.advance(max_files);
              error = shared.walk.error();
              if (error != 0) {
                operation = shared.walk.error_operation();
                path = shared.walk.error_path();
              }
            }
            if (error != 0) {  // e.g. "[Errno 5] Input/output error (readdir): '<dir>'"
              const py::object raised = os_error(error, operation, fs_name(path));
              PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(raised.ptr())), raised.ptr());
              throw py::error_already_set();
            }
            return ended;
          },
          "max_files"_a,
          "Walk on until max_files more files were counted or the walk ended (True); GIL "
          "released. Raises OSError (with the path and the failed call) for a failure that "
          "is not a vanished or unreadable entry.")
      .def_property_readonly(
          "files",
          [](SharedSurvey& shared) {
            GilReleased released;  // never wait for the turn holding the GIL
            const std::lock_guard<std::mutex> turn(shared.mutex);
            return shared.walk.files();
          },
          "Block and block tmp files counted so far.")
      .def(
          "namespaces",
          [](SharedSurvey& shared) {
            std::vector<kvtier::NamespaceUsage> spaces;
            {
              GilReleased released;
              const std::lock_guard<std::mutex> turn(shared.mutex);
              spaces = shared.walk.namespaces();
            }
            py::list out;
            for (const kvtier::NamespaceUsage& u : spaces) {
              py::object oldest = u.blocks ? nanoseconds(u.oldest) : py::none();
              py::object newest = u.blocks ? nanoseconds(u.newest) : py::none();
              out.append(py::make_tuple(fs_name(u.name), u.blocks, u.block_bytes, u.tmp_files,
                                        u.tmp_bytes, oldest, newest));
            }
            return out;
          },
          "(name, blocks, block_bytes, tmp_files, tmp_bytes, oldest_ns, newest_ns) per "
          "namespace, in the order they were first met (oldest_ns and newest_ns None without "
          "blocks).")
      .def(
          "take_candidates",
          [](SharedSurvey& shared) {
            std::vector<kvtier::NamespaceUsage> spaces;
            std::vector<kvtier::SurveyCandidate> candidates;
            {
              GilReleased released;
              const std::lock_guard<std::mutex> turn(shared.mutex);
              spaces = shared.walk.namespaces();
              candidates = shared.walk.take_candidates();
            }
            std::vector<py::object> names;
            names.reserve(spaces.size());
            for (const kvtier::NamespaceUsage& u : spaces) names.push_back(fs_name(u.name));
            py::list out;
            for (const kvtier::SurveyCandidate& c : candidates)
              out.append(py::make_tuple(true, names[c.namespace_index], fs_name(c.path), c.size,
                                        nanoseconds(c.mtime)));
            return out;
          },
          "The candidates, oldest first, as (True, namespace, path, size, mtime_ns) tuples "
          "(FileEntry's fields); moves them out.");
}

}  // namespace
}  // namespace kvtier::python

PYBIND11_MODULE(_core, m) {
  using namespace kvtier::python;
  m.doc() = "kvtier native core: block files, worker pool, completion queue";
  register_errors(m);
  register_jobs(m);
  register_block_layout(m);
  register_engine(m);
  register_functions(m);
  register_crc32c(m);
  register_files(m);
  register_lifetime(m);
}
