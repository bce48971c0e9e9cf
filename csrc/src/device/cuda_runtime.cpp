#include "device/cuda_runtime.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

namespace kvtier::detail::cuda {
namespace {

struct Loaded {
  Api api;
  bool ok = false;
  std::string reason;
};

void* open_runtime(std::string& which) {
  if (const char* path = std::getenv("KVTIER_CUDART"); path != nullptr && *path != '\0') {
    which = path;
    return ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
  }
  // Newest first. RTLD_NOLOAD finds a runtime the process already has (torch's), so kvtier
  // shares its device context instead of bringing a second runtime.
  static const char* const kNames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                       "libcudart.so"};
  for (int pass = 0; pass < 2; ++pass) {
    const int flags = RTLD_NOW | RTLD_LOCAL | (pass == 0 ? RTLD_NOLOAD : 0);
    for (const char* name : kNames) {
      if (void* handle = ::dlopen(name, flags)) {
        which = name;
        return handle;
      }
    }
  }
  which = "libcudart.so";
  return nullptr;
}

Loaded load() {
  Loaded out;
  std::string which;
  void* handle = open_runtime(which);
  if (handle == nullptr) {
    const char* err = ::dlerror();
    out.reason = "no CUDA runtime library (" + which + "): " + (err ? err : "not found");
    return out;
  }
  Api& api = out.api;
  api.library = which;
  // The handle is never closed: the runtime must outlive every engine and staging buffer.
#define KVTIER_CUDA_RESOLVE(name, params)                                  \
  api.name = reinterpret_cast<decltype(api.name)>(::dlsym(handle, #name)); \
  if (api.name == nullptr) {                                               \
    out.reason = which + " lacks " #name;                                  \
    return out;                                                            \
  }
  KVTIER_CUDA_REQUIRED_FUNCTIONS(KVTIER_CUDA_RESOLVE)
#undef KVTIER_CUDA_RESOLVE
  api.cudaGetErrorName =
      reinterpret_cast<decltype(api.cudaGetErrorName)>(::dlsym(handle, "cudaGetErrorName"));
  api.cudaGetErrorString =
      reinterpret_cast<decltype(api.cudaGetErrorString)>(::dlsym(handle, "cudaGetErrorString"));
  if (api.cudaRuntimeGetVersion(&api.runtime_version) != kSuccess) {
    out.reason = which + ": cudaRuntimeGetVersion failed";
    return out;
  }
  if (void* batch = ::dlsym(handle, "cudaMemcpyBatchAsync")) {
    if (api.runtime_version >= 13000)
      api.batch_copy_13 = reinterpret_cast<BatchCopy13>(batch);
    else if (api.runtime_version >= 12080)
      api.batch_copy_12 = reinterpret_cast<BatchCopy12>(batch);
  }
  const Error e = api.cudaGetDeviceCount(&api.device_count);
  if (e != kSuccess || api.device_count <= 0) {
    api.cudaGetLastError();  // clear the sticky "no device" error for other users of the runtime
    out.reason = which + ": no CUDA device" + (e != kSuccess ? " (" + describe(api, e) + ")" : "");
    return out;
  }
  out.ok = true;
  return out;
}

const Loaded& loaded() noexcept {
  static const Loaded instance = load();
  return instance;
}

}  // namespace

const Api* runtime() noexcept {
  const Loaded& l = loaded();
  return l.ok ? &l.api : nullptr;
}

const std::string& unavailable_reason() noexcept {
  return loaded().reason;
}

std::string describe(const Api& api, Error error) {
  const char* name = api.cudaGetErrorName ? api.cudaGetErrorName(error) : nullptr;
  const char* text = api.cudaGetErrorString ? api.cudaGetErrorString(error) : nullptr;
  std::string out = name ? name : "cudaError " + std::to_string(error);
  if (text) out += std::string(": ") + text;
  return out;
}

DeviceScope::DeviceScope(const Api& api, int device) noexcept : api_(api) {
  int current = -1;
  if ((error_ = api_.cudaGetDevice(&current)) != kSuccess) return;
  if (current == device) return;
  if ((error_ = api_.cudaSetDevice(device)) != kSuccess) return;
  previous_ = current;
}

DeviceScope::~DeviceScope() {
  // Restoring a device that was valid a moment ago does not fail in practice; if it did,
  // there would be no one to tell, so the sticky error is cleared instead of left behind.
  if (previous_ >= 0 && api_.cudaSetDevice(previous_) != kSuccess) api_.cudaGetLastError();
}

Error record_event_on(const Api& api, int device, Stream stream, Event& out) noexcept {
  out = nullptr;
  DeviceScope scope(api, device);
  if (scope.error() != kSuccess) return scope.error();
  Event event = nullptr;
  Error e = api.cudaEventCreateWithFlags(&event, kEventDisableTiming);
  if (e != kSuccess) return e;
  if ((e = api.cudaEventRecord(event, stream)) != kSuccess) {
    api.cudaEventDestroy(event);
    return e;
  }
  out = event;
  return kSuccess;
}

}  // namespace kvtier::detail::cuda
