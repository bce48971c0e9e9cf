#include <kvtier/root_survey.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <kvtier/error.hpp>

#include "fs/beneath.hpp"
#include "io/posix_io.hpp"

namespace kvtier {
inline namespace KVTIER_ABI_NAMESPACE {

const char kBlockSuffix[] = ".kvb";
const char kStateDirName[] = ".kvtier";

namespace {

bool ends_with(std::string_view name, std::string_view suffix) {
  return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
}

bool is_block_name(std::string_view name) {
  return ends_with(name, kBlockSuffix);
}

bool is_block_tmp_name(std::string_view name) {
  static const std::string mark = std::string(kBlockSuffix) + ".";
  return ends_with(name, ".tmp") && name.find(mark) != std::string_view::npos;
}

// A directory still to read: its path relative to the root ("" for the root) and the
// namespace its files belong to.
struct Pending {
  std::string relative;
  std::string name_space;
};

// Oldest blocks kept in a max-heap on (mtime, then the smallest path): its top is the newest
// of them, the first to go when the rest still cover what is wanted.
bool earlier(const timespec& a, const timespec& b) {
  return a.tv_sec < b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec < b.tv_nsec);
}

bool same_time(const timespec& a, const timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

bool newer_first(const SurveyCandidate& a, const SurveyCandidate& b) {
  return earlier(a.mtime, b.mtime) || (same_time(a.mtime, b.mtime) && a.path > b.path);
}

}  // namespace

struct KVTIER_HIDDEN RootSurvey::Impl {
  std::int64_t want_bytes;
  std::size_t max_candidates;
  std::string base;  // the root as given, ending in '/'
  detail::RootDir root;
  std::vector<Pending> pending;
  // The directory being read, and the part of its last getdents64 batch not visited yet:
  // one buffer for the whole walk (opendir would allocate one, and fstat, per directory).
  detail::FileDescriptor dir;
  std::vector<char> batch = std::vector<char>(32 << 10);
  std::size_t batch_used = 0, batch_at = 0;
  Pending current;
  bool ended = false;
  std::size_t files = 0;
  int error = 0;
  std::string operation, error_path;
  std::vector<NamespaceUsage> namespaces;
  std::unordered_map<std::string, std::uint32_t> namespace_index;
  std::vector<SurveyCandidate> heap;
  std::int64_t held = 0;

  void close_dir() noexcept {
    dir.reset();
    batch_used = batch_at = 0;
  }

  void fail(int e, const char* op, std::string path) {
    error = e;
    operation = op;
    error_path = std::move(path);
    close_dir();
    ended = true;
  }

  std::string path_of(const std::string& relative, std::string_view name = {}) const {
    std::string path = base + relative;
    if (!name.empty()) {
      if (!relative.empty()) path += '/';
      path += name;
    }
    return path;
  }

  // Opens the next pending directory; false when it is to be skipped (gone, not a directory,
  // a link, not readable) or the walk failed.
  bool open_next() {
    current = std::move(pending.back());
    pending.pop_back();
    detail::FileDescriptor fd;
    if (current.relative.empty()) {
      fd = detail::FileDescriptor(::fcntl(root.fd(), F_DUPFD_CLOEXEC, 0));
      if (!fd) {
        fail(errno, "dup", path_of(""));
        return false;
      }
    } else if (const detail::PathError e = root.open_directory(current.relative, false, 0, fd)) {
      if (e.error == ENOENT || e.error == ENOTDIR || e.error == ELOOP || e.error == EACCES ||
          e.error == EPERM)
        return false;
      fail(e.error, e.operation, e.path);
      return false;
    }
    dir = std::move(fd);
    return true;
  }

  // The next entry of the open directory: nullptr at its end (the directory is closed then)
  // or when the walk failed.
  const struct dirent64* next_entry() {
    if (batch_at >= batch_used) {
      ssize_t got;
      do {
        got = ::getdents64(dir.get(), batch.data(), batch.size());
      } while (got < 0 && errno == EINTR);
      if (got < 0 && errno != ENOENT) {
        fail(errno, "readdir", path_of(current.relative));
        return nullptr;
      }
      if (got <= 0) {  // its end, or it was removed while open (ENOENT): nothing more in it
        close_dir();
        return nullptr;
      }
      batch_used = static_cast<std::size_t>(got);
      batch_at = 0;
    }
    const auto* entry = reinterpret_cast<const struct dirent64*>(batch.data() + batch_at);
    batch_at += entry->d_reclen;
    return entry;
  }

  // The namespace's index in `namespaces`, which gets it when its first file is counted.
  std::uint32_t index_of(const std::string& name_space) {
    auto [it, added] =
        namespace_index.try_emplace(name_space, static_cast<std::uint32_t>(namespaces.size()));
    if (added) namespaces.push_back(NamespaceUsage{name_space});
    return it->second;
  }

  void count(std::string_view name, bool block, const struct stat& st) {
    ++files;
    const std::uint32_t index = index_of(current.name_space);
    NamespaceUsage& usage = namespaces[index];
    const std::int64_t size = st.st_size;
    if (!block) {
      usage.tmp_files += 1;
      usage.tmp_bytes += size;
      return;
    }
    const timespec t = st.st_mtim;
    if (usage.blocks == 0 || earlier(t, usage.oldest)) usage.oldest = t;
    if (usage.blocks == 0 || earlier(usage.newest, t)) usage.newest = t;
    usage.blocks += 1;
    usage.block_bytes += size;
    if (want_bytes <= 0) return;
    if (held < want_bytes || (!heap.empty() && earlier(t, heap.front().mtime))) {
      heap.push_back(SurveyCandidate{index, path_of(current.relative, name), size, t});
      std::push_heap(heap.begin(), heap.end(), newer_first);
      held += size;
      while (!heap.empty() &&
             (held - heap.front().size >= want_bytes || heap.size() > max_candidates)) {
        held -= heap.front().size;
        std::pop_heap(heap.begin(), heap.end(), newer_first);
        heap.pop_back();
      }
    }
  }

  // One directory entry; false when the walk failed.
  bool visit(const struct dirent64& entry) {
    const std::string_view name(entry.d_name);
    if (name == "." || name == "..") return true;
    const bool top = current.relative.empty();
    if (top && name == kStateDirName) return true;
    const int at = dir.get();
    const bool block = is_block_name(name);
    if (block || is_block_tmp_name(name)) {
      struct stat st;
      if (::fstatat(at, entry.d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) return true;  // evicted, renamed or swept meanwhile
        fail(errno, "stat", path_of(current.relative, name));
        return false;
      }
      if (S_ISREG(st.st_mode)) count(name, block, st);
      return true;  // never descended into, whatever it is
    }
    bool is_dir = entry.d_type == DT_DIR;
    if (entry.d_type == DT_UNKNOWN) {
      struct stat st;
      is_dir = ::fstatat(at, entry.d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    }
    if (is_dir) {
      std::string relative = top ? std::string(name) : current.relative + "/" + std::string(name);
      pending.push_back(Pending{std::move(relative), top ? std::string(name) : current.name_space});
    }
    return true;
  }
};

RootSurvey::RootSurvey(const std::string& root_dir, std::int64_t want_bytes,
                       std::size_t max_candidates)
    : impl_(std::make_unique<Impl>()) {
  impl_->want_bytes = want_bytes;
  impl_->max_candidates = max_candidates;
  impl_->base = root_dir.empty() || root_dir.back() == '/' ? root_dir : root_dir + "/";
  try {
    impl_->root = detail::RootDir(root_dir, /*create=*/false, 0);
  } catch (const SystemError& e) {
    impl_->ended = true;
    if (e.code().value() != ENOENT) {  // a missing root is an empty one
      impl_->error = e.code().value();
      impl_->operation = "open";
      impl_->error_path = root_dir;
    }
    return;
  }
  impl_->pending.push_back(Pending{});
}

RootSurvey::~RootSurvey() = default;
RootSurvey::RootSurvey(RootSurvey&&) noexcept = default;
RootSurvey& RootSurvey::operator=(RootSurvey&&) noexcept = default;

bool RootSurvey::advance(std::size_t max_files) {
  Impl& s = *impl_;
  const std::size_t until =
      max_files > SIZE_MAX - s.files ? SIZE_MAX : s.files + max_files;  // saturated
  while (!s.ended && s.files < until) {
    if (!s.dir) {
      if (s.pending.empty()) {
        s.ended = true;
        break;
      }
      if (!s.open_next()) continue;
    }
    const struct dirent64* entry = s.next_entry();
    if (entry == nullptr) continue;  // the directory's end, or a failure (ended)
    if (!s.visit(*entry)) break;
  }
  return s.ended;
}

std::size_t RootSurvey::files() const noexcept {
  return impl_->files;
}
int RootSurvey::error() const noexcept {
  return impl_->error;
}
const std::string& RootSurvey::error_operation() const noexcept {
  return impl_->operation;
}
const std::string& RootSurvey::error_path() const noexcept {
  return impl_->error_path;
}
const std::vector<NamespaceUsage>& RootSurvey::namespaces() const noexcept {
  return impl_->namespaces;
}

std::vector<SurveyCandidate> RootSurvey::take_candidates() {
  std::vector<SurveyCandidate> out = std::move(impl_->heap);
  impl_->heap.clear();
  impl_->held = 0;
  std::sort(out.begin(), out.end(), [](const SurveyCandidate& a, const SurveyCandidate& b) {
    return earlier(a.mtime, b.mtime) || (same_time(a.mtime, b.mtime) && a.path < b.path);
  });
  return out;
}

}  // namespace KVTIER_ABI_NAMESPACE
}  // namespace kvtier
