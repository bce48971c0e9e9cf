// The default worker counts: the pure sizing rule fed with made-up machines, the sysfs probe
// on file systems without a device, and an Engine left at the defaults (explicit counts win).
#include <unistd.h>

#include "engine_helpers.hpp"

namespace {

using kvtier::default_thread_counts;
using kvtier::EngineConfig;
using kvtier::kMachineThreads;

void check_counts(unsigned cores, unsigned queue_depth, unsigned want) {
  const kvtier::ThreadCounts got = default_thread_counts(cores, queue_depth);
  CHECK_MSG(got.n_read_threads == want && got.n_write_threads == want,
            "cores " + std::to_string(cores) + ", queue depth " + std::to_string(queue_depth) +
                ": got " + std::to_string(got.n_read_threads) + " + " +
                std::to_string(got.n_write_threads) + ", want " + std::to_string(want) + " each");
}

}  // namespace

KV_TEST(no_device_one_worker_per_core_per_direction) {
  check_counts(2, 0, 2);
  check_counts(8, 0, 8);
  check_counts(24, 0, 24);
}

KV_TEST(at_least_two_and_at_most_thirty_two_per_direction) {
  check_counts(0, 0, 2);
  check_counts(1, 0, 2);
  check_counts(1, 16, 2);
  check_counts(64, 0, 32);
  check_counts(2, 4096, 32);
}

KV_TEST(device_queue_raises_the_count_to_a_sixteenth_of_its_depth) {
  check_counts(2, 256, 16);   // this project's virtio disk (mq-deadline)
  check_counts(2, 64, 4);     // a small queue (SATA-like)
  check_counts(4, 1023, 32);  // NVMe without a scheduler
  check_counts(12, 64, 12);   // the cores win where they are more
  check_counts(2, 47, 2);     // rounds down
}

KV_TEST(file_systems_without_a_block_device_have_no_queue) {
  CHECK_EQ(kvtier::device_queue_depth("/proc"), 0u);  // procfs: an anonymous device
  CHECK_EQ(kvtier::device_queue_depth("/proc/no/such/dir"), 0u);
}

KV_TEST(a_missing_root_is_measured_on_its_nearest_existing_ancestor) {
  kvtest::TempDir dir;
  CHECK_EQ(kvtier::device_queue_depth(dir / "not/yet/created"),
           kvtier::device_queue_depth(dir.path()));
}

KV_TEST(usable_cores_is_the_affinity_mask) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CHECK_EQ(::sched_getaffinity(0, sizeof(set), &set), 0);
  CHECK_EQ(kvtier::usable_cores(), static_cast<unsigned>(CPU_COUNT(&set)));
}

KV_TEST(engine_defaults_to_the_machine_counts_and_explicit_counts_win) {
  kvtest::TempDir dir;
  EngineConfig config = kvtest::engine_config(dir);
  config.set_n_read_threads(kMachineThreads);
  config.set_n_write_threads(kMachineThreads);
  const kvtier::ThreadCounts machine = kvtier::machine_thread_counts(dir.path());
  {
    kvtier::Engine engine(config);
    CHECK_EQ(engine.config().n_read_threads(), machine.n_read_threads);
    CHECK_EQ(engine.config().n_write_threads(), machine.n_write_threads);
  }
  config.set_n_read_threads(3);  // one explicit, one default
  {
    kvtier::Engine engine(config);
    CHECK_EQ(engine.config().n_read_threads(), 3u);
    CHECK_EQ(engine.config().n_write_threads(), machine.n_write_threads);
  }
  CHECK(EngineConfig{}.n_read_threads() == kMachineThreads);
  CHECK(EngineConfig{}.n_write_threads() == kMachineThreads);
}
