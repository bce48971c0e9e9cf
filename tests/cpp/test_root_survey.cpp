// kvtier::RootSurvey, the walk behind `kvtier gc`, `kvtier du` and a tier's evictor: what it
// counts, which blocks it keeps as candidates, in steps of any size, and what ends it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

#include <kvtier/root_survey.hpp>

#include "harness.hpp"

namespace {

using kvtest::TempDir;
using kvtier::RootSurvey;

void make_file(const std::string& path, std::size_t size, std::int64_t mtime_s) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) FAIL("open " + path);
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) FAIL("ftruncate " + path);
  const timespec when[2] = {{mtime_s, 0}, {mtime_s, 0}};
  if (::futimens(fd, when) != 0) FAIL("futimens " + path);
  ::close(fd);
}

void make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0) FAIL("mkdir " + path);
}

// A root with two namespaces, a tmp file, files that are not blocks, a directory named like
// a block, a link to a directory outside and the state directory.
void plant(const TempDir& root, const TempDir& outside) {
  make_dir(root / "a");
  make_dir(root / "a/x");
  make_dir(root / "b");
  make_dir(root / ".kvtier");
  make_dir(root / "a/dir.kvb");
  make_file(root / "a/x/1.kvb", 100, 1000);
  make_file(root / "a/x/2.kvb", 200, 3000);
  make_file(root / "a/dir.kvb/3.kvb", 7, 1);  // below a block-named directory: not walked
  make_file(root / "b/4.kvb", 300, 2000);
  make_file(root / "b/4.kvb.host.1.00000000000000ff.2.tmp", 50, 5);
  make_file(root / "b/notes.txt", 9, 1);
  make_file(root / ".kvtier/5.kvb", 11, 1);
  make_file(root / "6.kvb", 400, 500);
  make_file(outside / "7.kvb", 13, 1);
  if (::symlink(outside.path().c_str(), (root / "a/out").c_str()) != 0) FAIL("symlink");
  if (::symlink((outside / "7.kvb").c_str(), (root / "b/8.kvb").c_str()) != 0) FAIL("symlink");
}

const kvtier::NamespaceUsage* find(const RootSurvey& s, const std::string& name) {
  for (const kvtier::NamespaceUsage& u : s.namespaces())
    if (u.name == name) return &u;
  return nullptr;
}

KV_TEST(counts_blocks_and_tmp_files_per_namespace_in_steps_of_one) {
  TempDir root, outside;
  plant(root, outside);
  RootSurvey s(root.path(), 1 << 30, 100);
  std::size_t steps = 0;
  while (!s.advance(1)) ++steps;
  CHECK(s.error() == 0);
  CHECK(s.files() == 5);  // 1, 2, 4, its tmp file and 6
  CHECK(steps >= 4);
  CHECK(s.namespaces().size() == 3);
  const auto* a = find(s, "a");
  const auto* b = find(s, "b");
  const auto* top = find(s, "");
  CHECK(a && a->blocks == 2 && a->block_bytes == 300 && a->tmp_files == 0);
  CHECK(a->oldest.tv_sec == 1000 && a->newest.tv_sec == 3000 && a->oldest.tv_nsec == 0);
  CHECK(b && b->blocks == 1 && b->block_bytes == 300 && b->tmp_files == 1 && b->tmp_bytes == 50);
  CHECK(top && top->blocks == 1 && top->block_bytes == 400);
  const std::vector<kvtier::SurveyCandidate> c = s.take_candidates();
  CHECK(c.size() == 4);
  CHECK(c[0].path == root / "6.kvb" && c[0].size == 400);
  CHECK(c[1].path == root / "a/x/1.kvb");
  CHECK(c[2].path == root / "b/4.kvb");
  CHECK(c[3].path == root / "a/x/2.kvb");
  CHECK(s.namespaces()[c[0].namespace_index].name.empty());
  CHECK(s.namespaces()[c[3].namespace_index].name == "a");
}

KV_TEST(keeps_only_the_oldest_blocks_that_cover_what_is_wanted) {
  TempDir root, outside;
  plant(root, outside);
  RootSurvey wanted(root.path(), 450, 100);
  while (!wanted.advance(1000)) {
  }
  const auto c = wanted.take_candidates();
  CHECK(c.size() == 2);  // 6 (400 bytes, the oldest) and 1: 500 >= 450
  CHECK(c[0].path == root / "6.kvb" && c[1].path == root / "a/x/1.kvb");

  RootSurvey capped(root.path(), 1 << 30, 1);
  while (!capped.advance(1000)) {
  }
  const auto one = capped.take_candidates();
  CHECK(one.size() == 1 && one[0].path == root / "6.kvb");

  RootSurvey none(root.path(), 0, 100);
  while (!none.advance(1000)) {
  }
  CHECK(none.take_candidates().empty() && none.files() == 5);
}

KV_TEST(a_missing_root_is_empty_and_a_file_is_an_error) {
  TempDir dir;
  RootSurvey missing(dir / "nothing", 1, 1);
  CHECK(missing.advance(1) && missing.error() == 0 && missing.files() == 0);
  make_file(dir / "plain", 1, 1);
  RootSurvey file(dir / "plain", 1, 1);
  CHECK(file.advance(1));
  CHECK(file.error() == ENOTDIR);
  CHECK(file.error_path() == dir / "plain");
}

}  // namespace
