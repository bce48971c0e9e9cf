// A stand-in for the CUDA runtime, for testing kvtier's CUDA code path without a GPU.
// kvtier loads it through the same run-time loader as the real libcudart (KVTIER_CUDART).
// "Device memory" is host memory; streams are host threads that run their queued work in
// order; events complete when their stream reaches them; copies are memcpy. Tests steer it
// through the kvtier_fake_* functions (ctypes, dlsym): fault injection, call counts, fake
// kernels.
//
// Devices: $KVTIER_FAKE_CUDA_DEVICES of them (default 1). As in the real runtime, the current
// device is per thread (0 until cudaSetDevice), streams and events belong to the device that
// was current when they were created, the legacy default stream (a null stream) is the current
// device's own, and cudaEventRecord fails with cudaErrorInvalidResourceHandle when the event
// and the stream belong to different devices (cudaStreamWaitEvent across devices is allowed).
// Host memory is pinned for the device current at cudaHostRegister, or for all of them with
// cudaHostRegisterPortable; kvtier_fake_pageable_copies() counts copies on a stream whose
// host side is not pinned for the stream's device (slow on a real GPU, correct here).
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace {

constexpr int kSuccess = 0;
constexpr int kErrorInvalidValue = 1;
constexpr int kErrorInvalidResourceHandle = 400;
constexpr unsigned kHostRegisterPortable = 0x01;

class FakeStream {
 public:
  explicit FakeStream(int device) : device_(device), thread_([this] { run(); }) {}
  ~FakeStream() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void enqueue(std::function<void()> work) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(work));
    }
    cv_.notify_all();
  }
  void synchronize() {
    std::unique_lock lock(mutex_);
    idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }
  int device() const noexcept { return device_; }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto work = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      work();
      lock.lock();
      busy_ = false;
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false, stop_ = false;
  const int device_;
  std::thread thread_;  // last: starts once everything above is initialised
};

struct FakeEvent {
  explicit FakeEvent(int d) : device(d) {}
  const int device;
  std::mutex mutex;
  std::condition_variable cv;
  std::uint64_t recorded = 0, completed = 0;
};

std::mutex g_mutex;
std::map<std::string, long> g_calls;
std::map<std::string, std::pair<long, int>> g_faults;  // function -> (calls until fault, error)
std::atomic<long> g_registered_bytes{0};
struct Registration {
  std::size_t length;
  int device;  // -1: portable, pinned for every device
};
std::map<const char*, Registration> g_registered;  // by start address
std::atomic<long> g_pageable_copies{0};
thread_local int t_device = 0;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}
int device_count() {
  return env_int("KVTIER_FAKE_CUDA_DEVICES", 1);
}

FakeStream& legacy_stream(int device) {
  static std::mutex mutex;
  static std::map<int, FakeStream*> streams;  // live as long as the process, as in CUDA
  std::lock_guard lock(mutex);
  FakeStream*& stream = streams[device];
  if (stream == nullptr) stream = new FakeStream(device);
  return *stream;
}
FakeStream& stream_of(void* s) {
  return s ? *static_cast<FakeStream*>(s) : legacy_stream(t_device);
}

bool pinned_for(const void* p, int device) {
  const auto* c = static_cast<const char*>(p);
  std::lock_guard lock(g_mutex);
  auto it = g_registered.upper_bound(c);
  if (it == g_registered.begin()) return false;
  --it;
  if (c >= it->first + it->second.length) return false;
  return it->second.device < 0 || it->second.device == device;
}
// A copy of host memory that is not pinned for the stream's device: a real runtime stages it
// through its own buffers (slow, synchronous); here it is only counted.
void note_copy(const void* dst, const void* src, const FakeStream& stream) {
  if (!pinned_for(dst, stream.device()) && !pinned_for(src, stream.device())) ++g_pageable_copies;
}

// Counts the call and returns the injected error, if one is due.
int enter(const char* function) {
  std::lock_guard lock(g_mutex);
  ++g_calls[function];
  auto it = g_faults.find(function);
  if (it == g_faults.end()) return kSuccess;
  if (--it->second.first > 0) return kSuccess;
  const int error = it->second.second;
  g_faults.erase(it);
  return error;
}

}  // namespace

extern "C" {

// ---- runtime API subset used by kvtier -----------------------------------------------------
int cudaRuntimeGetVersion(int* v) {
  *v = env_int("KVTIER_FAKE_CUDART_VERSION", 13000);
  return enter("cudaRuntimeGetVersion");
}
int cudaGetDeviceCount(int* n) {
  *n = device_count();
  return enter("cudaGetDeviceCount");
}
int cudaGetDevice(int* d) {
  *d = t_device;
  return enter("cudaGetDevice");
}
int cudaSetDevice(int d) {
  if (int e = enter("cudaSetDevice")) return e;
  if (d < 0 || d >= device_count()) return kErrorInvalidValue;
  t_device = d;
  return kSuccess;
}
int cudaDeviceGetPCIBusId(char* out, int len, int) {
  std::snprintf(out, static_cast<std::size_t>(len), "0000:FF:00.0");  // no such device: no NUMA
  return enter("cudaDeviceGetPCIBusId");
}
int cudaStreamCreateWithFlags(void** s, unsigned) {
  if (int e = enter("cudaStreamCreateWithFlags")) return e;
  *s = new FakeStream(t_device);
  return kSuccess;
}
int cudaStreamDestroy(void* s) {
  delete static_cast<FakeStream*>(s);
  return enter("cudaStreamDestroy");
}
int cudaStreamSynchronize(void* s) {
  if (int e = enter("cudaStreamSynchronize")) return e;
  stream_of(s).synchronize();
  return kSuccess;
}
// Queued work holds its own reference, so destroying an event with pending waits is safe, as
// in CUDA.
using EventRef = std::shared_ptr<FakeEvent>;
int cudaEventCreateWithFlags(void** e, unsigned) {
  if (int err = enter("cudaEventCreateWithFlags")) return err;
  *e = new EventRef(std::make_shared<FakeEvent>(t_device));
  return kSuccess;
}
int cudaEventDestroy(void* e) {
  delete static_cast<EventRef*>(e);
  return enter("cudaEventDestroy");
}
int cudaEventRecord(void* e, void* s) {
  if (int err = enter("cudaEventRecord")) return err;
  EventRef ev = *static_cast<EventRef*>(e);
  FakeStream& stream = stream_of(s);
  if (stream.device() != ev->device) return kErrorInvalidResourceHandle;
  std::uint64_t generation;
  {
    std::lock_guard lock(ev->mutex);
    generation = ++ev->recorded;
  }
  stream.enqueue([ev, generation] {
    std::lock_guard lock(ev->mutex);
    if (ev->completed < generation) ev->completed = generation;
    ev->cv.notify_all();
  });
  return kSuccess;
}
int cudaStreamWaitEvent(void* s, void* e, unsigned) {
  if (int err = enter("cudaStreamWaitEvent")) return err;
  EventRef ev = *static_cast<EventRef*>(e);
  std::uint64_t generation;
  {
    std::lock_guard lock(ev->mutex);
    generation = ev->recorded;  // waits for the most recent record, as CUDA does
  }
  stream_of(s).enqueue([ev, generation] {
    std::unique_lock lock(ev->mutex);
    ev->cv.wait(lock, [&] { return ev->completed >= generation; });
  });
  return kSuccess;
}
int cudaMemcpyAsync(void* dst, const void* src, std::size_t n, int, void* s) {
  if (int e = enter("cudaMemcpyAsync")) return e;
  FakeStream& stream = stream_of(s);
  note_copy(dst, src, stream);
  stream.enqueue([=] { std::memcpy(dst, src, n); });
  return kSuccess;
}
int cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                         std::size_t count, void*, std::size_t*, std::size_t, void* s) {
  if (int e = enter("cudaMemcpyBatchAsync")) return e;
  FakeStream& stream = stream_of(s);
  for (std::size_t i = 0; i < count; ++i) {
    void* dst = dsts[i];
    const void* src = srcs[i];
    std::size_t n = sizes[i];
    note_copy(dst, src, stream);
    stream.enqueue([=] { std::memcpy(dst, src, n); });
  }
  return kSuccess;
}
int cudaHostRegister(void* p, std::size_t n, unsigned flags) {
  if (int e = enter("cudaHostRegister")) return e;
  std::lock_guard lock(g_mutex);
  g_registered[static_cast<const char*>(p)] = {n, (flags & kHostRegisterPortable) ? -1 : t_device};
  g_registered_bytes += static_cast<long>(n);
  return kSuccess;
}
int cudaHostUnregister(void* p) {
  if (int e = enter("cudaHostUnregister")) return e;
  std::lock_guard lock(g_mutex);
  auto it = g_registered.find(static_cast<const char*>(p));
  if (it == g_registered.end()) return kErrorInvalidValue;
  g_registered_bytes -= static_cast<long>(it->second.length);
  g_registered.erase(it);
  return kSuccess;
}
int cudaGetLastError() {
  return kSuccess;
}
const char* cudaGetErrorName(int e) {
  switch (e) {
    case 0:
      return "cudaSuccess";
    case 1:
      return "cudaErrorInvalidValue";
    case 2:
      return "cudaErrorMemoryAllocation";
    case 400:
      return "cudaErrorInvalidResourceHandle";
    case 700:
      return "cudaErrorIllegalAddress";
    default:
      return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(int e) {
  switch (e) {
    case 0:
      return "no error";
    case 1:
      return "invalid argument";
    case 2:
      return "out of memory";
    case 400:
      return "invalid resource handle";
    case 700:
      return "an illegal memory access was encountered";
    default:
      return "unknown error";
  }
}

// ---- test controls ------------------------------------------------------------------------
/// The `nth` next call of `function` (1 = the next one) returns `error`.
void kvtier_fake_fail(const char* function, long nth, int error) {
  std::lock_guard lock(g_mutex);
  g_faults[function] = {nth, error};
}
long kvtier_fake_calls(const char* function) {
  std::lock_guard lock(g_mutex);
  auto it = g_calls.find(function);
  return it == g_calls.end() ? 0 : it->second;
}
long kvtier_fake_registered_bytes() {
  return g_registered_bytes.load();
}
long kvtier_fake_pageable_copies() {
  return g_pageable_copies.load();
}
/// A fake kernel on stream `s`: after `delay_ms`, fills `n` bytes at `dst` with `value`.
/// Like a real launch, it fails when `s` belongs to a device other than the current one.
int kvtier_fake_kernel(void* s, int delay_ms, void* dst, int value, std::size_t n) {
  FakeStream& stream = stream_of(s);
  if (stream.device() != t_device) return kErrorInvalidResourceHandle;
  stream.enqueue([=] {
    ::usleep(static_cast<useconds_t>(delay_ms) * 1000);
    std::memset(dst, value, n);
  });
  return kSuccess;
}
/// A fake kernel that reads device memory: after `delay_ms`, copies `n` bytes from `src` to
/// `dst` (a snapshot of what the kernel saw).
int kvtier_fake_read_kernel(void* s, int delay_ms, void* dst, const void* src, std::size_t n) {
  FakeStream& stream = stream_of(s);
  if (stream.device() != t_device) return kErrorInvalidResourceHandle;
  stream.enqueue([=] {
    ::usleep(static_cast<useconds_t>(delay_ms) * 1000);
    std::memcpy(dst, src, n);
  });
  return kSuccess;
}

}  // extern "C"
