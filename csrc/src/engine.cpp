#include <kvtier/engine.hpp>

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <kvtier/error.hpp>
#include <kvtier/files.hpp>
#include <kvtier/format.hpp>

#include "aligned_buffer.hpp"
#include "beneath.hpp"
#include "block_io.hpp"
#include "cuda_runtime.hpp"
#include "mpsc_queue.hpp"
#include "posix_io.hpp"
#include "process.hpp"

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;

struct Job;

// A load block waiting for pending stores of its path (read-after-write). Links live in the
// job, allocated at submit, so parking never allocates on a worker.
struct ParkedLoad {
  Job* job = nullptr;
  std::size_t index = 0;
  ParkedLoad* next = nullptr;
};

// Intrusive FIFO of parked loads.
struct ParkedList {
  ParkedLoad* head = nullptr;
  ParkedLoad* tail = nullptr;
  std::size_t size = 0;

  void push(ParkedLoad* p) noexcept {
    p->next = nullptr;
    (tail != nullptr ? tail->next : head) = p;
    tail = p;
    ++size;
  }
  ParkedLoad* pop() noexcept {
    ParkedLoad* p = head;
    if (p == nullptr) return nullptr;
    head = p->next;
    if (head == nullptr) tail = nullptr;
    --size;
    return p;
  }
  void append(ParkedList& other) noexcept {  // moves `other` to our end, keeping its order
    if (other.head == nullptr) return;
    (tail != nullptr ? tail->next : head) = other.head;
    tail = other.tail;
    size += other.size;
    other = ParkedList{};
  }
};

// Stores of one path that were submitted and have not finished, and the loads of that path
// waiting for them.
struct PendingPath {
  std::size_t stores = 0;
  ParkedList parked;
};

struct Job {
  detail::MpscNode node;  // first member: a node pointer is the job pointer
  JobId id = 0;
  Direction direction = Direction::kLoad;
  std::vector<BlockOp> blocks;
  std::vector<int> block_errnos;
  std::atomic<std::size_t> remaining{0};
  std::atomic<bool> error_claimed{false};
  JobError error;  // written once, by the thread that wins error_claimed
  std::atomic<std::uint64_t> bytes{0};
  Clock::time_point submitted;
  double seconds = 0.0;
  // Scheduling state, guarded by Impl::mutex: the submission order (for drain()), the
  // neighbours in Impl's list of incomplete jobs, the next block a worker takes while the
  // job is queued, and (loads only) one parking link per block, allocated at submit.
  std::uint64_t seq = 0;
  Job* older = nullptr;
  Job* newer = nullptr;
  std::size_t next_block = 0;
  std::vector<ParkedLoad> parking;
  // Popped but not yet delivered (a conversion threw); guarded by Impl::consumer_mutex.
  Job* undelivered_next = nullptr;
  // Recorded on the submitter's stream for jobs over device memory; destroyed with the job.
  detail::cuda::Event ready = nullptr;
  const detail::cuda::Api* cuda = nullptr;

  Job() = default;
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  ~Job() {
    if (ready != nullptr) cuda->cudaEventDestroy(ready);
  }
};
static_assert(offsetof(Job, node) == 0);

struct Task {
  Job* job;
  std::size_t index;
};

struct Counters {
  std::atomic<std::uint64_t> load_jobs{0}, store_jobs{0}, failed_load_jobs{0}, failed_store_jobs{0};
  std::atomic<std::uint64_t> load_blocks{0}, store_blocks{0}, failed_load_blocks{0},
      failed_store_blocks{0};
  std::atomic<std::uint64_t> load_bytes{0}, store_bytes{0}, dedup_skips{0},
      corrupt_files_removed{0}, o_direct_fallbacks{0};
};

// Rejects configurations the engine cannot honour, before anything is allocated. Thread
// counts left at kMachineThreads are sized by the machine first.
EngineConfig validated(EngineConfig config) {
  if (config.n_read_threads == kMachineThreads || config.n_write_threads == kMachineThreads) {
    const ThreadCounts machine = machine_thread_counts(config.root_dir);
    if (config.n_read_threads == kMachineThreads) config.n_read_threads = machine.n_read_threads;
    if (config.n_write_threads == kMachineThreads)
      config.n_write_threads = machine.n_write_threads;
  }
  const EngineConfig& c = config;
  if (c.n_read_threads + c.n_write_threads == 0)
    throw std::invalid_argument("n_read_threads + n_write_threads must be at least 1");
  if (c.n_read_threads > 1024 || c.n_write_threads > 1024)
    throw std::invalid_argument("n_read_threads and n_write_threads must be at most 1024");
  if (c.fingerprint.size() > kFingerprintSize)
    throw std::invalid_argument("fingerprint must be at most " + std::to_string(kFingerprintSize) +
                                " bytes");
  if (c.staging_buffer_bytes < kAlignment || c.staging_buffer_bytes % kAlignment != 0)
    throw std::invalid_argument("staging_buffer_bytes must be a positive multiple of 4096");
  if (c.staging_bytes_total < c.staging_buffer_bytes)
    throw std::invalid_argument("staging_bytes_total must hold at least one staging buffer");
  if (c.worker_nice < 0 || c.worker_nice > 19)
    throw std::invalid_argument("worker_nice must be in [0, 19]");
  if (c.load_nice < 0 || c.load_nice > 19)
    throw std::invalid_argument("load_nice must be in [0, 19]");
  if (c.max_stores_in_flight_while_loading == 0)
    throw std::invalid_argument("max_stores_in_flight_while_loading must be at least 1");
  if ((c.file_mode & ~mode_t{07777}) != 0)
    throw std::invalid_argument("file_mode must be permission bits (0 to 0o7777)");
  if ((c.file_mode & 0600) != 0600)
    throw std::invalid_argument("file_mode must let the owner read and write (include 0o600)");
  return config;
}

// The CPUs of the NUMA node a GPU is attached to, read from sysfs; empty when unknown.
std::vector<int> gpu_numa_cpus(const detail::cuda::Api& api, int device, int& node) {
  node = -1;
  char bus_id[64] = {};
  if (api.cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) != detail::cuda::kSuccess) {
    api.cudaGetLastError();
    return {};
  }
  std::string id(bus_id);
  for (char& ch : id) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  std::ifstream numa("/sys/bus/pci/devices/" + id + "/numa_node");
  if (!(numa >> node) || node < 0) {
    node = -1;
    return {};
  }
  std::ifstream list("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
  std::string text;
  std::getline(list, text);
  std::vector<int> cpus;
  std::size_t pos = 0;
  while (pos < text.size()) {  // "0-15,32-47"
    std::size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string range = text.substr(pos, end - pos);
    const auto dash = range.find('-');
    try {
      const int lo = std::stoi(range.substr(0, dash));
      const int hi = dash == std::string::npos ? lo : std::stoi(range.substr(dash + 1));
      for (int c = lo; c <= hi; ++c) cpus.push_back(c);
    } catch (const std::exception&) {
      node = -1;
      return {};
    }
    pos = end + 1;
  }
  if (cpus.empty()) node = -1;
  return cpus;
}

}  // namespace

bool cuda_available() noexcept {
  return detail::cuda::runtime() != nullptr;
}

std::string cuda_unavailable_reason() {
  return detail::cuda::unavailable_reason();
}

struct Engine::Impl {
  // The process that started the workers. A child forked from it inherits this object but
  // none of its threads, and the mutexes below may have been held by threads that do not
  // exist there: see inherited().
  const pid_t owner = detail::current_pid();

  // Whether this is a forked child's copy: its workers never ran in this process, so nothing
  // may wait for them, or for a lock one of them might have held when the parent forked.
  bool inherited() const noexcept { return detail::current_pid() != owner; }

  [[noreturn]] void refuse_inherited() const {
    throw std::runtime_error("kvtier engine was created in process " + std::to_string(owner) +
                             " and cannot be used in a process forked from it (pid " +
                             std::to_string(detail::current_pid()) +
                             "): its worker threads do not exist here; create a new engine "
                             "in this process, or start child processes with spawn/exec");
  }
  EngineConfig config;
  detail::RootDir root;
  detail::IoContext io;
  detail::StagingPool staging;
  bool direct = false;
  std::string fallback_reason;
  IoEngine io_engine = IoEngine::kPsync;  // the engine in use (never kAuto)
  std::string io_engine_fallback_reason;
  int event_fd = -1;
  const detail::cuda::Api* cuda = nullptr;  // set when use_cuda found a runtime
  std::vector<int> numa_cpus;
  int numa_node = -1;

  // Queues and scheduling state, guarded by mutex. A queue holds whole jobs (one entry per
  // job, so queueing a job is a single push_back that either happens or throws); workers
  // take a queued job's blocks in order through Job::next_block.
  std::mutex mutex;
  // Load-only workers wait on load_available, the others (which take stores) on
  // work_available, so that a submit wakes only workers that may take its work; the idle
  // counts say how many wait on each, so a small job wakes as many workers as it has blocks.
  std::condition_variable work_available, load_available;
  std::size_t idle_workers = 0, idle_load_only = 0;
  std::deque<Job*> loads, stores;
  // Blocks not yet taken from the queues; loads parked (on a path) and ready again (their
  // stores finished: they run before anything in `loads`).
  std::size_t queued_loads = 0, queued_stores = 0;
  std::size_t parked_loads = 0;
  ParkedList ready_loads;
  // Read-after-write: every path with a store block submitted and not finished. A load of
  // such a path parks until the count drops to zero.
  std::unordered_map<std::string, PendingPath> pending_paths;
  std::size_t running_loads = 0, running_stores = 0;
  unsigned store_cap_while_loading = 0;     // max_stores_in_flight_while_loading, adjusted
  // Until then the store cap holds although no load waits or runs (store_cap_linger_ms after
  // the last load finished): an engine issuing one load at a time gets each next load in
  // front of a short device queue, not behind every worker's store.
  Clock::time_point loads_recent_until{};
  std::unordered_set<JobId> ids_in_flight;  // submitted and not yet popped
  bool stopping = false;
  // drain(): jobs not yet completed, oldest first, and the seq of the latest submitted job.
  Job* oldest = nullptr;
  Job* newest = nullptr;
  std::uint64_t last_seq = 0;
  std::size_t drain_waiters = 0;
  std::condition_variable drained;

  std::mutex shutdown_mutex;  // serialises shutdown() callers
  std::vector<std::thread> workers;

  detail::MpscQueue completions;
  // MpscQueue has one consumer: pop_completions() callers take turns on this mutex. It also
  // guards `undelivered`, jobs popped by a call whose conversion threw (delivered next call).
  std::mutex consumer_mutex;
  Job* undelivered = nullptr;
  std::atomic<std::uint64_t> outstanding{0};  // submitted jobs not yet completed (for stats)
  Counters counters;

  explicit Impl(EngineConfig cfg)
      : config(std::move(cfg)), staging(config.staging_buffer_bytes, config.staging_bytes_total) {}

  std::size_t loads_waiting() const { return queued_loads + ready_loads.size; }

  // A store may start unless loads are waiting or running (or finished recently) and the
  // cap is reached; this keeps the device queue short so a load waits for at most the stores
  // already issued. Parked loads do not count: they wait for stores, which must be free to
  // run. After the last load the cap is at least 1, so stores never stall while none waits.
  bool store_allowed() const {
    if (loads_waiting() > 0 || running_loads > 0) return running_stores < store_cap_while_loading;
    if (running_stores == 0 || loads_recent_until == Clock::time_point{}) return true;
    return running_stores < std::max(1u, store_cap_while_loading) ||
           Clock::now() >= loads_recent_until;
  }

  // Whether no store cap is in effect: no load waits or runs and none finished within the
  // linger. Only then may a store batch grow past one block (extend_batch).
  bool stores_uncapped() const {
    return loads_waiting() == 0 && running_loads == 0 &&
           (loads_recent_until == Clock::time_point{} || Clock::now() >= loads_recent_until);
  }

  // Whether a load-first worker also takes stores: only when no store-first worker exists.
  // Load-first workers run at load_nice, above the stores, and (unprivileged) a thread cannot
  // go back to that priority once it has run a store at worker_nice.
  bool load_first_takes_stores() const { return config.n_write_threads == 0; }

  // Wakes enough idle workers for the queued blocks of one direction; mutex held. The idle
  // counts include workers notified but not yet running, so every block queued (not only
  // the newest job's) is counted: a notify_one only reaches a still-blocked worker, and
  // so at least min(queued, idle) workers are on their way.
  void wake_for(Direction direction) {
    if (direction == Direction::kStore) {
      wake(work_available, idle_workers, queued_stores);
      return;
    }
    std::size_t blocks = loads_waiting();
    if (idle_load_only > 0) {
      wake(load_available, idle_load_only, blocks);
      if (blocks <= idle_load_only) return;
      blocks -= idle_load_only;
    }
    wake(work_available, idle_workers, blocks);
  }
  static void wake(std::condition_variable& cv, std::size_t idle, std::size_t blocks) {
    if (blocks >= idle) {
      cv.notify_all();
      return;
    }
    for (std::size_t i = 0; i < blocks; ++i) cv.notify_one();
  }

  // Parks the loads at the front of the load queue whose path has a pending store, so that
  // the front (if any) is a load that may run now. Called before every pick: afterwards
  // store_allowed() no longer counts loads that are really waiting for stores.
  void park_blocked_loads() noexcept {
    if (pending_paths.empty()) return;
    while (!loads.empty()) {
      Job* job = loads.front();
      const auto it = pending_paths.find(job->blocks[job->next_block].path);
      if (it == pending_paths.end()) return;
      ParkedLoad* link = &job->parking[job->next_block];
      link->job = job;
      link->index = job->next_block;
      it->second.parked.push(link);
      ++parked_loads;
      take_front(loads, queued_loads);
    }
  }

  // The next block of the job at the front of `queue`; drops the job once all are taken.
  static Task take_front(std::deque<Job*>& queue, std::size_t& queued) noexcept {
    Job* job = queue.front();
    Task task{job, job->next_block++};
    if (job->next_block == job->blocks.size()) queue.pop_front();
    --queued;
    return task;
  }

  bool take_load(Task& task) noexcept {
    if (ParkedLoad* p = ready_loads.pop()) {  // older than anything in `loads`
      task = {p->job, p->index};
      return true;
    }
    if (loads.empty()) return false;
    task = take_front(loads, queued_loads);
    return true;
  }

  bool take_store(Task& task) noexcept {
    if (stores.empty() || !store_allowed()) return false;
    task = take_front(stores, queued_stores);
    return true;
  }

  bool pick(bool load_first, Task& task, bool& is_load) noexcept {
    park_blocked_loads();
    if (load_first ? take_load(task) : take_store(task)) {
      is_load = load_first;
      return true;
    }
    if (load_first ? load_first_takes_stores() && take_store(task) : take_load(task)) {
      is_load = !load_first;
      return true;
    }
    return false;
  }

  // More blocks of `first`'s job for the same io_uring submission, taken while the job is
  // still at the front of its queue: up to kMaxBatchBlocks blocks and kBatchBytes of payload
  // (a 2 MiB block goes alone, 256 KiB blocks go eight at a time). Stores join a batch only
  // while no store cap is in effect (no load waiting, running or within the linger), so a
  // load that arrives meanwhile waits for at most one batch's device time, the same order as
  // one large block's. Loads never join past a pending store of their path
  // (read-after-write). psync gains nothing from batching: one block at a time.
  std::size_t extend_batch(const Task& first, bool is_load, Task* more) noexcept {
    if (io.io_engine != IoEngine::kIoUring) return 0;
    constexpr std::uint64_t kBatchBytes = std::uint64_t{2} << 20;
    std::deque<Job*>& queue = is_load ? loads : stores;
    std::size_t& queued = is_load ? queued_loads : queued_stores;
    std::uint64_t bytes = first.job->blocks[first.index].payload_length();
    std::size_t n = 0;
    while (n + 1 < detail::kMaxBatchBlocks && !queue.empty() && queue.front() == first.job) {
      const BlockOp& op = first.job->blocks[first.job->next_block];
      if (bytes + op.payload_length() > kBatchBytes) break;
      if (is_load ? pending_paths.count(op.path) > 0 : !stores_uncapped()) break;
      bytes += op.payload_length();
      more[n++] = take_front(queue, queued);
    }
    return n;
  }

  // Registers the store blocks of `job` as pending for their paths. All or nothing: on an
  // allocation failure the counts already added are taken back before rethrowing.
  void add_pending_stores(const Job& job) {
    std::size_t added = 0;
    try {
      for (const BlockOp& op : job.blocks) {
        ++pending_paths[op.path].stores;
        ++added;
      }
    } catch (...) {
      for (std::size_t i = 0; i < added; ++i) release_pending_store(job.blocks[i].path);
      throw;
    }
  }

  // One store block of `path` finished (or was cancelled or rolled back). When it was the
  // last pending one, the loads parked on the path become ready.
  void release_pending_store(const std::string& path) noexcept {
    const auto it = pending_paths.find(path);
    if (it == pending_paths.end() || --it->second.stores > 0) return;
    const std::size_t woken = it->second.parked.size;
    ready_loads.append(it->second.parked);
    parked_loads -= woken;
    pending_paths.erase(it);
    if (woken > 0) wake_for(Direction::kLoad);
  }

  void worker_loop(bool load_first) {
    // Linux applies nice per thread (a tid is a process id to setpriority). Raising it needs
    // no privilege; it is best effort anyway: a refusal only costs the scheduler loop some CPU.
    const bool load_only = load_first && !load_first_takes_stores();
    const int nice = load_only ? config.load_nice : config.worker_nice;
    if (nice > 0) ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), nice);
    if (!numa_cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int cpu : numa_cpus)
        if (cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
      ::sched_setaffinity(0, sizeof(set), &set);  // best effort: a refusal only costs locality
    }
    detail::WorkerContext worker(io);
    std::unique_lock lock(mutex);
    for (;;) {
      Task task{};
      bool is_load = false;
      while (!pick(load_first, task, is_load)) {
        if (stopping) return;
        std::size_t& idle = load_only ? idle_load_only : idle_workers;
        ++idle;
        if (load_only) {
          load_available.wait(lock);
        } else if (!stores.empty() && loads_recent_until > Clock::now()) {
          // Capped by the linger alone: nobody else sees it end, so whoever wakes at its end
          // lifts the cap for every waiting worker.
          if (work_available.wait_until(lock, loads_recent_until) == std::cv_status::timeout &&
              Clock::now() >= loads_recent_until)
            work_available.notify_all();
        } else {
          work_available.wait(lock);
        }
        --idle;
      }
      Task batch[detail::kMaxBatchBlocks] = {task};
      const std::size_t n = 1 + extend_batch(task, is_load, batch + 1);
      (is_load ? running_loads : running_stores) += n;
      lock.unlock();
      const BlockOp* ops[detail::kMaxBatchBlocks];
      for (std::size_t i = 0; i < n; ++i) ops[i] = &batch[i].job->blocks[batch[i].index];
      detail::BlockResult results[detail::kMaxBatchBlocks];
      detail::run_blocks(io, worker, is_load, ops, n, task.job->ready, results);
      lock.lock();
      (is_load ? running_loads : running_stores) -= n;
      if (is_load && config.store_cap_linger_ms > 0)
        loads_recent_until = Clock::now() + std::chrono::milliseconds(config.store_cap_linger_ms);
      // The last load ends the cap, or starts its linger: then one waiting worker is woken
      // to wait for the linger's end (and to run a store if the cap was 0). A finished store
      // frees one slot, which this worker takes itself unless a load comes first.
      if (is_load && loads_waiting() == 0 && running_loads == 0 && !stores.empty())
        wake(work_available, idle_workers, config.store_cap_linger_ms > 0 ? 1 : queued_stores);
      else if (!is_load && !stores.empty())
        work_available.notify_one();
      for (std::size_t i = 0; i < n; ++i) finish_block(batch[i], std::move(results[i]));
    }
  }

  // Records a block's outcome; the job's last block completes it. Called with `mutex` held.
  void finish_block(const Task& task, detail::BlockResult result) noexcept {
    Job* job = task.job;
    const bool load = job->direction == Direction::kLoad;
    if (!load) release_pending_store(job->blocks[task.index].path);
    job->block_errnos[task.index] = result.error;
    if (result.o_direct_fallback)
      counters.o_direct_fallbacks.fetch_add(1, std::memory_order_relaxed);
    if (result.corrupt_removed)
      counters.corrupt_files_removed.fetch_add(1, std::memory_order_relaxed);
    if (result.ok()) {
      job->bytes.fetch_add(result.bytes, std::memory_order_relaxed);
      (load ? counters.load_blocks : counters.store_blocks).fetch_add(1, std::memory_order_relaxed);
      (load ? counters.load_bytes : counters.store_bytes)
          .fetch_add(result.bytes, std::memory_order_relaxed);
      if (result.dedup) counters.dedup_skips.fetch_add(1, std::memory_order_relaxed);
    } else {
      (load ? counters.failed_load_blocks : counters.failed_store_blocks)
          .fetch_add(1, std::memory_order_relaxed);
      if (!job->error_claimed.exchange(true, std::memory_order_relaxed)) {
        job->error.errno_value = result.error;
        job->error.operation = result.operation;
        job->error.path = std::move(result.path);
        job->error.message = std::move(result.message);
      }
    }
    // acq_rel: the last finisher sees every other block's writes to the job before publishing.
    if (job->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) complete(job);
  }

  // Adds a submitted job to the list of incomplete jobs (newest last). `mutex` held.
  void link_incomplete(Job* job) noexcept {
    job->seq = ++last_seq;
    job->older = newest;
    (newest != nullptr ? newest->newer : oldest) = job;
    newest = job;
    outstanding.fetch_add(1, std::memory_order_relaxed);
  }

  // Publishes a finished job. Called with `mutex` held, so drain() sees the job leave the
  // incomplete list only after its completion is poppable.
  void complete(Job* job) noexcept {
    job->seconds = std::chrono::duration<double>(Clock::now() - job->submitted).count();
    const bool load = job->direction == Direction::kLoad;
    const bool failed = job->error_claimed.load(std::memory_order_relaxed);
    (load ? counters.load_jobs : counters.store_jobs).fetch_add(1, std::memory_order_relaxed);
    if (failed)
      (load ? counters.failed_load_jobs : counters.failed_store_jobs)
          .fetch_add(1, std::memory_order_relaxed);
    (job->older != nullptr ? job->older->newer : oldest) = job->newer;
    (job->newer != nullptr ? job->newer->older : newest) = job->older;
    outstanding.fetch_sub(1, std::memory_order_relaxed);
    const bool was_oldest = job->older == nullptr;
    // The job belongs to the consumer from here on: touch nothing of it after the push.
    completions.push(&job->node);
    if (event_fd >= 0) {
      const std::uint64_t one = 1;
      // Non-blocking; EAGAIN only when the counter is saturated, which still reads as "ready".
      [[maybe_unused]] ssize_t n = ::write(event_fd, &one, sizeof(one));
    }
    // Only the oldest job's completion can move drain()'s horizon.
    if (was_oldest && drain_waiters > 0) drained.notify_all();
  }
};

Engine::Engine(EngineConfig config) : impl_(std::make_unique<Impl>(validated(std::move(config)))) {
  Impl& s = *impl_;
  EngineConfig& c = s.config;
  if (c.root_dir.empty())
    throw std::invalid_argument("root_dir is required: every block path must lie below it");
  const mode_t directory_mode = kvtier::directory_mode(c.file_mode);
  s.root = detail::RootDir(c.root_dir, /*create=*/true, directory_mode);
  if (c.o_direct != ODirectMode::kOff) {
    s.fallback_reason = probe_o_direct(c.root_dir);
    if (!s.fallback_reason.empty() && c.o_direct == ODirectMode::kOn)
      throw SystemError(EINVAL, "o_direct=true but " + s.fallback_reason, c.root_dir);
    s.direct = s.fallback_reason.empty();
  }
  if (c.io_engine != IoEngine::kPsync) {
    // The same answer the workers' rings will get: EPERM (sysctl kernel.io_uring_disabled,
    // seccomp), ENOSYS (no io_uring), EOPNOTSUPP (an opcode the block operations need).
    std::string reason;
    if (const int e = detail::probe_io_uring(reason)) {
      if (c.io_engine == IoEngine::kIoUring)
        throw SystemError(e, "io_engine='io_uring' but " + reason, c.root_dir);
      s.io_engine_fallback_reason = std::move(reason);
    } else {
      s.io_engine = IoEngine::kIoUring;
    }
  }
  if (c.use_cuda) {
    s.cuda = detail::cuda::runtime();
    if (s.cuda == nullptr)
      throw std::runtime_error("use_cuda is set but CUDA is unavailable: " +
                               detail::cuda::unavailable_reason());
    if (c.cuda_device < 0 && s.cuda->cudaGetDevice(&c.cuda_device) != detail::cuda::kSuccess)
      throw std::runtime_error("cudaGetDevice failed");
    if (c.cuda_device >= s.cuda->device_count)
      throw std::invalid_argument("cuda_device " + std::to_string(c.cuda_device) +
                                  " does not exist (" + std::to_string(s.cuda->device_count) +
                                  " devices)");
    s.staging.pin_with(s.cuda);
    if (c.numa_bind) s.numa_cpus = gpu_numa_cpus(*s.cuda, c.cuda_device, s.numa_node);
  }
  if (c.completion_eventfd) {
    s.event_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s.event_fd < 0) throw SystemError(errno, "eventfd failed", "");
  }

  s.io.config = &s.config;
  s.io.direct = s.direct;
  s.io.io_engine = s.io_engine;
  s.io.root = &s.root;
  s.io.directory_mode = directory_mode;
  s.io.staging = &s.staging;
  // Without load-first workers, store-first workers must leave room for loads themselves:
  // one fewer store than there are workers, so a waiting load gets the next free worker.
  s.store_cap_while_loading =
      c.n_read_threads > 0 ? c.max_stores_in_flight_while_loading
                           : std::min(c.max_stores_in_flight_while_loading, c.n_write_threads - 1);
  s.io.cuda = s.cuda;
  s.io.cuda_device = c.cuda_device;

  try {
    for (unsigned i = 0; i < c.n_read_threads + c.n_write_threads; ++i) {
      const bool load_first = i < c.n_read_threads;
      s.workers.emplace_back([this, load_first] {
        ::pthread_setname_np(::pthread_self(), load_first ? "kvtier-load" : "kvtier-store");
        impl_->worker_loop(load_first);
      });
    }
  } catch (...) {
    shutdown();
    if (s.event_fd >= 0) ::close(s.event_fd);
    throw;
  }
}

Engine::~Engine() {
  if (impl_->inherited()) {
    // The std::thread objects name threads that do not exist here: joining or destroying
    // them is undefined (a crash, or std::terminate), and a queue mutex may be locked for
    // ever. The child's copy of the engine is left as it is: memory the child's exit frees,
    // and a few descriptors (root, rings), of which the completion eventfd is closed.
    if (impl_->event_fd >= 0) ::close(impl_->event_fd);
    (void)impl_.release();
    return;
  }
  shutdown();
  while (Job* job = impl_->undelivered) {
    impl_->undelivered = job->undelivered_next;
    delete job;
  }
  while (detail::MpscNode* node = impl_->completions.try_pop()) delete reinterpret_cast<Job*>(node);
  if (impl_->event_fd >= 0) ::close(impl_->event_fd);
}

void Engine::submit(JobId job_id, Direction direction, std::vector<BlockOp> blocks,
                    void* cuda_stream) {
  Impl& s = *impl_;
  if (s.inherited()) s.refuse_inherited();
  bool any_device = false;
  for (const BlockOp& op : blocks) {
    if (op.path.empty()) throw std::invalid_argument("block path must not be empty");
    if (op.data == nullptr && op.length > 0)
      throw std::invalid_argument("block data must not be null: " + op.path);
    if (!op.segments.empty() && op.data != nullptr)
      throw std::invalid_argument("a block takes data/length or segments, not both: " + op.path);
    for (const Segment& seg : op.segments) {
      if (seg.address == nullptr && seg.length > 0)
        throw std::invalid_argument("segment address must not be null: " + op.path);
      if (seg.kind == MemoryKind::kDevice) any_device = true;
    }
    if (any_device && s.cuda == nullptr)
      throw std::invalid_argument("device memory needs an engine created with use_cuda: " +
                                  op.path);
    if (op.key.size() > kMaxKeySize)
      throw std::invalid_argument("block key longer than " + std::to_string(kMaxKeySize) +
                                  " bytes: " + op.path);
  }
  auto job = std::make_unique<Job>();
  job->id = job_id;
  job->direction = direction;
  job->blocks = std::move(blocks);
  job->block_errnos.assign(job->blocks.size(), 0);
  job->remaining.store(job->blocks.size(), std::memory_order_relaxed);
  job->submitted = Clock::now();
  if (any_device) {
    // Device copies are ordered after everything already queued on the caller's stream: a
    // store must see the kernel that wrote the block, a load must not overwrite a block that
    // queued kernels still read. The workers wait on this event before copying. It is made
    // on the engine's device, whichever device the calling thread has current.
    const auto& api = *s.cuda;
    job->cuda = s.cuda;
    const detail::cuda::Error e = detail::cuda::record_event_on(
        api, s.config.cuda_device, static_cast<detail::cuda::Stream>(cuda_stream), job->ready);
    if (e != detail::cuda::kSuccess) {
      api.cudaGetLastError();
      throw std::runtime_error("cannot record the submitting stream's event: " +
                               detail::cuda::describe(api, e));
    }
  }
  const std::size_t n = job->blocks.size();
  // Everything a queued load may need later is allocated now: parking never allocates.
  if (direction == Direction::kLoad) job->parking.resize(n);
  {
    // All or nothing: each step that can throw (bad_alloc) is undone before the exception
    // leaves, and the job becomes visible to workers and drain() only once nothing can fail.
    std::lock_guard lock(s.mutex);
    if (s.stopping) throw std::runtime_error("kvtier engine is shut down; submit refused");
    if (!s.ids_in_flight.insert(job_id).second)
      throw std::invalid_argument("job id " + std::to_string(job_id) +
                                  " is already in flight (ids are reusable once popped)");
    bool stores_added = false;
    try {
      if (direction == Direction::kStore && n > 0) {
        s.add_pending_stores(*job);
        stores_added = true;
      }
      if (n > 0) (direction == Direction::kLoad ? s.loads : s.stores).push_back(job.get());
    } catch (...) {
      if (stores_added)
        for (const BlockOp& op : job->blocks) s.release_pending_store(op.path);
      s.ids_in_flight.erase(job_id);
      throw;
    }
    Job* raw = job.release();
    s.link_incomplete(raw);
    if (n == 0) {
      s.complete(raw);
      return;
    }
    (direction == Direction::kLoad ? s.queued_loads : s.queued_stores) += n;
    s.wake_for(direction);
  }
}

namespace {

Completion completion_of(const Job& job) {
  Completion c;
  c.job_id = job.id;
  c.direction = job.direction;
  c.success = !job.error_claimed.load(std::memory_order_relaxed);
  c.block_errnos = job.block_errnos;
  c.error = job.error;
  c.bytes = job.bytes.load(std::memory_order_relaxed);
  c.seconds = job.seconds;
  return c;
}

}  // namespace

std::vector<Completion> Engine::pop_completions(std::size_t max) {
  Impl& s = *impl_;
  if (s.inherited()) s.refuse_inherited();
  // MpscQueue::try_pop is single-consumer; callers from several threads take turns here.
  std::lock_guard consumer(s.consumer_mutex);
  // Unlink the jobs first (no allocation), then copy them into the result; only when that
  // succeeded are they freed. If a copy throws, the jobs go back in front of the queue for
  // the next call, so no completion is ever lost.
  Job* head = nullptr;
  Job** link = &head;
  std::size_t count = 0;
  while (max == 0 || count < max) {
    Job* job = s.undelivered;
    if (job != nullptr) {
      s.undelivered = job->undelivered_next;
    } else {
      detail::MpscNode* node = s.completions.try_pop();
      if (node == nullptr) break;
      job = reinterpret_cast<Job*>(node);
    }
    job->undelivered_next = nullptr;
    *link = job;
    link = &job->undelivered_next;
    ++count;
  }
  std::vector<Completion> out;
  try {
    out.reserve(count);
    for (Job* job = head; job != nullptr; job = job->undelivered_next)
      out.push_back(completion_of(*job));
  } catch (...) {
    *link = s.undelivered;
    s.undelivered = head;
    throw;
  }
  {
    std::lock_guard lock(s.mutex);
    for (Job* job = head; job != nullptr; job = job->undelivered_next)
      s.ids_in_flight.erase(job->id);
  }
  while (Job* job = head) {
    head = job->undelivered_next;
    delete job;
  }
  return out;
}

void Engine::drain() {
  Impl& s = *impl_;
  if (s.inherited()) s.refuse_inherited();
  std::unique_lock lock(s.mutex);
  // Jobs submitted later (by other threads) get a larger seq and are not waited for, so a
  // steady stream of new work cannot hold drain() forever.
  const std::uint64_t horizon = s.last_seq;
  ++s.drain_waiters;
  s.drained.wait(lock, [&] { return s.oldest == nullptr || s.oldest->seq > horizon; });
  --s.drain_waiters;
}

void Engine::shutdown() {
  Impl& s = *impl_;
  if (s.inherited()) return;  // nothing of it runs in this process: nothing to stop
  std::lock_guard serial(s.shutdown_mutex);
  {
    std::lock_guard lock(s.mutex);
    s.stopping = true;
    // Every block not started fails: queued loads (ready, parked, in the queue) and stores.
    // The parked loads are moved out first, so cancelling a store (which releases its path)
    // and stores still running wake nobody. Nothing here allocates.
    auto cancel = [&s](const Task& task) noexcept {
      detail::BlockResult r;
      r.error = ECANCELED;
      r.operation = "cancel";
      r.path = task.job->blocks[task.index].path;
      r.message = "engine shut down before the block operation started";
      s.finish_block(task, std::move(r));
    };
    for (auto& [path, pending] : s.pending_paths) {
      s.parked_loads -= pending.parked.size;
      s.ready_loads.append(pending.parked);
    }
    Task task{};
    while (!s.loads.empty() || s.ready_loads.size > 0) {
      s.take_load(task);
      cancel(task);
    }
    while (!s.stores.empty()) cancel(Impl::take_front(s.stores, s.queued_stores));
  }
  s.work_available.notify_all();
  s.load_available.notify_all();
  for (std::thread& t : s.workers)
    if (t.joinable()) t.join();
  s.workers.clear();
  s.staging.release_all();  // no worker holds a lease any more
}

bool Engine::is_shut_down() const noexcept {
  if (impl_->inherited()) return true;  // refuses every job in this process
  std::lock_guard lock(impl_->mutex);
  return impl_->stopping;
}

bool Engine::direct_io() const noexcept {
  return impl_->direct;
}
const std::string& Engine::o_direct_fallback_reason() const noexcept {
  return impl_->fallback_reason;
}
IoEngine Engine::io_engine() const noexcept {
  return impl_->io_engine;
}
const std::string& Engine::io_engine_fallback_reason() const noexcept {
  return impl_->io_engine_fallback_reason;
}
int Engine::completion_eventfd() const noexcept {
  return impl_->event_fd;
}
bool Engine::cuda_enabled() const noexcept {
  return impl_->cuda != nullptr;
}
int Engine::numa_node() const noexcept {
  return impl_->numa_node;
}
const EngineConfig& Engine::config() const noexcept {
  return impl_->config;
}

EngineStats Engine::stats() const {
  Impl& s = *impl_;
  if (s.inherited()) s.refuse_inherited();
  const Counters& c = s.counters;
  auto get = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  EngineStats st;
  st.load_jobs = get(c.load_jobs);
  st.store_jobs = get(c.store_jobs);
  st.failed_load_jobs = get(c.failed_load_jobs);
  st.failed_store_jobs = get(c.failed_store_jobs);
  st.load_blocks = get(c.load_blocks);
  st.store_blocks = get(c.store_blocks);
  st.failed_load_blocks = get(c.failed_load_blocks);
  st.failed_store_blocks = get(c.failed_store_blocks);
  st.load_bytes = get(c.load_bytes);
  st.store_bytes = get(c.store_bytes);
  st.dedup_skips = get(c.dedup_skips);
  st.corrupt_files_removed = get(c.corrupt_files_removed);
  st.o_direct_fallbacks = get(c.o_direct_fallbacks);
  st.jobs_in_flight = get(s.outstanding);
  std::lock_guard lock(s.mutex);
  st.queued_loads = s.loads_waiting() + s.parked_loads;
  st.queued_stores = s.queued_stores;
  st.running_loads = s.running_loads;
  st.running_stores = s.running_stores;
  return st;
}

}  // namespace kvtier
