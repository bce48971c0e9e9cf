// The CRC32C in the deadline's copy (io_timeout_s > 0): a store's payload CRC is taken while
// the payload is copied into the worker's arena, a load's while it is copied out of it
// (io/owned_payload.hpp, engine/worker.cpp). These tests pin the contract: a damaged payload
// still fails its load with the checksum error and its file goes, for every layout of host
// memory, O_DIRECT on and off, alone and inside a batch; blocks written under a deadline and
// without one are the same files (docs/FORMAT.md); checksum "none" stays a plain copy; and
// the arena is huge-page memory. Run once per I/O engine (tests/cpp/CMakeLists.txt).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "device/aligned_buffer.hpp"
#include "engine/settings.hpp"
#include "engine_helpers.hpp"
#include "io/owned_payload.hpp"
#include "io/worker_context.hpp"

namespace {

using kvtest::describe;
using kvtest::flip_byte;
using kvtest::Memory;
using kvtest::TempDir;
using kvtier::BlockOp;
using kvtier::Checksum;
using kvtier::Completion;
using kvtier::Direction;
using kvtier::Engine;
using kvtier::EngineConfig;
using kvtier::ODirectMode;
using kvtier::Segment;

constexpr std::size_t k2MiB = std::size_t{2} << 20;

std::vector<unsigned char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

std::uint32_t u32_at(const std::vector<unsigned char>& b, std::size_t at) {
  return static_cast<std::uint32_t>(b.at(at)) | static_cast<std::uint32_t>(b.at(at + 1)) << 8 |
         static_cast<std::uint32_t>(b.at(at + 2)) << 16 |
         static_cast<std::uint32_t>(b.at(at + 3)) << 24;
}

EngineConfig config_for(const TempDir& dir, ODirectMode mode, double io_timeout_s,
                        Checksum checksum = Checksum::kCrc32c) {
  EngineConfig c = kvtest::engine_config(dir, mode);
  c.set_io_timeout_s(io_timeout_s);
  c.set_checksum(checksum);
  return c;
}

// A block's payload in the caller's memory: contiguous, or host segments of uneven lengths
// (as a per-layer layout gives them), each at its own misalignment.
struct Payload {
  std::vector<std::unique_ptr<Memory>> pieces;
  std::size_t length = 0;

  Payload(std::size_t n, bool segmented) : length(n) {
    if (!segmented) {
      pieces.push_back(std::make_unique<Memory>(n, 0));
      return;
    }
    const std::size_t a = n / 3 + (n > 64 ? 5 : 0), b = n / 2;  // uneven, never past n
    for (std::size_t len : {a, b, n - a - b})
      pieces.push_back(std::make_unique<Memory>(len, 8 * pieces.size()));
  }
  BlockOp op(const std::string& path, const std::string& key) const {
    BlockOp op;
    op.path = path;
    op.key = key;
    if (pieces.size() == 1) {
      op.data = pieces[0]->data();
      op.length = length;
    } else {
      for (const auto& m : pieces) op.segments.push_back(Segment{m->data(), m->size()});
    }
    return op;
  }
  void fill(const std::vector<unsigned char>& bytes) {
    std::size_t at = 0;
    for (auto& m : pieces) {
      if (m->size() > 0) std::memcpy(m->data(), bytes.data() + at, m->size());
      at += m->size();
    }
  }
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> out;
    for (const auto& m : pieces) out.insert(out.end(), m->data(), m->data() + m->size());
    return out;
  }
};

Completion run(Engine& engine, kvtier::JobId id, Direction dir, std::vector<BlockOp> ops) {
  return kvtest::run_job(engine, id, dir, std::move(ops));
}

// Stores one block under a deadline, flips the payload byte at `at` on disk, and loads it
// under a deadline: the load must fail with the checksum failure (EBADMSG "verify"), the file
// must be gone and counted, exactly as without the fused copy.
void expect_checksum_failure(ODirectMode mode, std::size_t length, bool segmented, off_t at) {
  TempDir dir;
  const EngineConfig config = config_for(dir, mode, 10);
  const std::string path = dir / "blk";
  const auto bytes = kvtest::pattern(length, 91);
  Engine engine(config);
  Payload src(length, segmented);
  src.fill(bytes);
  const Completion s = run(engine, 1, Direction::kStore, {src.op(path, "key")});
  CHECK_MSG(s.success, describe(s));
  flip_byte(path, static_cast<off_t>(kvtier::kHeaderSize) + at);
  Payload back(length, segmented);
  const Completion l = run(engine, 2, Direction::kLoad, {back.op(path, "key")});
  const std::string what = "length " + std::to_string(length) + (segmented ? " segments" : "") +
                           " o_direct " + kvtier::to_string(mode) + " byte " + std::to_string(at);
  CHECK_MSG(!l.success, what + ": a damaged block was loaded");
  CHECK_EQ(l.block_errnos.size(), std::size_t{1});
  CHECK_EQ(l.block_errnos[0], EBADMSG);
  CHECK_EQ(l.error.errno_value, EBADMSG);
  CHECK_EQ(l.error.operation, std::string("verify"));
  CHECK_EQ(l.error.path, path);
  CHECK_MSG(l.error.message.find("checksum") != std::string::npos, l.error.message);
  CHECK_EQ(l.bytes, std::uint64_t{0});
  CHECK_MSG(!kvtest::file_exists(path), what + ": the bad file was not removed");
  const auto st = engine.stats();
  CHECK_EQ(st.corrupt_files_removed, std::uint64_t{1});
  CHECK_EQ(st.failed_load_blocks, std::uint64_t{1});
  CHECK_EQ(st.failed_load_jobs, std::uint64_t{1});
  CHECK_EQ(st.load_blocks, std::uint64_t{0});
  const Completion again = run(engine, 3, Direction::kLoad, {back.op(path, "key")});
  CHECK_EQ(again.error.errno_value, ENOENT);
}

KV_TEST(a_flipped_payload_byte_fails_the_load_under_a_deadline) {
  for (ODirectMode mode : {ODirectMode::kOff, ODirectMode::kAuto})
    for (bool segmented : {false, true})
      for (std::size_t length : {std::size_t{10000}, k2MiB}) {
        const off_t last = static_cast<off_t>(length - 1);
        for (off_t at : {off_t{0}, static_cast<off_t>(length / 2), last})
          expect_checksum_failure(mode, length, segmented, at);
      }
}

// One job of eight blocks (one io_uring batch) with one block damaged: that block alone
// fails; the others arrive intact.
KV_TEST(one_damaged_block_of_a_batch_fails_alone) {
  for (ODirectMode mode : {ODirectMode::kOff, ODirectMode::kAuto}) {
    TempDir dir;
    Engine engine(config_for(dir, mode, 10));
    constexpr std::size_t kBlocks = 8, kLength = 256 * 1024 + 100;
    std::vector<std::vector<unsigned char>> bytes;
    std::vector<std::unique_ptr<Memory>> src, back;
    std::vector<BlockOp> stores, loads;
    for (std::size_t i = 0; i < kBlocks; ++i) {
      bytes.push_back(kvtest::pattern(kLength, static_cast<std::uint32_t>(100 + i)));
      src.push_back(std::make_unique<Memory>(kLength, 0));
      src.back()->fill(bytes.back());
      back.push_back(std::make_unique<Memory>(kLength, 0));
      const std::string path = dir / ("b" + std::to_string(i));
      stores.push_back(kvtest::block(path, "k" + std::to_string(i), src.back()->data(), kLength));
      loads.push_back(kvtest::block(path, "k" + std::to_string(i), back.back()->data(), kLength));
    }
    const Completion s = run(engine, 1, Direction::kStore, stores);
    CHECK_MSG(s.success, describe(s));
    flip_byte(dir / "b5", static_cast<off_t>(kvtier::kHeaderSize + 12345));
    const Completion l = run(engine, 2, Direction::kLoad, loads);
    CHECK(!l.success);
    CHECK_EQ(l.block_errnos.size(), kBlocks);
    for (std::size_t i = 0; i < kBlocks; ++i) {
      CHECK_EQ(l.block_errnos[i], i == 5 ? EBADMSG : 0);
      if (i != 5) CHECK_MSG(back[i]->equals(bytes[i]), "block " + std::to_string(i));
    }
    CHECK_EQ(l.error.operation, std::string("verify"));
    CHECK(!kvtest::file_exists(dir / "b5"));
    CHECK(kvtest::file_exists(dir / "b4"));
    const auto st = engine.stats();
    CHECK_EQ(st.corrupt_files_removed, std::uint64_t{1});
    CHECK_EQ(st.failed_load_blocks, std::uint64_t{1});
    CHECK_EQ(st.load_blocks, std::uint64_t{kBlocks - 1});
  }
}

// Blocks stored under a deadline (CRC taken in the copy) and without one (CRC taken over the
// caller's memory) are the same file byte for byte, and each path loads the other's.
KV_TEST(blocks_cross_between_the_deadline_and_the_direct_path) {
  for (ODirectMode mode : {ODirectMode::kOff, ODirectMode::kAuto})
    for (bool segmented : {false, true})
      for (std::size_t length : {std::size_t{10000}, k2MiB}) {
        TempDir dir;
        const auto bytes = kvtest::pattern(length, 7);
        Payload src(length, segmented);
        src.fill(bytes);
        {
          Engine owned(config_for(dir, mode, 10));
          CHECK(run(owned, 1, Direction::kStore, {src.op(dir / "owned", "key")}).success);
        }
        {
          Engine direct(config_for(dir, mode, 0));
          CHECK(run(direct, 1, Direction::kStore, {src.op(dir / "direct", "key")}).success);
        }
        const auto a = file_bytes(dir / "owned"), b = file_bytes(dir / "direct");
        CHECK_MSG(a == b, "the two paths wrote different files");
        CHECK_EQ(u32_at(a, 24), std::uint32_t{1});  // checksum_kind: CRC32C
        CHECK_EQ(u32_at(a, 28), kvtier::crc32c(bytes.data(), bytes.size()));
        for (double timeout : {0.0, 10.0}) {
          Engine engine(config_for(dir, mode, timeout));
          for (const char* name : {"owned", "direct"}) {
            Payload back(length, segmented);
            const Completion l = run(engine, 2, Direction::kLoad, {back.op(dir / name, "key")});
            CHECK_MSG(l.success, describe(l));
            CHECK_MSG(back.bytes() == bytes, std::string(name) + " read back wrong");
          }
        }
      }
}

// checksum "none" under a deadline: a plain copy both ways, a header without a CRC, and a
// damaged payload is (as documented) loaded as it is.
KV_TEST(checksum_none_is_a_plain_copy_under_a_deadline) {
  for (ODirectMode mode : {ODirectMode::kOff, ODirectMode::kAuto}) {
    TempDir dir;
    const std::size_t length = k2MiB + 300;
    const auto bytes = kvtest::pattern(length, 3);
    Engine engine(config_for(dir, mode, 10, Checksum::kNone));
    Payload src(length, true);
    src.fill(bytes);
    CHECK(run(engine, 1, Direction::kStore, {src.op(dir / "blk", "key")}).success);
    const auto file = file_bytes(dir / "blk");
    CHECK_EQ(u32_at(file, 24), std::uint32_t{0});
    CHECK_EQ(u32_at(file, 28), std::uint32_t{0});
    Payload back(length, false);
    Completion l = run(engine, 2, Direction::kLoad, {back.op(dir / "blk", "key")});
    CHECK_MSG(l.success, describe(l));
    CHECK(back.bytes() == bytes);
    flip_byte(dir / "blk", static_cast<off_t>(kvtier::kHeaderSize + 77));
    l = run(engine, 3, Direction::kLoad, {back.op(dir / "blk", "key")});
    CHECK_MSG(l.success, describe(l));
    auto expected = bytes;
    expected[77] ^= 0x01;
    CHECK(back.bytes() == expected);
    CHECK_EQ(engine.stats().corrupt_files_removed, std::uint64_t{0});
  }
}

// ---- the copy steps and the arena, directly -------------------------------------------

using kvtier::detail::AlignedBuffer;
using kvtier::detail::kHugePageSize;
using kvtier::detail::OwnedPayloads;

std::string smaps_line(const void* p, const char* field) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  while (std::getline(in, line)) {
    unsigned long long start = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> start >> dash >> end && dash == '-') {
      inside = start <= at && at < end;
      continue;
    }
    if (inside && line.rfind(field, 0) == 0) return line;
  }
  return {};
}

struct Context {
  kvtier::detail::EngineSettings settings;
  kvtier::detail::IoContext io;
  Context() { io.config = &settings; }
};

KV_TEST(the_copy_steps_take_the_crc_of_what_they_copy) {
  Context c;
  kvtier::detail::WorkerContext worker(c.io);
  for (bool segmented : {false, true})
    for (std::size_t length : {std::size_t{0}, std::size_t{1}, std::size_t{4097}, k2MiB + 13}) {
      const auto bytes = kvtest::pattern(length, 11);
      Payload src(length, segmented);
      if (length > 0) src.fill(bytes);
      const BlockOp op = src.op("/x", "k");
      CHECK(kvtier::detail::payload_in_host_memory(op));
      AlignedBuffer owned(length + kvtier::kAlignment);
      std::memset(owned.data(), 0xAB, owned.size());
      std::uint32_t crc = 0xDEADBEEF;
      CHECK(!kvtier::detail::copy_into_owned(c.io, worker, op, owned.data(), nullptr, &crc));
      CHECK_EQ(crc, kvtier::crc32c(bytes.data(), length));
      CHECK(length == 0 || std::memcmp(owned.data(), bytes.data(), length) == 0);
      for (std::size_t i = length; i < kvtier::align_up(length); ++i)
        CHECK_EQ(owned.data()[i], 0);  // the page's rest goes to the file as zeros
      Payload back(length, segmented);
      const BlockOp out = back.op("/x", "k");
      crc = 0xDEADBEEF;
      CHECK(!kvtier::detail::copy_out_of_owned(c.io, worker, out, owned.data(), nullptr, &crc));
      CHECK_EQ(crc, kvtier::crc32c(bytes.data(), length));
      CHECK(back.bytes() == bytes);
      if (length > 0) {  // a changed byte changes the CRC the copy out reports
        owned.data()[length - 1] ^= 0x80;
        CHECK(!kvtier::detail::copy_out_of_owned(c.io, worker, out, owned.data(), nullptr, &crc));
        CHECK(crc != kvtier::crc32c(bytes.data(), length));
      }
    }
}

KV_TEST(the_arena_is_whole_huge_pages_with_2_mib_payloads_on_huge_page_boundaries) {
  Context c;
  OwnedPayloads owned;
  std::vector<unsigned char> scratch(k2MiB);
  std::vector<BlockOp> ops(kvtier::detail::kMaxBatchBlocks);
  const BlockOp* ptrs[kvtier::detail::kMaxBatchBlocks];
  // Small blocks first, then a batch of 2 MiB blocks that makes the arena grow.
  for (std::size_t length : {std::size_t{256 * 1024}, k2MiB}) {
    for (std::size_t i = 0; i < ops.size(); ++i) {
      ops[i] = kvtest::block("/b" + std::to_string(i), "k", scratch.data(), length);
      ptrs[i] = &ops[i];
    }
    owned.prepare(c.io, ptrs, ops.size());
    const AlignedBuffer& arena = owned.arena();
    CHECK(arena.huge_pages());
    CHECK_EQ(arena.size() % kHugePageSize, std::size_t{0});
    CHECK_EQ(reinterpret_cast<std::uintptr_t>(arena.data()) % kHugePageSize, std::uintptr_t{0});
    CHECK(arena.size() >= ops.size() * length);
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const auto offset = static_cast<std::size_t>(owned.payload(i) - arena.data());
      CHECK_EQ(offset, i * length);
      if (length == k2MiB) CHECK_EQ(offset % kHugePageSize, std::size_t{0});
    }
    // MADV_HUGEPAGE shows as "hg" in VmFlags wherever the kernel has THP; whether it granted
    // huge pages depends on free contiguous memory, so AnonHugePages is shown, not required.
    const std::string flags = smaps_line(arena.data(), "VmFlags:");
    std::printf("  %zu KiB blocks: arena %zu MiB, %s; %s\n", length / 1024, arena.size() >> 20,
                smaps_line(arena.data(), "AnonHugePages:").c_str(), flags.c_str());
    if (std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"))
      CHECK_MSG(flags.find(" hg") != std::string::npos, flags);
  }
}

}  // namespace
