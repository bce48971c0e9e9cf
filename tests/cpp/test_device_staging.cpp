// The staged device path (SegmentCopier, pinned staging buffers, stream events) driven through
// the Engine against the CUDA stand-in runtime (tests/cuda_standin/fake_cudart.cpp), which the
// core loads through $KVTIER_CUDART exactly as it loads a real libcudart. CMake sets that
// variable, $KVTIER_FAKE_CUDA_DEVICES=2 and, for the per-run variant, a runtime version
// without cudaMemcpyBatchAsync. The sanitizer builds (.ci/cpp-sanitizers.sh) run this file
// too, with the stand-in built under the same sanitizer: stream threads, worker threads and
// submitters all touch the same memory here.
//
// "Device memory" in the stand-in is host memory; its streams are threads, so the ordering
// checks below are real concurrency: a fake kernel sleeps, then writes or reads a block.
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "engine_helpers.hpp"
#include "io/ring.hpp"

namespace {

using kvtest::TempDir;
using kvtier::BlockOp;
using kvtier::Completion;
using kvtier::Direction;
using kvtier::Engine;
using kvtier::EngineConfig;
using kvtier::MemoryKind;
using kvtier::Segment;

// The stand-in's test controls and the few runtime calls a "caller" makes, resolved from the
// very library instance the core loaded (same path: dlopen returns the same handle).
struct Standin {
  void (*fail)(const char*, long, int);
  long (*calls)(const char*);
  long (*registered_bytes)();
  long (*pageable_copies)();
  int (*kernel)(void*, int, void*, int, std::size_t);
  int (*read_kernel)(void*, int, void*, const void*, std::size_t);
  int (*stream_create)(void**, unsigned);
  int (*stream_destroy)(void*);
  int (*stream_synchronize)(void*);
  int (*set_device)(int);
  int (*get_device)(int*);

  static const Standin& get() {
    static const Standin instance = load();
    return instance;
  }

  int current_device() const {
    int d = -1;
    if (get_device(&d) != 0) throw std::runtime_error("cudaGetDevice failed");
    return d;
  }

 private:
  template <typename T>
  static void resolve(void* handle, const char* name, T& out) {
    out = reinterpret_cast<T>(::dlsym(handle, name));
    if (out == nullptr) throw std::runtime_error(std::string("the stand-in lacks ") + name);
  }
  static Standin load() {
    const char* path = std::getenv("KVTIER_CUDART");
    if (path == nullptr || *path == '\0')
      throw std::runtime_error("KVTIER_CUDART is not set (ctest sets it to the stand-in)");
    void* handle = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) throw std::runtime_error(std::string("dlopen: ") + ::dlerror());
    Standin s{};
    resolve(handle, "kvtier_fake_fail", s.fail);
    resolve(handle, "kvtier_fake_calls", s.calls);
    resolve(handle, "kvtier_fake_registered_bytes", s.registered_bytes);
    resolve(handle, "kvtier_fake_pageable_copies", s.pageable_copies);
    resolve(handle, "kvtier_fake_kernel", s.kernel);
    resolve(handle, "kvtier_fake_read_kernel", s.read_kernel);
    resolve(handle, "cudaStreamCreateWithFlags", s.stream_create);
    resolve(handle, "cudaStreamDestroy", s.stream_destroy);
    resolve(handle, "cudaStreamSynchronize", s.stream_synchronize);
    resolve(handle, "cudaSetDevice", s.set_device);
    resolve(handle, "cudaGetDevice", s.get_device);
    return s;
  }
};

// A caller's stream on the calling thread's current device: a created one, or (legacy) that
// device's legacy default stream. At scope exit it waits for the fake kernels queued on it,
// so a failed check cannot leave one writing into memory the test is about to free: declare
// it after the buffers its kernels touch.
class CallerStream {
 public:
  explicit CallerStream(bool legacy = false) : legacy_(legacy) {
    const Standin& fake = Standin::get();
    device_ = fake.current_device();
    if (!legacy_ && fake.stream_create(&stream_, 1) != 0)
      throw std::runtime_error("cudaStreamCreateWithFlags failed");
  }
  ~CallerStream() {
    const Standin& fake = Standin::get();
    int current = 0;
    fake.get_device(&current);
    fake.set_device(device_);  // a null stream names the current device's legacy stream
    fake.stream_synchronize(stream_);
    fake.set_device(current);
    if (!legacy_) fake.stream_destroy(stream_);
  }
  CallerStream(const CallerStream&) = delete;
  CallerStream& operator=(const CallerStream&) = delete;
  void* get() const noexcept { return stream_; }

 private:
  bool legacy_;
  int device_ = 0;
  void* stream_ = nullptr;
};

bool batch_runtime() {
  const char* v = std::getenv("KVTIER_FAKE_CUDART_VERSION");
  return v == nullptr || std::atoi(v) >= 12080;  // the stand-in defaults to 13.0
}

// KV memory like an engine's: two device "layers" of [2, blocks, kRun] (K and V runs per
// block) and one host layer of [blocks, kHostRun]. A block is 5 segments, 13,004 bytes: two
// pieces through 8192-byte staging buffers, each spanning several runs (batched copies).
class Kv {
 public:
  static constexpr std::size_t kRun = 3001;  // odd: pieces straddle runs
  static constexpr std::size_t kHostRun = 1000;

  explicit Kv(std::size_t blocks, std::uint32_t seed = 1)
      : blocks_(blocks),
        a_(kvtest::pattern(2 * blocks * kRun, seed)),
        b_(kvtest::pattern(2 * blocks * kRun, seed + 1)),
        host_(kvtest::pattern(blocks * kHostRun, seed + 2)) {}

  unsigned char* k_run(std::size_t b) { return a_.data() + b * kRun; }
  unsigned char* v_run(std::size_t b) { return a_.data() + (blocks_ + b) * kRun; }

  std::vector<Segment> segments(std::size_t b) {
    return {{k_run(b), kRun, MemoryKind::kDevice},
            {v_run(b), kRun, MemoryKind::kDevice},
            {host_.data() + b * kHostRun, kHostRun, MemoryKind::kHost},
            {b_.data() + b * kRun, kRun, MemoryKind::kDevice},
            {b_.data() + (blocks_ + b) * kRun, kRun, MemoryKind::kDevice}};
  }

  std::vector<unsigned char> bytes(std::size_t b) {
    std::vector<unsigned char> out;
    for (const Segment& s : segments(b)) {
      const auto* p = static_cast<const unsigned char*>(s.address);
      out.insert(out.end(), p, p + s.length);
    }
    return out;
  }

  void zero(std::size_t b) {
    for (const Segment& s : segments(b)) std::memset(s.address, 0, s.length);
  }

 private:
  std::size_t blocks_;
  std::vector<unsigned char> a_, b_, host_;
};

// 8192-byte buffers move a block in two pieces (the psync path, on either engine); 32 KiB ones
// hold a block's whole file, which the io_uring engine then reads or writes as one
// registered buffer.
constexpr std::size_t kPieces = 8192, kWhole = 32768;

EngineConfig device_config(const TempDir& dir, int device = 0, unsigned readers = 2,
                           unsigned writers = 2, std::size_t buffer_bytes = kPieces) {
  EngineConfig c = kvtest::engine_config(dir, kvtier::ODirectMode::kOff, readers, writers);
  c.set_use_cuda(true);
  c.set_cuda_device(device);
  c.set_staging_buffer_bytes(buffer_bytes);
  c.set_staging_bytes_total(4 * buffer_bytes);
  return c;
}

// Counts the io_uring submission entries by opcode (through the ring's test seam).
struct Opcodes {
  Opcodes() { kvtier::detail::set_submit_filter(&count, this); }
  ~Opcodes() { kvtier::detail::set_submit_filter(nullptr, nullptr); }
  Opcodes(const Opcodes&) = delete;
  Opcodes& operator=(const Opcodes&) = delete;
  int operator[](unsigned opcode) const { return seen[opcode].load(); }

 private:
  static bool count(const io_uring_sqe& sqe, int&, void* arg) {
    static_cast<Opcodes*>(arg)->seen[sqe.opcode].fetch_add(1);
    return false;
  }
  std::atomic<int> seen[256] = {};
};

std::vector<BlockOp> ops(const TempDir& dir, Kv& kv, const std::vector<std::string>& names,
                         const std::vector<std::size_t>& blocks) {
  std::vector<BlockOp> out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    BlockOp op;
    op.path = dir / names[i];
    op.key = names[i];
    op.segments = kv.segments(blocks[i]);
    out.push_back(std::move(op));
  }
  return out;
}

Completion run(Engine& engine, kvtier::JobId id, Direction direction, std::vector<BlockOp> blocks,
               void* stream = nullptr) {
  engine.submit(id, direction, std::move(blocks), stream);
  std::vector<Completion> out;
  kvtest::pop_exactly(engine, 1, out);
  CHECK_EQ(out[0].job_id, id);
  return std::move(out[0]);
}

}  // namespace

KV_TEST(device_blocks_round_trip_through_pinned_staging) {
  const Standin& fake = Standin::get();
  TempDir dir;
  Kv kv(8, 3);
  const long pageable_before = fake.pageable_copies();
  const long copies_before = fake.calls("cudaMemcpyAsync") + fake.calls("cudaMemcpyBatchAsync");
  {
    // The staging pool moves device payloads without a deadline; with one they go through
    // the workers' own arenas (device_blocks_round_trip_through_the_workers_own_arenas).
    EngineConfig config = device_config(dir, 0, 3, 3);
    config.set_io_timeout_s(0);
    Engine engine(config);
    CHECK(engine.cuda_enabled());
    const std::vector<std::string> names{"b0", "b1", "b2", "b3"};
    const Completion s = run(engine, 1, Direction::kStore, ops(dir, kv, names, {0, 1, 2, 3}));
    CHECK_MSG(s.success, kvtest::describe(s));
    CHECK_EQ(s.bytes, std::uint64_t{4 * 13004});
    const long pinned = fake.registered_bytes();
    CHECK(pinned > 0 && pinned <= 4 * 8192);  // allocated on use, capped by the total
    for (std::size_t b = 4; b < 8; ++b) kv.zero(b);
    const Completion l = run(engine, 2, Direction::kLoad, ops(dir, kv, names, {7, 6, 5, 4}));
    CHECK_MSG(l.success, kvtest::describe(l));
    for (std::size_t b = 0; b < 4; ++b) CHECK(kv.bytes(7 - b) == kv.bytes(b));
    // The stored file is the payload, then zero padding to a page.
    CHECK_EQ(kvtest::file_size(dir / "b0"), off_t(4096 + 16384));
  }
  CHECK_EQ(fake.registered_bytes(), 0L);  // unpinned and freed at shutdown
  CHECK(fake.calls("cudaMemcpyAsync") + fake.calls("cudaMemcpyBatchAsync") > copies_before);
  CHECK_EQ(fake.pageable_copies(), pageable_before);  // every copy used pinned staging
  if (batch_runtime()) CHECK(fake.calls("cudaMemcpyBatchAsync") > 0);
}

// With io_timeout_s (the default), a device payload is copied whole into the worker's own
// pinned arena before a store's write and out of it after a load's claim, so an abandoned
// operation never reaches device memory; no copy is pageable, and the arenas are unpinned
// when the workers exit.
KV_TEST(device_blocks_round_trip_through_the_workers_own_arenas) {
  const Standin& fake = Standin::get();
  TempDir dir;
  Kv kv(8, 23);
  const long pageable_before = fake.pageable_copies();
  {
    Engine engine(device_config(dir, 0, 1, 1));
    CHECK(engine.config().io_timeout_s() > 0);
    const std::vector<std::string> names{"b0", "b1", "b2", "b3"};
    const Completion s = run(engine, 1, Direction::kStore, ops(dir, kv, names, {0, 1, 2, 3}));
    CHECK_MSG(s.success, kvtest::describe(s));
    CHECK(fake.registered_bytes() > 0);
    for (std::size_t b = 4; b < 8; ++b) kv.zero(b);
    const Completion l = run(engine, 2, Direction::kLoad, ops(dir, kv, names, {7, 6, 5, 4}));
    CHECK_MSG(l.success, kvtest::describe(l));
    for (std::size_t b = 0; b < 4; ++b) CHECK(kv.bytes(7 - b) == kv.bytes(b));
    CHECK_EQ(kvtest::file_size(dir / "b0"), off_t(4096 + 16384));
  }
  CHECK_EQ(fake.registered_bytes(), 0L);
  CHECK_EQ(fake.pageable_copies(), pageable_before);
}

// Under a deadline a device store's CRC32C is taken in the pinned arena after the CUDA copy
// (the header carries the CRC of exactly the bytes the segments held), and a device load is
// checked in the arena before any byte is copied to the device: a flipped payload byte fails
// it with the checksum error, the file goes, and the destination blocks keep what they held.
KV_TEST(device_blocks_under_a_deadline_carry_and_check_the_payload_crc) {
  TempDir dir;
  Kv kv(4, 31);
  Engine engine(device_config(dir, 0, 1, 1));
  CHECK(engine.config().io_timeout_s() > 0);
  const Completion s = run(engine, 1, Direction::kStore, ops(dir, kv, {"b0", "b1"}, {0, 1}));
  CHECK_MSG(s.success, kvtest::describe(s));
  const std::vector<unsigned char> b0 = kv.bytes(0);
  {
    std::FILE* f = std::fopen((dir / "b0").c_str(), "rb");
    CHECK(f != nullptr);
    unsigned char header[32];
    CHECK_EQ(std::fread(header, 1, sizeof header, f), sizeof header);
    std::fclose(f);
    std::uint32_t crc = 0;
    std::memcpy(&crc, header + 28, 4);  // payload_crc32c, little-endian (docs/FORMAT.md)
    CHECK_EQ(crc, kvtier::crc32c(b0.data(), b0.size()));
  }
  {  // the last byte of the first device run
    std::FILE* f = std::fopen((dir / "b1").c_str(), "r+b");
    CHECK(f != nullptr);
    CHECK_EQ(std::fseek(f, static_cast<long>(kvtier::kHeaderSize + Kv::kRun - 1), SEEK_SET), 0);
    const int c = std::fgetc(f);
    CHECK_EQ(std::fseek(f, static_cast<long>(kvtier::kHeaderSize + Kv::kRun - 1), SEEK_SET), 0);
    std::fputc(c ^ 0x10, f);
    std::fclose(f);
  }
  const std::vector<unsigned char> before = kv.bytes(3);
  const Completion bad = run(engine, 2, Direction::kLoad, ops(dir, kv, {"b1"}, {3}));
  CHECK(!bad.success);
  CHECK_EQ(bad.error.errno_value, EBADMSG);
  CHECK_EQ(bad.error.operation, std::string("verify"));
  CHECK(!kvtest::file_exists(dir / "b1"));
  CHECK_EQ(engine.stats().corrupt_files_removed, std::uint64_t{1});
  CHECK(kv.bytes(3) == before);
  kv.zero(2);
  const Completion good = run(engine, 3, Direction::kLoad, ops(dir, kv, {"b0"}, {2}));
  CHECK_MSG(good.success, kvtest::describe(good));
  CHECK(kv.bytes(2) == b0);
}

KV_TEST(device_blocks_that_fit_one_buffer_use_registered_buffers_on_io_uring) {
  const Standin& fake = Standin::get();
  TempDir dir;
  Kv kv(8, 19);
  const long pageable_before = fake.pageable_copies();
  Opcodes ring;  // engines start after it, stop before it goes
  {
    EngineConfig config = device_config(dir, 0, 2, 2, kWhole);
    config.set_io_timeout_s(0);  // registered buffers are the staging pool's (see above)
    Engine engine(config);
    const std::vector<std::string> names{"b0", "b1", "b2", "b3"};
    const Completion s = run(engine, 1, Direction::kStore, ops(dir, kv, names, {0, 1, 2, 3}));
    CHECK_MSG(s.success, kvtest::describe(s));
    for (std::size_t b = 4; b < 8; ++b) kv.zero(b);
    const Completion l = run(engine, 2, Direction::kLoad, ops(dir, kv, names, {7, 6, 5, 4}));
    CHECK_MSG(l.success, kvtest::describe(l));
    for (std::size_t b = 0; b < 4; ++b) CHECK(kv.bytes(7 - b) == kv.bytes(b));
    CHECK_EQ(kvtest::file_size(dir / "b0"), off_t(4096 + 16384));  // as the psync path writes
  }
  CHECK_EQ(fake.pageable_copies(), pageable_before);
  // One fixed-buffer write and read per block on io_uring; psync never touches a ring.
  const bool uring = kvtest::io_engine_under_test() == kvtier::IoEngine::kIoUring;
  CHECK_EQ(ring[IORING_OP_WRITE_FIXED], uring ? 4 : 0);
  CHECK_EQ(ring[IORING_OP_READ_FIXED], uring ? 4 : 0);
}

KV_TEST(store_copies_after_the_kernels_on_the_callers_stream) {
  const Standin& fake = Standin::get();
  for (bool legacy : {false, true}) {
    TempDir dir;
    Kv kv(4, 5);
    Engine engine(device_config(dir));
    CallerStream caller(legacy);
    void* stream = caller.get();
    // Kernels that sleep, then write block 1's K and V runs; the store is submitted at once.
    CHECK_EQ(fake.kernel(stream, 200, kv.k_run(1), 0x11, Kv::kRun), 0);
    CHECK_EQ(fake.kernel(stream, 50, kv.v_run(1), 0x22, Kv::kRun), 0);
    const Completion s = run(engine, 1, Direction::kStore, ops(dir, kv, {"k"}, {1}), stream);
    CHECK_MSG(s.success, kvtest::describe(s));
    kv.zero(3);
    const Completion l = run(engine, 2, Direction::kLoad, ops(dir, kv, {"k"}, {3}), stream);
    CHECK_MSG(l.success, kvtest::describe(l));
    CHECK_EQ(kv.k_run(3)[0], 0x11);
    CHECK_EQ(kv.v_run(3)[Kv::kRun - 1], 0x22);
    CHECK(kv.bytes(3) == kv.bytes(1));
  }
}

KV_TEST(load_copies_after_the_kernels_still_reading_the_block) {
  const Standin& fake = Standin::get();
  for (bool legacy : {false, true}) {
    TempDir dir;
    Kv kv(4, 7);
    Engine engine(device_config(dir));
    const Completion s = run(engine, 1, Direction::kStore, ops(dir, kv, {"k"}, {0}));
    CHECK_MSG(s.success, kvtest::describe(s));
    const std::vector<unsigned char> old_k(kv.k_run(2), kv.k_run(2) + Kv::kRun);
    std::vector<unsigned char> seen(Kv::kRun);
    CallerStream caller(legacy);
    void* stream = caller.get();
    // A kernel still reading block 2 (it copies what it sees after a while) when a load into
    // block 2 is submitted: the load must not overwrite the block before the kernel ran.
    CHECK_EQ(fake.read_kernel(stream, 200, seen.data(), kv.k_run(2), Kv::kRun), 0);
    const Completion l = run(engine, 2, Direction::kLoad, ops(dir, kv, {"k"}, {2}), stream);
    CHECK_MSG(l.success, kvtest::describe(l));
    CHECK_MSG(seen == old_k, "the load overwrote a block a queued kernel still read");
    CHECK(kv.bytes(2) == kv.bytes(0));
  }
}

KV_TEST(jobs_on_a_second_device_from_a_thread_on_the_first) {
  const Standin& fake = Standin::get();
  for (bool legacy : {false, true}) {
    TempDir dir;
    Kv kv(4, 9);
    Engine engine(device_config(dir, /*device=*/1));
    CHECK_EQ(fake.current_device(), 0);
    std::vector<unsigned char> seen(Kv::kRun);
    // The caller's stream belongs to device 1 (a created one, or device 1's legacy stream);
    // the submitting thread has device 0 current, as one thread driving several GPUs does.
    CHECK_EQ(fake.set_device(1), 0);
    CallerStream caller(legacy);
    void* stream = caller.get();
    CHECK_EQ(fake.kernel(stream, 200, kv.k_run(1), 0x5A, Kv::kRun), 0);
    CHECK_EQ(fake.set_device(0), 0);
    const Completion s = run(engine, 1, Direction::kStore, ops(dir, kv, {"k"}, {1}), stream);
    CHECK_MSG(s.success, kvtest::describe(s));
    CHECK_EQ(fake.current_device(), 0);  // restored after submit

    CHECK_EQ(fake.set_device(1), 0);
    const std::vector<unsigned char> old_k(kv.k_run(3), kv.k_run(3) + Kv::kRun);
    CHECK_EQ(fake.read_kernel(stream, 200, seen.data(), kv.k_run(3), Kv::kRun), 0);
    CHECK_EQ(fake.set_device(0), 0);
    const Completion l = run(engine, 2, Direction::kLoad, ops(dir, kv, {"k"}, {3}), stream);
    CHECK_MSG(l.success, kvtest::describe(l));
    CHECK_EQ(fake.current_device(), 0);
    CHECK(seen == old_k);
    CHECK_EQ(kv.k_run(3)[0], 0x5A);  // the store saw the kernel's bytes
    CHECK(kv.bytes(3) == kv.bytes(1));
  }
}

KV_TEST(cuda_errors_fail_the_block_and_the_next_job_works) {
  const Standin& fake = Standin::get();
  const char* copy = batch_runtime() ? "cudaMemcpyBatchAsync" : "cudaMemcpyAsync";
  for (const char* function : {copy, "cudaStreamWaitEvent", "cudaStreamSynchronize"}) {
    for (auto [direction, buffer] :
         {std::pair{Direction::kStore, kPieces}, std::pair{Direction::kLoad, kPieces},
          std::pair{Direction::kStore, kWhole}, std::pair{Direction::kLoad, kWhole}}) {
      TempDir dir;
      Kv kv(4, 11);
      {
        Engine setup(device_config(dir, 0, 2, 2, buffer));
        const Completion s = run(setup, 1, Direction::kStore, ops(dir, kv, {"present"}, {0}));
        CHECK_MSG(s.success, kvtest::describe(s));
      }
      // One worker: jobs run in order, so the one-shot fault hits job 2 and job 3 is clean.
      Engine engine(device_config(dir, 0, 0, 1, buffer));
      CallerStream stream;
      fake.fail(function, 1, 700);
      const bool store = direction == Direction::kStore;
      const std::string name = store ? "broken" : "present";
      engine.submit(2, direction, ops(dir, kv, {name}, {store ? 1u : 2u}), stream.get());
      engine.submit(3, direction, ops(dir, kv, {store ? "after" : "present"}, {store ? 1u : 3u}),
                    stream.get());
      const std::vector<Completion> done = kvtest::drain_and_pop(engine, 2);
      const Completion& failed = done[0].job_id == 2 ? done[0] : done[1];
      const Completion& again = done[0].job_id == 2 ? done[1] : done[0];
      CHECK(!failed.success);
      CHECK_EQ(failed.error.errno_value, EIO);
      CHECK_MSG(failed.error.message.find("cudaErrorIllegalAddress") != std::string::npos,
                failed.error.message);
      CHECK_MSG(again.success, kvtest::describe(again));
      if (store) {
        CHECK(!kvtest::file_exists(dir / "broken"));
        CHECK(kvtest::tmp_files_below(dir.path()).empty());
      } else {
        CHECK(kv.bytes(3) == kv.bytes(0));
      }
    }
  }
}

KV_TEST(event_errors_at_submit_throw_and_leave_no_job) {
  const Standin& fake = Standin::get();
  for (const char* function : {"cudaEventCreateWithFlags", "cudaEventRecord"}) {
    TempDir dir;
    Kv kv(2, 13);
    Engine engine(device_config(dir));
    CallerStream stream;
    const bool creation_fails = std::string(function) == "cudaEventCreateWithFlags";
    const long created = fake.calls("cudaEventCreateWithFlags");
    const long destroyed = fake.calls("cudaEventDestroy");
    fake.fail(function, 1, 2);
    CHECK_THROWS(std::runtime_error,
                 engine.submit(1, Direction::kStore, ops(dir, kv, {"k"}, {0}), stream.get()));
    // Nothing leaked: an event that was created is destroyed again (the stand-in counts the
    // failed creation as a call).
    CHECK_EQ(fake.calls("cudaEventCreateWithFlags") - created - (creation_fails ? 1 : 0),
             fake.calls("cudaEventDestroy") - destroyed);
    engine.drain();
    CHECK(engine.pop_completions().empty());
    const Completion retry = run(engine, 1, Direction::kStore, ops(dir, kv, {"k"}, {0}));
    CHECK_MSG(retry.success, kvtest::describe(retry));
  }
}

// A failed store returns while work it queued may still sit on the worker's stream (a wait on
// the job's event behind a busy caller stream); the job and its event are destroyed when
// popped, the staging buffer goes to the next block. Under ASan a use of either after free is
// a report; in the stand-in a wait left behind on a destroyed event would hang shutdown.
KV_TEST(failed_stores_behind_a_busy_caller_stream_leave_nothing_behind) {
  const Standin& fake = Standin::get();
  const char* copy = batch_runtime() ? "cudaMemcpyBatchAsync" : "cudaMemcpyAsync";
  TempDir dir;
  Kv kv(2, 15);
  CallerStream stream;
  for (int i = 0; i < 10; ++i) {
    Engine engine(device_config(dir, 0, 1, 1));
    fake.fail(copy, 1, 700);
    CHECK_EQ(fake.kernel(stream.get(), 20, kv.k_run(0), 1, 1), 0);
    engine.submit(1, Direction::kStore, ops(dir, kv, {"k" + std::to_string(i)}, {1}), stream.get());
    const std::vector<Completion> done = kvtest::drain_and_pop(engine, 1);  // destroys the job
    CHECK(!done[0].success);
    engine.shutdown();
  }
}

KV_TEST(concurrent_submitters_with_their_own_streams) {
  const Standin& fake = Standin::get();
  TempDir dir;
  constexpr std::size_t kThreads = 4, kRounds = 6, kJobs = kThreads * kRounds;
  // Block j is job j's source, block kJobs + j its destination: nothing written concurrently
  // overlaps, so any report is kvtier's (or the stand-in's) race, not the test's.
  Kv kv(2 * kJobs, 17);
  Engine engine(device_config(dir, 0, 2, 2));
  std::atomic<int> problems{0};
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      CallerStream stream;  // each submitter has its own stream
      for (std::size_t r = 0; r < kRounds; ++r) {
        const std::size_t j = t * kRounds + r;
        if (fake.kernel(stream.get(), 5, kv.k_run(j), static_cast<int>(1 + j), Kv::kRun) != 0)
          ++problems;
        const std::string name = "j" + std::to_string(j);
        engine.submit(2 * j, Direction::kStore, ops(dir, kv, {name}, {j}), stream.get());
        engine.submit(2 * j + 1, Direction::kLoad, ops(dir, kv, {name}, {kJobs + j}), stream.get());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // Loads may run before their store finished (a failed load then); each job is reported once.
  const std::vector<Completion> done = kvtest::drain_and_pop(engine, 2 * kJobs);
  std::size_t stores_ok = 0;
  for (const Completion& c : done)
    if (c.direction == Direction::kStore && c.success) ++stores_ok;
  CHECK_EQ(problems.load(), 0);
  CHECK_EQ(stores_ok, kJobs);
  // Every stored file holds what its kernel wrote (the store waited for it).
  for (std::size_t j = 0; j < kJobs; ++j) {
    const Completion l = run(engine, 1000 + j, Direction::kLoad,
                             ops(dir, kv, {"j" + std::to_string(j)}, {kJobs + j}));
    CHECK_MSG(l.success, kvtest::describe(l));
    CHECK_EQ(static_cast<int>(kv.k_run(kJobs + j)[0]), static_cast<int>(1 + j));
    CHECK(kv.bytes(kJobs + j) == kv.bytes(j));
  }
}
