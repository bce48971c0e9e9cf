// A root others can write to: block paths resolve beneath root_dir without following links
// (with openat2 and with the per-component fallback), special files at block paths fail the
// block instead of hanging it, directories get exactly directory_mode(file_mode), and tmp
// files carry a lock that tells their writer is alive; the evictor's unlinks follow no link
// below the root either.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine_helpers.hpp"
#include "fs/beneath.hpp"

namespace {

using kvtest::describe;
using kvtest::TempDir;
using kvtier::Completion;
using kvtier::Engine;
using kvtier::ODirectMode;

// Runs `body` once with openat2 and once with the per-component fallback.
template <typename Fn>
void both_resolutions(Fn&& body) {
  for (bool openat2 : {true, false}) {
    kvtier::detail::set_openat2_enabled(openat2);
    try {
      body(openat2);
    } catch (...) {
      kvtier::detail::set_openat2_enabled(true);
      throw;
    }
  }
  kvtier::detail::set_openat2_enabled(true);
}

mode_t mode_of(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) FAIL("lstat " + path);
  return st.st_mode & 07777;
}

}  // namespace

KV_TEST(links_below_the_root_fail_the_block) {
  both_resolutions([](bool openat2) {
    TempDir dir, outside;
    const std::string how = openat2 ? " (openat2)" : " (fallback)";
    Engine engine(kvtest::engine_config(dir));
    const auto bytes = kvtest::pattern(5000, 1);
    std::vector<unsigned char> back(bytes.size());
    // A symlinked directory on the way to a block.
    CHECK_EQ(::mkdir((dir / "d").c_str(), 0700), 0);
    CHECK_EQ(::symlink(outside.path().c_str(), (dir / "d/link").c_str()), 0);
    Completion s = kvtest::store(engine, 1, dir / "d/link/x/a", "k", bytes.data(), bytes.size());
    CHECK_MSG(!s.success && s.error.errno_value == ELOOP, describe(s) + how);
    // openat2 names the directory it was asked for, the fallback the link itself.
    CHECK_MSG(s.error.path.rfind(dir / "d/link", 0) == 0, describe(s) + how);
    CHECK(kvtest::tmp_files_below(outside.path()).empty());
    CHECK(!kvtest::file_exists(outside / "x"));
    // A symlinked block file whose target is a valid block.
    CHECK(kvtest::store(engine, 2, outside / "real", "k", bytes.data(), bytes.size())
              .error.errno_value == EPERM);  // outside the root: refused
    {
      Engine writer(kvtest::engine_config(outside));
      CHECK(kvtest::store(writer, 3, outside / "real", "k", bytes.data(), bytes.size()).success);
    }
    CHECK_EQ(::symlink((outside / "real").c_str(), (dir / "d/b").c_str()), 0);
    Completion l = kvtest::load(engine, 4, dir / "d/b", "k", back.data(), back.size());
    CHECK_MSG(!l.success && l.error.errno_value == ELOOP, describe(l) + how);
    CHECK(back != bytes);
    s = kvtest::store(engine, 5, dir / "d/b", "k", bytes.data(), bytes.size());
    CHECK_MSG(!s.success && s.error.errno_value == ELOOP, describe(s) + how);
    CHECK(kvtest::file_exists(outside / "real"));
    const auto exist = kvtier::regular_files_exist(dir.path(), {dir / "d/b", outside / "real"});
    CHECK(!exist[0] && !exist[1]);
  });
}

KV_TEST(paths_outside_the_root_or_with_dot_dot_fail_with_eperm) {
  TempDir dir;
  Engine engine(kvtest::engine_config(dir));
  const auto bytes = kvtest::pattern(100, 2);
  for (const std::string& path :
       {dir.path() + "/../escaped", std::string("/tmp/elsewhere"), dir.path() + "x/sibling"}) {
    const Completion s = kvtest::store(engine, 1, path, "k", bytes.data(), bytes.size());
    CHECK_MSG(!s.success && s.error.errno_value == EPERM, describe(s));
  }
  CHECK(kvtest::tmp_files_below(dir.path()).empty());
}

KV_TEST(special_files_at_block_paths_fail_without_hanging) {
  both_resolutions([](bool) {
    TempDir dir;
    Engine engine(kvtest::engine_config(dir, ODirectMode::kAuto));
    const auto bytes = kvtest::pattern(5000, 3);
    std::vector<unsigned char> back(bytes.size());
    CHECK_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
    CHECK_EQ(::mkdir((dir / "dir").c_str(), 0700), 0);
    CHECK_EQ(::symlink((dir / "nowhere").c_str(), (dir / "dangling").c_str()), 0);
    const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK(sock >= 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string sock_path = dir / "sock";
    const bool bound = sock_path.size() < sizeof(addr.sun_path);
    if (bound) {
      std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", sock_path.c_str());
      CHECK_EQ(::bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    }
    kvtier::JobId id = 0;
    for (const char* name : {"fifo", "dir", "dangling", "sock"}) {
      if (std::string(name) == "sock" && !bound) continue;
      const Completion l = kvtest::load(engine, ++id, dir / name, "k", back.data(), back.size());
      CHECK_MSG(!l.success && l.error.path == dir / name, describe(l));
      const Completion s = kvtest::store(engine, ++id, dir / name, "k", bytes.data(), bytes.size());
      CHECK_MSG(!s.success && !s.error.message.empty(), describe(s));
    }
    ::close(sock);
    const auto exist = kvtier::regular_files_exist(dir.path(), {dir / "fifo", dir / "dir"});
    CHECK(!exist[0] && !exist[1]);
    CHECK(kvtest::tmp_files_below(dir.path()).empty());
    engine.drain();
  });
}

KV_TEST(directories_get_exactly_the_directory_mode) {
  CHECK_EQ(kvtier::directory_mode(0600), mode_t{0700});
  CHECK_EQ(kvtier::directory_mode(0660), mode_t{0770});
  CHECK_EQ(kvtier::directory_mode(0666), mode_t{0777});
  TempDir dir;
  const mode_t old = ::umask(077);
  try {
    auto config = kvtest::engine_config(dir);
    config.set_root_dir(dir / "new/root");
    config.set_file_mode(0660);
    Engine engine(config);
    const auto bytes = kvtest::pattern(100, 4);
    const Completion s =
        kvtest::store(engine, 1, dir / "new/root/a/b/c", "k", bytes.data(), bytes.size());
    CHECK_MSG(s.success, describe(s));
    for (const char* d : {"new", "new/root", "new/root/a", "new/root/a/b"})
      CHECK_EQ(mode_of(dir / d), mode_t{0770});
    CHECK_EQ(mode_of(dir / "new/root/a/b/c"), mode_t{0660});
  } catch (...) {
    ::umask(old);
    throw;
  }
  ::umask(old);
}

KV_TEST(tmp_file_names_match_the_pattern_and_locks_tell_liveness) {
  // The Python tests match names against kTmpFilePattern with `re`; here: the same parts.
  const std::string name = kvtier::tmp_file_name("abc.kvb");
  const std::string prefix = "abc.kvb." + kvtier::host_label() + "." + std::to_string(::getpid());
  CHECK_MSG(name.rfind(prefix + ".", 0) == 0, name);
  CHECK_MSG(name.size() > prefix.size() + 5 && name.substr(name.size() - 4) == ".tmp", name);
  // <token>.<n>: 16 lowercase hex digits, then the counter.
  const std::string rest = name.substr(prefix.size() + 1, name.size() - prefix.size() - 5);
  CHECK_MSG(rest.size() > 17 && rest[16] == '.', name);
  const std::string token = rest.substr(0, 16), n = rest.substr(17);
  CHECK_MSG(token.find_first_not_of("0123456789abcdef") == std::string::npos, name);
  CHECK_MSG(!n.empty() && n.find_first_not_of("0123456789") == std::string::npos, name);
  CHECK(kvtier::tmp_file_name("abc.kvb") != name);

  TempDir dir;
  const std::string path = dir / name;
  CHECK(kvtier::tmp_file_writer(path) == kvtier::TmpWriter::kMissing);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  CHECK(fd >= 0);
  CHECK(kvtier::tmp_file_writer(path) == kvtier::TmpWriter::kGone);  // not locked yet
  CHECK_EQ(kvtier::lock_tmp_file(fd), 0);
  CHECK(kvtier::tmp_file_writer(path) == kvtier::TmpWriter::kAlive);
  ::close(fd);  // the writer is gone
  CHECK(kvtier::tmp_file_writer(path) == kvtier::TmpWriter::kGone);
  CHECK_EQ(::mkfifo((dir / "f.h.1.2.tmp").c_str(), 0600), 0);
  CHECK(kvtier::tmp_file_writer(dir / "f.h.1.2.tmp") == kvtier::TmpWriter::kUnknown);
}

namespace {

timespec mtime_of(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) FAIL("lstat " + path);
  return st.st_mtim;
}

void make_file(const std::string& path, std::size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) FAIL("create " + path);
  ::close(fd);
}

}  // namespace

KV_TEST(the_evictors_unlinks_remove_only_unchanged_regular_files_beneath_the_root) {
  both_resolutions([](bool openat2) {
    const std::string how = openat2 ? " (openat2)" : " (fallback)";
    TempDir dir, outside;
    CHECK_EQ(::mkdir((dir / "d").c_str(), 0700), 0);
    make_file(dir / "d/a.kvb", 100);
    make_file(dir / "d/b.kvb", 200);  // the same directory: its descriptor is reused
    make_file(dir / "d/used.kvb", 300);
    make_file(dir / "dry.kvb", 400);
    make_file(outside / "x.kvb", 500);
    CHECK_EQ(::mkfifo((dir / "d/fifo.kvb").c_str(), 0600), 0);
    CHECK_EQ(::symlink(outside.path().c_str(), (dir / "link").c_str()), 0);
    const timespec used_then{mtime_of(dir / "d/used.kvb").tv_sec - 1, 0};  // used since
    const std::vector<std::string> paths{
        dir / "d/a.kvb",    dir / "d/b.kvb",     dir / "d/used.kvb", dir / "d/fifo.kvb",
        dir / "d/gone.kvb", dir / "no/such.kvb", dir / "link/x.kvb", outside / "x.kvb"};
    const std::vector<timespec> mtimes{mtime_of(dir / "d/a.kvb"),
                                       mtime_of(dir / "d/b.kvb"),
                                       used_then,
                                       mtime_of(dir / "d/fifo.kvb"),
                                       {},
                                       {},
                                       mtime_of(outside / "x.kvb"),
                                       mtime_of(outside / "x.kvb")};
    const kvtier::UnlinkedFiles done =
        kvtier::unlink_unchanged_files(dir.path(), paths, mtimes, false);
    CHECK_MSG(done.error == 0, done.operation + how);
    const std::vector<std::int64_t> expected{100,
                                             200,
                                             kvtier::kKeptFile,
                                             kvtier::kKeptFile,
                                             kvtier::kGoneFile,
                                             kvtier::kGoneFile,
                                             kvtier::kKeptFile,
                                             kvtier::kKeptFile};
    CHECK_MSG(done.outcomes == expected, how);
    CHECK(!kvtest::file_exists(dir / "d/a.kvb") && !kvtest::file_exists(dir / "d/b.kvb"));
    CHECK(kvtest::file_exists(dir / "d/used.kvb") && kvtest::file_exists(outside / "x.kvb"));

    const kvtier::UnlinkedFiles dry = kvtier::unlink_unchanged_files(
        dir.path(), {dir / "dry.kvb"}, {mtime_of(dir / "dry.kvb")}, true);
    CHECK(dry.error == 0 && dry.outcomes == std::vector<std::int64_t>{400});
    CHECK(kvtest::file_exists(dir / "dry.kvb"));
    // Without a root only the last component is not followed (the Python side's lstat).
    const kvtier::UnlinkedFiles unrooted = kvtier::unlink_unchanged_files(
        "", {dir / "link/x.kvb"}, {mtime_of(outside / "x.kvb")}, true);
    CHECK(unrooted.outcomes == std::vector<std::int64_t>{500});
  });
}

KV_TEST(the_evictors_unlinks_stop_at_the_first_error_and_say_where) {
  TempDir dir;
  make_file(dir / "a.kvb", 10);
  bool threw = false;
  try {
    kvtier::unlink_unchanged_files(dir.path(), {dir / "a.kvb"}, {}, false);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
  const kvtier::UnlinkedFiles missing_root =
      kvtier::unlink_unchanged_files(dir / "none", {dir / "none/a.kvb"}, {timespec{}}, false);
  CHECK(missing_root.error == ENOENT && missing_root.operation == "open");
  CHECK(missing_root.outcomes.empty() && missing_root.root_failed);
  CHECK(kvtest::file_exists(dir / "a.kvb"));
}
