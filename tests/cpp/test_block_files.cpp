// Block files on a real file system: byte-exact round trips for aligned and unaligned memory
// and lengths with O_DIRECT on and off; every kind of damage (truncation, flipped payload or
// header byte, wrong key, wrong fingerprint, wrong length) is a failed block and the file is
// removed; an existing final file is a counted dedup; concurrent writers of one key (threads,
// engines, processes) all succeed and leave one valid file and no tmp file.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>
#include <vector>

#include "engine_helpers.hpp"

extern char** environ;

namespace {

using kvtest::block;
using kvtest::describe;
using kvtest::flip_byte;
using kvtest::Memory;
using kvtest::TempDir;
using kvtier::Completion;
using kvtier::Direction;
using kvtier::Engine;
using kvtier::EngineConfig;
using kvtier::ODirectMode;

// `bytes` cut into host segments of `lengths`, each in memory of its own (kept in `parts`)
// starting misalign(i) bytes past a page; the memory holds the bytes when `fill`.
std::vector<kvtier::Segment> host_segments(
    std::vector<std::unique_ptr<Memory>>& parts, const std::vector<std::size_t>& lengths,
    const std::vector<unsigned char>& bytes, bool fill,
    const std::function<std::size_t(std::size_t)>& misalign) {
  std::vector<kvtier::Segment> segs;
  std::size_t at = 0;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    parts.push_back(std::make_unique<Memory>(lengths[i], misalign(i)));
    if (fill) std::memcpy(parts.back()->data(), bytes.data() + at, lengths[i]);
    segs.push_back({parts.back()->data(), lengths[i], kvtier::MemoryKind::kHost});
    at += lengths[i];
  }
  return segs;
}

kvtier::BlockOp segment_block(const std::string& path, const std::string& key,
                              std::vector<kvtier::Segment> segs) {
  kvtier::BlockOp op;
  op.path = path;
  op.key = key;
  op.segments = std::move(segs);
  return op;
}

// O_DIRECT modes to exercise here: off, auto, and on where the probe says it works.
std::vector<ODirectMode> o_direct_modes(const TempDir& dir) {
  std::vector<ODirectMode> modes{ODirectMode::kOff, ODirectMode::kAuto};
  const std::string why = kvtier::probe_o_direct(dir.path());
  if (why.empty())
    modes.push_back(ODirectMode::kOn);
  else
    std::printf("  O_DIRECT not supported in %s (%s): o_direct=true not exercised\n",
                dir.path().c_str(), why.c_str());
  return modes;
}

const char* name(ODirectMode m) {
  return kvtier::to_string(m);
}

void overwrite(const std::string& path, off_t offset, const void* bytes, std::size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) FAIL("open " + path);
  const ssize_t w = ::pwrite(fd, bytes, n, offset);
  ::close(fd);
  if (w != static_cast<ssize_t>(n)) FAIL("pwrite " + path);
}

// Stores a fresh block, applies `damage` to its file, loads it and checks that the load
// failed with EBADMSG ("verify"), that the file is gone, and that it was counted.
void expect_corrupt_load(ODirectMode mode, const std::string& what,
                         const std::function<void(const std::string& path)>& damage,
                         std::size_t length = 10000, const std::string& load_key = "key",
                         std::size_t load_length = 0, const std::string& load_fingerprint = "") {
  TempDir dir;
  EngineConfig config = kvtest::engine_config(dir, mode);
  const auto bytes = kvtest::pattern(length, 77);
  const std::string path = dir / "blk";
  {
    Engine writer(config);
    const Completion s = kvtest::store(writer, 1, path, "key", bytes.data(), bytes.size());
    CHECK_MSG(s.success, describe(s));
  }
  damage(path);
  if (!load_fingerprint.empty()) config.set_fingerprint(load_fingerprint);
  Engine engine(config);
  const std::size_t n = load_length != 0 ? load_length : length;
  Memory back(n, 0);
  const Completion l = kvtest::load(engine, 2, path, load_key, back.data(), n);
  std::printf("  %s (o_direct=%s): %s\n", what.c_str(), name(mode), l.error.message.c_str());
  CHECK_MSG(!l.success, what + ": a damaged block was loaded");
  CHECK_EQ(l.block_errnos.size(), std::size_t{1});
  CHECK_EQ(l.block_errnos[0], EBADMSG);
  CHECK_EQ(l.error.errno_value, EBADMSG);
  CHECK_EQ(l.error.operation, std::string("verify"));
  CHECK_EQ(l.error.path, path);
  CHECK(!l.error.message.empty());
  CHECK_EQ(l.bytes, std::uint64_t{0});
  CHECK_MSG(!kvtest::file_exists(path), what + ": the bad file was not removed");
  const auto st = engine.stats();
  CHECK_EQ(st.corrupt_files_removed, std::uint64_t{1});
  CHECK_EQ(st.failed_load_blocks, std::uint64_t{1});
  CHECK_EQ(st.failed_load_jobs, std::uint64_t{1});
  // Now a clean miss.
  const Completion again = kvtest::load(engine, 3, path, load_key, back.data(), n);
  CHECK(!again.success);
  CHECK_EQ(again.error.errno_value, ENOENT);
}

}  // namespace

KV_TEST(round_trip_lengths_alignments_and_o_direct_modes) {
  TempDir dir;
  const std::size_t lengths[] = {
      0, 1, 100, 4095, 4096, 4097, 12345, 65536, (std::size_t{1} << 20) + 3};
  const std::size_t misaligns[] = {0, 1, 8, 512, 4095};
  int job = 0;
  for (ODirectMode mode : o_direct_modes(dir)) {
    EngineConfig config = kvtest::engine_config(dir, mode);
    Engine engine(config);
    if (mode == ODirectMode::kOn) CHECK(engine.direct_io());
    if (mode == ODirectMode::kOff) CHECK(!engine.direct_io());
    if (mode == ODirectMode::kAuto)
      CHECK_EQ(engine.direct_io(), engine.o_direct_fallback_reason().empty());
    for (std::size_t length : lengths) {
      for (std::size_t misalign : misaligns) {
        const std::string where = std::string("o_direct=") + name(mode) +
                                  " length=" + std::to_string(length) +
                                  " misalign=" + std::to_string(misalign);
        const auto bytes = kvtest::pattern(length, static_cast<std::uint32_t>(length + misalign));
        Memory src(length, misalign);
        src.fill(bytes);
        const std::string path = dir / (std::string(name(mode)) + "/" + std::to_string(length) +
                                        "/" + std::to_string(misalign));
        const Completion s =
            kvtest::store(engine, ++job, path, "k" + std::to_string(length), src.data(), length);
        CHECK_MSG(s.success, where + ": " + describe(s));
        CHECK_EQ(s.bytes, std::uint64_t{length});
        CHECK_MSG(kvtest::file_size(path) == off_t(kvtier::kHeaderSize + kvtier::align_up(length)),
                  where);
        CHECK_MSG(src.equals(bytes), where + ": store modified the source");
        // Load into memory with a different misalignment than the store used.
        const std::size_t load_misalign = misalign == 0 ? 3 : 0;
        Memory dst(length, load_misalign);
        const Completion l =
            kvtest::load(engine, ++job, path, "k" + std::to_string(length), dst.data(), length);
        CHECK_MSG(l.success, where + ": " + describe(l));
        CHECK_EQ(l.bytes, std::uint64_t{length});
        CHECK_MSG(dst.equals(bytes), where + ": loaded bytes differ");
      }
    }
    CHECK_EQ(engine.stats().failed_store_blocks + engine.stats().failed_load_blocks,
             std::uint64_t{0});
  }
  CHECK(kvtest::tmp_files_below(dir.path()).empty());
}

KV_TEST(files_are_readable_whatever_mode_wrote_them) {
  TempDir dir;
  const auto modes = o_direct_modes(dir);
  const std::size_t length = 3 * 4096 + 17;
  const auto bytes = kvtest::pattern(length, 21);
  int job = 0;
  for (ODirectMode writer_mode : modes) {
    Engine writer(kvtest::engine_config(dir, writer_mode));
    const std::string path = dir / (std::string("x-") + name(writer_mode));
    CHECK(kvtest::store(writer, ++job, path, "k", bytes.data(), length).success);
    for (ODirectMode reader_mode : modes) {
      Engine reader(kvtest::engine_config(dir, reader_mode));
      for (std::size_t misalign : {std::size_t{0}, std::size_t{5}}) {
        Memory dst(length, misalign);
        const Completion l = kvtest::load(reader, ++job, path, "k", dst.data(), length);
        CHECK_MSG(l.success,
                  std::string(name(writer_mode)) + " -> " + name(reader_mode) + ": " + describe(l));
        CHECK(dst.equals(bytes));
      }
    }
  }
}

KV_TEST(one_staging_buffer_moves_large_unaligned_blocks) {
  // One 1 MiB staging buffer for everything: unaligned multi-MiB blocks go through it in
  // pieces (under O_DIRECT), from several workers at once (they take turns on the buffer).
  TempDir dir;
  EngineConfig config = kvtest::engine_config(dir, ODirectMode::kAuto, 2, 2);
  config.set_staging_buffer_bytes(std::size_t{1} << 20);
  config.set_staging_bytes_total(config.staging_buffer_bytes());
  Engine engine(config);
  const std::size_t length = 3 * (std::size_t{1} << 20) + 5;
  std::vector<std::vector<unsigned char>> payloads;
  std::vector<std::unique_ptr<Memory>> src, dst;
  std::vector<kvtier::BlockOp> stores, loads;
  for (int i = 0; i < 4; ++i) {
    payloads.push_back(kvtest::pattern(length, 300 + i));
    src.push_back(std::make_unique<Memory>(length, 1 + i));
    src.back()->fill(payloads.back());
    dst.push_back(std::make_unique<Memory>(length, 7 + i));
    stores.push_back(block(dir / ("big" + std::to_string(i)), "big", src.back()->data(), length));
    loads.push_back(block(dir / ("big" + std::to_string(i)), "big", dst.back()->data(), length));
  }
  const Completion s = kvtest::run_job(engine, 1, Direction::kStore, stores);
  CHECK_MSG(s.success, describe(s));
  const Completion l = kvtest::run_job(engine, 2, Direction::kLoad, loads);
  CHECK_MSG(l.success, describe(l));
  for (int i = 0; i < 4; ++i) CHECK(dst[i]->equals(payloads[i]));
}

KV_TEST(host_segments_round_trip_and_match_contiguous_files) {
  // A payload given as segments writes the same file a contiguous buffer does, and either
  // form loads what the other stored. Unaligned segments (odd lengths, one empty) move through
  // staging under O_DIRECT; page-aligned ones (whole pages but the last) go to the file in
  // place in every mode, the last partial page through the worker's tail page.
  struct Shape {
    std::vector<std::size_t> lengths;
    bool aligned;
  };
  for (const Shape& shape :
       {Shape{{5000, 0, 1, 4096, 70000, 123}, false}, Shape{{8192, 0, 4096, 12388}, true}}) {
    TempDir dir;
    const std::vector<std::size_t>& lengths = shape.lengths;
    std::size_t total = 0;
    for (std::size_t n : lengths) total += n;
    const auto bytes = kvtest::pattern(total, 55);
    int job = 0;
    for (ODirectMode mode : o_direct_modes(dir)) {
      EngineConfig config = kvtest::engine_config(dir, mode);
      config.set_staging_buffer_bytes(16384);  // several pieces per block, pieces straddle segments
      config.set_staging_bytes_total(2 * 16384);
      Engine engine(config);
      std::vector<std::unique_ptr<Memory>> parts;
      auto make_segments = [&](bool fill) {
        return host_segments(parts, lengths, bytes, fill,
                             [&](std::size_t i) { return shape.aligned ? 0 : 1 + i * 3; });
      };
      auto seg_block = [](const std::string& path, std::vector<kvtier::Segment> segs) {
        return segment_block(path, "seg", std::move(segs));
      };
      const std::string seg_path = dir / (std::string("seg-") + name(mode));
      const std::string flat_path = dir / (std::string("flat-") + name(mode));
      Completion c = kvtest::run_job(engine, ++job, Direction::kStore,
                                     {seg_block(seg_path, make_segments(true))});
      CHECK_MSG(c.success, describe(c));
      CHECK_EQ(c.bytes, std::uint64_t{total});
      CHECK(kvtest::store(engine, ++job, flat_path, "seg", bytes.data(), total).success);
      // Same key, payload and fingerprint: byte-identical files.
      std::vector<unsigned char> a(static_cast<std::size_t>(kvtest::file_size(seg_path)));
      std::vector<unsigned char> b(static_cast<std::size_t>(kvtest::file_size(flat_path)));
      CHECK_EQ(a.size(), b.size());
      FILE* fa = std::fopen(seg_path.c_str(), "rb");
      FILE* fb = std::fopen(flat_path.c_str(), "rb");
      CHECK(fa != nullptr && fb != nullptr);
      CHECK_EQ(std::fread(a.data(), 1, a.size(), fa), a.size());
      CHECK_EQ(std::fread(b.data(), 1, b.size(), fb), b.size());
      std::fclose(fa);
      std::fclose(fb);
      CHECK_MSG(a == b,
                std::string("segment and contiguous stores differ, o_direct=") + name(mode));
      // Segments load from either file.
      for (const std::string& path : {seg_path, flat_path}) {
        const std::size_t first = parts.size();
        c = kvtest::run_job(engine, ++job, Direction::kLoad,
                            {seg_block(path, make_segments(false))});
        CHECK_MSG(c.success, describe(c));
        std::vector<unsigned char> joined;
        for (std::size_t i = first; i < parts.size(); ++i)
          joined.insert(joined.end(), parts[i]->data(), parts[i]->data() + parts[i]->size());
        CHECK(joined == bytes);
      }
      // And a contiguous load reads the segment-written file.
      Memory flat(total, 9);
      CHECK(kvtest::load(engine, ++job, seg_path, "seg", flat.data(), total).success);
      CHECK(flat.equals(bytes));
      // Damage is caught on the segment path too.
      flip_byte(seg_path, static_cast<off_t>(4096 + total - 1), 0x20);
      c = kvtest::run_job(engine, ++job, Direction::kLoad,
                          {seg_block(seg_path, make_segments(false))});
      CHECK(!c.success);
      CHECK_EQ(c.error.errno_value, EBADMSG);
      CHECK(!kvtest::file_exists(seg_path));
    }
  }
}

KV_TEST(staged_blocks_that_fit_one_staging_buffer_round_trip) {
  // Unaligned memory under O_DIRECT, contiguous and as segments, small enough that the whole
  // file (header page and padded payload) fits one staging buffer: the io_uring engine moves
  // it as one registered buffer, psync in one piece. Either way the file is the one a
  // buffered store of the same bytes writes, and it loads back byte for byte.
  TempDir dir;
  const std::string why = kvtier::probe_o_direct(dir.path());
  if (!why.empty()) {
    std::printf("  O_DIRECT not supported in %s (%s): not exercised\n", dir.path().c_str(),
                why.c_str());
    return;
  }
  const std::vector<std::size_t> lengths{3000, 0, 20000, 7};
  std::size_t total = 0;
  for (std::size_t n : lengths) total += n;
  const auto bytes = kvtest::pattern(total, 91);
  EngineConfig config = kvtest::engine_config(dir, ODirectMode::kOn);
  config.set_staging_buffer_bytes(65536);
  config.set_staging_bytes_total(2 * 65536);
  std::vector<std::unique_ptr<Memory>> parts;
  auto segments = [&](bool fill) {
    return host_segments(parts, lengths, bytes, fill, [](std::size_t i) { return 5 + i; });
  };
  auto seg_block = [](const std::string& path, std::vector<kvtier::Segment> segs) {
    return segment_block(path, "st", std::move(segs));
  };
  {
    Engine engine(config);
    CHECK(engine.direct_io());
    Memory flat(total, 3);
    flat.fill(bytes);
    CHECK(kvtest::store(engine, 1, dir / "flat", "st", flat.data(), total).success);
    Completion c =
        kvtest::run_job(engine, 2, Direction::kStore, {seg_block(dir / "seg", segments(true))});
    CHECK_MSG(c.success, describe(c));
    for (const char* name : {"flat", "seg"}) {
      Memory back(total, 11);
      c = kvtest::load(engine, 3, dir / name, "st", back.data(), total);
      CHECK_MSG(c.success, describe(c));
      CHECK(back.equals(bytes));
      const std::size_t first = parts.size();
      c = kvtest::run_job(engine, 4, Direction::kLoad, {seg_block(dir / name, segments(false))});
      CHECK_MSG(c.success, describe(c));
      std::vector<unsigned char> joined;
      for (std::size_t i = first; i < parts.size(); ++i)
        joined.insert(joined.end(), parts[i]->data(), parts[i]->data() + parts[i]->size());
      CHECK(joined == bytes);
    }
  }
  Engine buffered(kvtest::engine_config(dir, ODirectMode::kOff));
  CHECK(kvtest::store(buffered, 5, dir / "reference", "st", bytes.data(), total).success);
  for (const char* name : {"flat", "seg"}) {
    std::ifstream a(dir / name, std::ios::binary), b(dir / "reference", std::ios::binary);
    const std::vector<char> got{std::istreambuf_iterator<char>(a), {}};
    const std::vector<char> want{std::istreambuf_iterator<char>(b), {}};
    CHECK_MSG(got == want, name);
  }
}

KV_TEST(o_direct_modes_report_what_they_do) {
  TempDir dir;
  const std::string why = kvtier::probe_o_direct(dir.path());
  Engine automatic(kvtest::engine_config(dir, ODirectMode::kAuto));
  CHECK_EQ(automatic.direct_io(), why.empty());
  CHECK_EQ(automatic.o_direct_fallback_reason().empty(), why.empty());
  if (why.empty()) {
    Engine on(kvtest::engine_config(dir, ODirectMode::kOn));
    CHECK(on.direct_io());
  } else {
    bool threw = false;
    try {
      Engine on(kvtest::engine_config(dir, ODirectMode::kOn));
    } catch (const kvtier::SystemError& e) {
      threw = true;
      CHECK_EQ(e.path(), dir.path());
      CHECK_EQ(e.code().value(), EINVAL);
    }
    CHECK_MSG(threw, "o_direct=true on a directory without O_DIRECT did not throw");
  }
  // The probe leaves nothing behind.
  std::size_t entries = 0;
  for (auto it = std::filesystem::directory_iterator(dir.path());
       it != std::filesystem::directory_iterator(); ++it)
    ++entries;
  CHECK_EQ(entries, std::size_t{0});
}

KV_TEST(truncated_files_fail_and_are_removed) {
  for (ODirectMode mode : {ODirectMode::kOff, ODirectMode::kAuto}) {
    // Payload 10000 bytes -> file 4096 + 12288.
    for (off_t size : {off_t{0}, off_t{100}, off_t{4095}, off_t{4096}, off_t{4096 + 5000},
                       off_t{4096 + 8192}, off_t{4096 + 9999}}) {
      expect_corrupt_load(
          mode, "truncated to " + std::to_string(size),
          [size](const std::string& path) { CHECK(::truncate(path.c_str(), size) == 0); });
    }
  }
}

KV_TEST(payload_checksum_mismatch_fails_and_removes_the_file) {
  for (ODirectMode mode : {ODirectMode::kOff, ODirectMode::kAuto}) {
    for (off_t at : {off_t{4096}, off_t{4096 + 4321}, off_t{4096 + 9999}}) {
      expect_corrupt_load(mode, "flipped payload byte " + std::to_string(at),
                          [at](const std::string& path) { flip_byte(path, at, 0x20); });
    }
  }
}

KV_TEST(header_damage_fails_and_removes_the_file) {
  for (off_t at : {off_t{0}, off_t{8}, off_t{12}, off_t{16}, off_t{72}, off_t{3000}}) {
    expect_corrupt_load(ODirectMode::kAuto, "flipped header byte " + std::to_string(at),
                        [at](const std::string& path) { flip_byte(path, at, 0x20); });
  }
  expect_corrupt_load(ODirectMode::kOff, "zeroed header", [](const std::string& path) {
    std::vector<unsigned char> zeros(4096, 0);
    overwrite(path, 0, zeros.data(), zeros.size());
  });
}

KV_TEST(key_mismatch_fails_and_removes_the_file) {
  auto none = [](const std::string&) {};
  expect_corrupt_load(ODirectMode::kOff, "other key", none, 10000, "kez");
  expect_corrupt_load(ODirectMode::kAuto, "longer key", none, 10000, "key2");
  expect_corrupt_load(ODirectMode::kAuto, "empty key", none, 10000, "");
}

KV_TEST(fingerprint_mismatch_fails_and_removes_the_file) {
  auto none = [](const std::string&) {};
  expect_corrupt_load(ODirectMode::kOff, "other fingerprint", none, 10000, "key", 0,
                      "other-layout");
  expect_corrupt_load(ODirectMode::kAuto, "other fingerprint", none, 10000, "key", 0,
                      "test-fingerprinT");
}

KV_TEST(payload_length_mismatch_fails_and_removes_the_file) {
  auto none = [](const std::string&) {};
  expect_corrupt_load(ODirectMode::kOff, "shorter expected length", none, 10000, "key", 9999);
  expect_corrupt_load(ODirectMode::kAuto, "longer expected length", none, 10000, "key", 10001);
}

KV_TEST(a_missing_file_is_a_clean_miss) {
  TempDir dir;
  Engine engine(kvtest::engine_config(dir, ODirectMode::kAuto));
  std::vector<unsigned char> back(100);
  const Completion l = kvtest::load(engine, 1, dir / "nope", "k", back.data(), back.size());
  CHECK(!l.success);
  CHECK_EQ(l.error.errno_value, ENOENT);
  CHECK_EQ(l.error.operation, std::string("open"));
  CHECK_EQ(l.error.path, dir / "nope");
  CHECK_EQ(engine.stats().corrupt_files_removed, std::uint64_t{0});
}

KV_TEST(partly_failed_load_keeps_the_blocks_that_arrived) {
  TempDir dir;
  Engine engine(kvtest::engine_config(dir, ODirectMode::kAuto));
  const auto a = kvtest::pattern(5000, 1), c = kvtest::pattern(7000, 3);
  CHECK(kvtest::store(engine, 1, dir / "a", "a", a.data(), a.size()).success);
  CHECK(kvtest::store(engine, 2, dir / "c", "c", c.data(), c.size()).success);
  std::vector<unsigned char> ba(a.size()), bb(100), bc(c.size());
  const Completion l = kvtest::run_job(
      engine, 3, Direction::kLoad,
      {block(dir / "a", "a", ba.data(), ba.size()), block(dir / "b", "b", bb.data(), bb.size()),
       block(dir / "c", "c", bc.data(), bc.size())});
  CHECK(!l.success);
  CHECK(l.block_errnos == (std::vector<int>{0, ENOENT, 0}));
  CHECK_EQ(l.error.errno_value, ENOENT);
  CHECK_EQ(l.error.path, dir / "b");
  CHECK_EQ(l.bytes, std::uint64_t{5000 + 7000});
  CHECK(ba == a);
  CHECK(bc == c);
  const auto st = engine.stats();
  CHECK_EQ(st.load_blocks, std::uint64_t{2});
  CHECK_EQ(st.failed_load_blocks, std::uint64_t{1});
  CHECK_EQ(st.failed_load_jobs, std::uint64_t{1});
}

KV_TEST(existing_final_file_is_a_counted_dedup) {
  TempDir dir;
  Engine engine(kvtest::engine_config(dir, ODirectMode::kAuto));
  const auto first = kvtest::pattern(6000, 1), second = kvtest::pattern(6000, 2);
  const std::string path = dir / "d/blk";
  CHECK(kvtest::store(engine, 1, path, "k", first.data(), first.size()).success);
  struct stat before, after;
  CHECK(::stat(path.c_str(), &before) == 0);
  const Completion s = kvtest::store(engine, 2, path, "k", second.data(), second.size());
  CHECK_MSG(s.success, describe(s));
  CHECK(s.block_errnos == std::vector<int>{0});
  CHECK(::stat(path.c_str(), &after) == 0);
  CHECK_EQ(after.st_ino, before.st_ino);  // the file was left alone
  CHECK_EQ(engine.stats().dedup_skips, std::uint64_t{1});
  std::vector<unsigned char> back(first.size());
  CHECK(kvtest::load(engine, 3, path, "k", back.data(), back.size()).success);
  CHECK(back == first);
  CHECK(kvtest::tmp_files_below(dir.path()).empty());
}

KV_TEST(durability_and_checksum_options_round_trip) {
  TempDir dir;
  int job = 0;
  for (kvtier::Durability d :
       {kvtier::Durability::kNone, kvtier::Durability::kData, kvtier::Durability::kFull}) {
    for (kvtier::Checksum c : {kvtier::Checksum::kCrc32c, kvtier::Checksum::kNone}) {
      EngineConfig config = kvtest::engine_config(dir, ODirectMode::kAuto);
      config.set_durability(d);
      config.set_checksum(c);
      Engine engine(config);
      const auto bytes = kvtest::pattern(9000, static_cast<std::uint32_t>(job));
      const std::string path =
          dir / (std::string(kvtier::to_string(d)) + "-" + kvtier::to_string(c));
      const Completion s = kvtest::store(engine, ++job, path, "k", bytes.data(), bytes.size());
      CHECK_MSG(s.success, describe(s));
      std::vector<unsigned char> back(bytes.size());
      const Completion l = kvtest::load(engine, ++job, path, "k", back.data(), back.size());
      CHECK_MSG(l.success, describe(l));
      CHECK(back == bytes);
    }
  }
  // A file written without a payload checksum loads under a checksumming engine (the header
  // says "none"), and one written with a checksum loads under a non-checksumming engine.
  EngineConfig with = kvtest::engine_config(dir, ODirectMode::kOff);
  EngineConfig without = with;
  without.set_checksum(kvtier::Checksum::kNone);
  Engine e_with(with), e_without(without);
  const auto bytes = kvtest::pattern(5000, 5);
  std::vector<unsigned char> back(bytes.size());
  CHECK(kvtest::store(e_without, 100, dir / "n", "k", bytes.data(), bytes.size()).success);
  CHECK(kvtest::load(e_with, 101, dir / "n", "k", back.data(), back.size()).success);
  CHECK(back == bytes);
  CHECK(kvtest::store(e_with, 102, dir / "w", "k", bytes.data(), bytes.size()).success);
  std::fill(back.begin(), back.end(), 0);
  CHECK(kvtest::load(e_without, 103, dir / "w", "k", back.data(), back.size()).success);
  CHECK(back == bytes);
}

KV_TEST(concurrent_writers_of_one_key_threads_one_engine) {
  // Many jobs of one engine store the same key at once (from several submitting threads).
  TempDir dir;
  Engine engine(kvtest::engine_config(dir, ODirectMode::kAuto, 2, 6));
  const auto bytes = kvtest::pattern(200000, 42);
  constexpr int kRounds = 20, kWriters = 8;
  for (int round = 0; round < kRounds; ++round) {
    const std::string path = dir / ("k/" + std::to_string(round));
    std::vector<std::jthread> submitters;
    for (int w = 0; w < kWriters; ++w)
      submitters.emplace_back([&, w] {
        engine.submit(
            round * 100 + w, Direction::kStore,
            {block(path, "same", const_cast<unsigned char*>(bytes.data()), bytes.size())});
      });
    for (auto& t : submitters) t.join();
    std::vector<Completion> got;
    kvtest::pop_exactly(engine, kWriters, got);
    for (const auto& c : got) CHECK_MSG(c.success, describe(c));
  }
  // Every key: exactly one writer published, the others were dedups.
  CHECK_EQ(engine.stats().dedup_skips, std::uint64_t{kRounds * (kWriters - 1)});
  CHECK(kvtest::tmp_files_below(dir.path()).empty());
  std::vector<unsigned char> back(bytes.size());
  for (int round = 0; round < kRounds; ++round) {
    const Completion l = kvtest::load(engine, 10000 + round, dir / ("k/" + std::to_string(round)),
                                      "same", back.data(), back.size());
    CHECK_MSG(l.success, describe(l));
    CHECK(back == bytes);
  }
}

// Several engines in one process writing the same keys at once: tmp names must not collide.
KV_TEST(concurrent_writers_of_one_key_several_engines_one_process) {
  TempDir dir;
  const auto bytes = kvtest::pattern(8192 + 5, 43);
  constexpr int kEngines = 4, kKeys = 200;
  std::vector<std::unique_ptr<Engine>> engines;
  for (int e = 0; e < kEngines; ++e)
    engines.push_back(
        std::make_unique<Engine>(kvtest::engine_config(dir, ODirectMode::kAuto, 1, 1)));
  std::atomic<bool> go{false};
  std::vector<std::vector<Completion>> results(kEngines);
  std::vector<std::jthread> threads;
  for (int e = 0; e < kEngines; ++e)
    threads.emplace_back([&, e] {
      while (!go.load()) std::this_thread::yield();
      for (int k = 0; k < kKeys; ++k)
        engines[e]->submit(k, Direction::kStore,
                           {block(dir / ("k/" + std::to_string(k)), "same",
                                  const_cast<unsigned char*>(bytes.data()), bytes.size())});
      engines[e]->drain();
      results[e] = engines[e]->pop_completions();
    });
  go.store(true);
  for (auto& t : threads) t.join();
  int failures = 0;
  std::string first_failure;
  for (int e = 0; e < kEngines; ++e) {
    CHECK_EQ(results[e].size(), std::size_t{kKeys});
    for (const auto& c : results[e])
      if (!c.success && failures++ == 0) first_failure = describe(c);
  }
  CHECK_MSG(failures == 0,
            std::to_string(failures) + " concurrent stores failed, first: " + first_failure);
  CHECK(kvtest::tmp_files_below(dir.path()).empty());
  std::vector<unsigned char> back(bytes.size());
  for (int k = 0; k < kKeys; ++k) {
    const Completion l = kvtest::load(*engines[0], 1000 + k, dir / ("k/" + std::to_string(k)),
                                      "same", back.data(), back.size());
    CHECK_MSG(l.success, describe(l));
    CHECK(back == bytes);
  }
}

// Child mode of the multi-process test: `test_block_files --writer <dir> <keys>` stores every
// key once with its own engine and exits 0 only if every store succeeded.
static int writer_main(const std::string& dir, int keys) {
  EngineConfig config;
  config.set_root_dir(dir);
  config.set_fingerprint("test-fingerprint");
  config.set_n_read_threads(1);
  config.set_n_write_threads(2);
  config.set_io_engine(kvtest::io_engine_under_test());
  Engine engine(config);
  const auto bytes = kvtest::pattern(100000, 44);
  for (int k = 0; k < keys; ++k)
    engine.submit(k, Direction::kStore,
                  {block(dir + "/k/" + std::to_string(k), "same",
                         const_cast<unsigned char*>(bytes.data()), bytes.size())});
  engine.drain();
  int failed = 0;
  for (const auto& c : engine.pop_completions())
    if (!c.success) {
      std::fprintf(stderr, "writer %d: %s\n", static_cast<int>(::getpid()), describe(c).c_str());
      ++failed;
    }
  return failed == 0 ? 0 : 1;
}

namespace {
struct WriterMode {
  WriterMode() {
    // Runs before the tests are run (static initialisation); the parent never passes --writer.
    std::FILE* f = std::fopen("/proc/self/cmdline", "rb");
    if (f == nullptr) return;
    std::vector<std::string> args;
    std::string arg;
    for (int ch; (ch = std::fgetc(f)) != EOF;) {
      if (ch == '\0') {
        args.push_back(arg);
        arg.clear();
      } else {
        arg.push_back(static_cast<char>(ch));
      }
    }
    std::fclose(f);
    if (args.size() == 4 && args[1] == "--writer")
      std::exit(writer_main(args[2], std::stoi(args[3])));
  }
};
}  // namespace

KV_TEST(concurrent_writers_of_one_key_processes) {
  // Several processes (each with its own engine) store the same keys at once.
  TempDir dir;
  constexpr int kProcesses = 4, kKeys = 50;
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  CHECK(n > 0);
  self[n] = '\0';
  const std::string keys = std::to_string(kKeys);
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcesses; ++p) {
    std::vector<std::string> args{self, "--writer", dir.path(), keys};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    CHECK_EQ(::posix_spawn(&pid, self, nullptr, nullptr, argv.data(), environ), 0);
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    CHECK_EQ(::waitpid(pid, &status, 0), pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "a writer process failed (status " + std::to_string(status) + ")");
  }
  CHECK(kvtest::tmp_files_below(dir.path()).empty());
  Engine engine(kvtest::engine_config(dir, ODirectMode::kAuto));
  const auto bytes = kvtest::pattern(100000, 44);
  std::vector<unsigned char> back(bytes.size());
  for (int k = 0; k < kKeys; ++k) {
    const Completion l =
        kvtest::load(engine, k, dir / ("k/" + std::to_string(k)), "same", back.data(), back.size());
    CHECK_MSG(l.success, describe(l));
    CHECK(back == bytes);
  }
}

static const WriterMode kWriterMode;

namespace {

ino_t inode_of(const std::string& path) {
  struct stat st{};
  CHECK_EQ(::lstat(path.c_str(), &st), 0);
  return st.st_ino;
}

// Evicts the block file at `path` keeping it for reuse; returns the path it was renamed to.
std::string recycle_one(const TempDir& dir, const std::string& path, std::uint64_t file_size) {
  struct stat st{};
  CHECK_EQ(::lstat(path.c_str(), &st), 0);
  const kvtier::UnlinkedFiles done =
      kvtier::unlink_unchanged_files(dir.path(), {path}, {st.st_mtim}, false, {file_size, 1, ""});
  CHECK_EQ(done.error, 0);
  CHECK_EQ(done.outcomes.size(), std::size_t{1});
  CHECK_EQ(done.outcomes[0], kvtier::kRecycledFile);
  CHECK_EQ(done.recycled.size(), std::size_t{1});
  CHECK(!kvtest::file_exists(path));
  CHECK_EQ(inode_of(done.recycled[0]), st.st_ino);
  return done.recycled[0];
}

}  // namespace

KV_TEST(a_store_overwrites_the_file_eviction_kept_for_it) {
  // Eviction renames a block file to a tmp name instead of unlinking it; a store that names
  // it (BlockOp::recycle) writes into that very inode, under its own key and path, and every
  // byte of it is the new block's. A file kept for reuse that does not fit the store (another
  // size) or is gone is no failure: the store creates a new file, and the kept one is removed.
  TempDir dir;
  const std::size_t length = 3 * 4096 + 100;  // a partial last page: padded on every path
  const std::uint64_t file_size = kvtier::kHeaderSize + kvtier::align_up(length);
  int job = 0;
  for (ODirectMode mode : o_direct_modes(dir)) {
    EngineConfig config = kvtest::engine_config(dir, mode);
    config.set_checksum(kvtier::Checksum::kCrc32c);
    config.set_file_mode(0640);
    Engine engine(config);
    const std::string sub = dir / name(mode);
    const auto old_bytes = kvtest::pattern(length, 1);
    const auto new_bytes = kvtest::pattern(length, 2);
    CHECK(kvtest::store(engine, ++job, sub + "/a/old", "old", old_bytes.data(), length).success);
    CHECK_EQ(::chmod((sub + "/a/old").c_str(), 0600), 0);  // the store makes file_mode exact
    const ino_t old_inode = inode_of(sub + "/a/old");
    const std::string spare = recycle_one(dir, sub + "/a/old", file_size);

    kvtier::BlockOp op =
        kvtest::block(sub + "/b/new", "new", const_cast<unsigned char*>(new_bytes.data()), length);
    op.recycle = spare;
    const Completion s = kvtest::run_job(engine, ++job, Direction::kStore, {op});
    CHECK_MSG(s.success, describe(s));
    CHECK_EQ(s.bytes, std::uint64_t{length});
    CHECK_EQ(inode_of(sub + "/b/new"), old_inode);
    CHECK(!kvtest::file_exists(spare));
    struct stat st{};
    CHECK_EQ(::stat((sub + "/b/new").c_str(), &st), 0);
    CHECK_EQ(st.st_mode & 07777, mode_t{0640});
    CHECK_EQ(static_cast<std::uint64_t>(st.st_size), file_size);
    Memory back(length, 0);
    const Completion l = kvtest::load(engine, ++job, sub + "/b/new", "new", back.data(), length);
    CHECK_MSG(l.success, describe(l));
    CHECK(back.equals(new_bytes));

    // A kept file of another size: removed, and the store writes a new file.
    const auto small = kvtest::pattern(100, 3);
    CHECK(kvtest::store(engine, ++job, sub + "/a/small", "small", small.data(), 100).success);
    const ino_t small_inode = inode_of(sub + "/a/small");
    // Held open, so that its inode number cannot be given to the new file once it is removed.
    const int held = ::open((sub + "/a/small").c_str(), O_RDONLY | O_CLOEXEC);
    CHECK(held >= 0);
    const std::string odd = recycle_one(dir, sub + "/a/small", kvtier::kHeaderSize + 4096);
    op = kvtest::block(sub + "/b/other", "other", const_cast<unsigned char*>(new_bytes.data()),
                       length);
    op.recycle = odd;
    const Completion s2 = kvtest::run_job(engine, ++job, Direction::kStore, {op});
    CHECK_MSG(s2.success, describe(s2));
    CHECK(inode_of(sub + "/b/other") != small_inode);
    CHECK(!kvtest::file_exists(odd));
    struct stat gone{};
    CHECK(::fstat(held, &gone) == 0 && gone.st_nlink == 0);  // removed, not left behind
    ::close(held);

    // A kept file that is gone already (a sweep removed it): a new file.
    op = kvtest::block(sub + "/b/third", "third", const_cast<unsigned char*>(new_bytes.data()),
                       length);
    op.recycle = sub + "/a/none.tmp";
    const Completion s3 = kvtest::run_job(engine, ++job, Direction::kStore, {op});
    CHECK_MSG(s3.success, describe(s3));

    // A store that finds its block there already (a dedup) removes the kept file too.
    CHECK(kvtest::store(engine, ++job, sub + "/a/old2", "old2", old_bytes.data(), length).success);
    const std::string spare2 = recycle_one(dir, sub + "/a/old2", file_size);
    op = kvtest::block(sub + "/b/new", "new", const_cast<unsigned char*>(new_bytes.data()), length);
    op.recycle = spare2;
    const Completion s4 = kvtest::run_job(engine, ++job, Direction::kStore, {op});
    CHECK_MSG(s4.success && s4.bytes == 0, describe(s4));  // a dedup moves no bytes
    CHECK(!kvtest::file_exists(spare2));
    CHECK(kvtest::tmp_files_below(dir.path()).empty());

    // A FIFO put at a kept file's name (by anyone who may write the directory) is removed and
    // the store writes a new file: it never waits for a reader that does not come.
    const std::string fifo = sub + "/a/fifo.kvb.h.1.0000000000000000.1.tmp";
    CHECK_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    op = kvtest::block(sub + "/b/fifo", "fifo", const_cast<unsigned char*>(new_bytes.data()),
                       length);
    op.recycle = fifo;
    const Completion s5 = kvtest::run_job(engine, ++job, Direction::kStore, {op});
    CHECK_MSG(s5.success, describe(s5));
    CHECK(!kvtest::file_exists(fifo));
    CHECK(kvtest::tmp_files_below(dir.path()).empty());

    // A kept file whose directory cannot be opened (here a link on the way, never followed)
    // may still be there, where the store cannot remove it: the block fails, naming the
    // error, and the file is left for the caller to remove.
    std::filesystem::create_directories(sub + "/real");
    const std::string behind = sub + "/real/x.kvb.h.1.0000000000000000.2.tmp";
    std::ofstream(behind) << "kept";
    std::filesystem::create_directory_symlink(sub + "/real", sub + "/link");
    op = kvtest::block(sub + "/b/linked", "linked", const_cast<unsigned char*>(new_bytes.data()),
                       length);
    op.recycle = sub + "/link/x.kvb.h.1.0000000000000000.2.tmp";
    const Completion s6 = kvtest::run_job(engine, ++job, Direction::kStore, {op});
    CHECK_MSG(!s6.success && s6.block_errnos[0] == ELOOP, describe(s6));
    CHECK(kvtest::file_exists(behind) && !kvtest::file_exists(sub + "/b/linked"));
    std::filesystem::remove_all(sub + "/real");
    std::filesystem::remove(sub + "/link");

    // Only a file kept under a tmp name is taken: a block file named by mistake is refused
    // before anything is queued, and left alone.
    kvtier::BlockOp misnamed =
        kvtest::block(sub + "/b/x", "x", const_cast<unsigned char*>(new_bytes.data()), length);
    misnamed.recycle = sub + "/b/new";
    CHECK_THROWS(std::invalid_argument, engine.submit(++job, Direction::kStore, {misnamed}));
    CHECK(kvtest::file_exists(sub + "/b/new"));

    // Only a store recycles: a load that names a file is refused before anything is queued.
    Memory sink(length, 0);
    kvtier::BlockOp bad = kvtest::block(sub + "/b/new", "new", sink.data(), length);
    bad.recycle = sub + "/a/x.tmp";
    CHECK_THROWS(std::invalid_argument, engine.submit(++job, Direction::kLoad, {bad}));
  }
}

KV_TEST(eviction_keeps_only_files_a_store_can_take_whole) {
  // Of the files eviction would unlink, it keeps (renames) at most max_files, and only
  // regular files of exactly file_size bytes with one link owned by this user, below the
  // directory asked for; the others go.
  TempDir dir;
  const std::uint64_t size = 8192;
  auto make = [&](const std::string& rel, std::uint64_t bytes) {
    const std::string path = dir / rel;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << std::string(bytes, 'x');
    return path;
  };
  const std::string fits1 = make("d/fits1", size), fits2 = make("d/fits2", size),
                    fits3 = make("d/fits3", size), other = make("d/other", size + 1),
                    linked = make("d/linked", size), foreign = make("d/foreign", size),
                    outside = make("e/outside", size);
  CHECK_EQ(::link(linked.c_str(), (dir / "d/second-link").c_str()), 0);
  CHECK_EQ(::chown(foreign.c_str(), 65534, 65534), 0);
  std::vector<std::string> paths{outside, other, linked, foreign, fits1, fits2, fits3};
  std::vector<timespec> mtimes;
  for (const auto& p : paths) {
    struct stat st{};
    CHECK_EQ(::lstat(p.c_str(), &st), 0);
    mtimes.push_back(st.st_mtim);
  }
  const kvtier::UnlinkedFiles done =
      kvtier::unlink_unchanged_files(dir.path(), paths, mtimes, false, {size, 2, dir / "d"});
  CHECK_EQ(done.error, 0);
  const std::vector<std::int64_t> expected{
      std::int64_t(size),    std::int64_t(size + 1), std::int64_t(size), std::int64_t(size),
      kvtier::kRecycledFile, kvtier::kRecycledFile,  std::int64_t(size)};
  CHECK(done.outcomes == expected);
  CHECK_EQ(done.recycled.size(), std::size_t{2});
  for (const auto& p : paths) CHECK(!kvtest::file_exists(p));
  for (const auto& spare : done.recycled) {
    CHECK_EQ(kvtest::file_size(spare), off_t(size));
    CHECK_EQ(std::filesystem::path(spare).parent_path().string(), dir / "d");
    CHECK(std::filesystem::path(spare).filename().string().size() > 6);
  }
  CHECK_EQ(kvtest::tmp_files_below(dir.path()).size(), std::size_t{2});
  // Nothing kept in a dry run, and nothing without a root to find the directory from.
  const std::string more = make("d/more", size);
  struct stat st{};
  CHECK_EQ(::lstat(more.c_str(), &st), 0);
  const kvtier::UnlinkedFiles dry =
      kvtier::unlink_unchanged_files(dir.path(), {more}, {st.st_mtim}, true, {size, 1, ""});
  CHECK(dry.recycled.empty() && dry.outcomes == std::vector<std::int64_t>{std::int64_t(size)});
  const kvtier::UnlinkedFiles unrooted =
      kvtier::unlink_unchanged_files("", {more}, {st.st_mtim}, false, {size, 1, ""});
  CHECK(unrooted.recycled.empty() && !kvtest::file_exists(more));
}

namespace {

// Whether some thread of this process waits in a userfaultfd fault (a Gate holds it).
bool a_thread_waits_on_a_gate() {
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream wchan(task.path() / "wchan");
    std::string where;
    if (std::getline(wchan, where) && where == "handle_userfault") return true;
  }
  return false;
}

}  // namespace

KV_TEST(a_load_that_reads_a_file_recycled_under_it_fails_its_checksum) {
  // What recycling risks, on the engine's own load path: a load opened a block's file and
  // read its header; before it reads the payload, eviction keeps the file and a store
  // overwrites it with another block. The load then holds this block's header (its CRC) and
  // the other block's payload: a failed block, never wrong bytes, and the other block's file,
  // now at another path, is left alone. The psync engine fails the checksum (EBADMSG);
  // io_uring reruns a block that fails its checks through the psync code, whose open then
  // finds no file at the path (ENOENT): a miss either way.
  TempDir dir;
  EngineConfig config = kvtest::gated_config(dir, ODirectMode::kOff, 1, 1);
  config.set_checksum(kvtier::Checksum::kCrc32c);
  Engine engine(config);
  const std::size_t length = 8 * 4096;
  const std::uint64_t file_size = kvtier::kHeaderSize + length;
  const auto old_bytes = kvtest::pattern(length, 5);
  const auto new_bytes = kvtest::pattern(length, 6);
  const std::string old_path = dir / "a/old", new_path = dir / "b/new";
  CHECK(kvtest::store(engine, 1, old_path, "old", old_bytes.data(), length).success);

  kvtest::Gate gate(dir / "gate");                  // after the engine (see Gate)
  kvtier::BlockOp load = gate.op(nullptr, length);  // the destination is the gated memory
  load.path = old_path;
  load.key = "old";
  engine.submit(2, Direction::kLoad, {load});
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!a_thread_waits_on_a_gate()) {
    CHECK_MSG(std::chrono::steady_clock::now() < until, "the load never reached the gate");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::string spare = recycle_one(dir, old_path, file_size);
  kvtier::BlockOp store =
      kvtest::block(new_path, "new", const_cast<unsigned char*>(new_bytes.data()), length);
  store.recycle = spare;
  const Completion stored = kvtest::run_job(engine, 3, Direction::kStore, {store});
  CHECK_MSG(stored.success, describe(stored));
  gate.release();
  std::vector<Completion> out;
  kvtest::pop_exactly(engine, 1, out);
  const Completion& l = out[0];
  std::printf("  the torn load: %s\n", describe(l).c_str());
  CHECK(!l.success);
  CHECK_MSG(l.block_errnos[0] == EBADMSG || l.block_errnos[0] == ENOENT, describe(l));
  CHECK(!kvtest::file_exists(old_path));
  Memory back(length, 0);
  const Completion again = kvtest::load(engine, 4, new_path, "new", back.data(), length);
  CHECK_MSG(again.success, describe(again));
  CHECK(back.equals(new_bytes));
}
