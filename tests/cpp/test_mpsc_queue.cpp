// The lock-free completion queue (csrc/src/util/mpsc_queue.hpp): FIFO order, the empty/stub
// transitions, and exactly-once delivery with several producers racing one consumer.
#include <atomic>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "util/mpsc_queue.hpp"

namespace {

using kvtier::detail::MpscNode;
using kvtier::detail::MpscQueue;

struct Item {
  MpscNode node;  // first member, as in the engine's Job
  unsigned producer = 0;
  std::size_t seq = 0;
};

Item* as_item(MpscNode* node) {
  return reinterpret_cast<Item*>(node);
}

}  // namespace

KV_TEST(empty_queue_pops_nothing) {
  MpscQueue queue;
  CHECK(queue.try_pop() == nullptr);
  CHECK(queue.try_pop() == nullptr);
}

KV_TEST(single_producer_fifo) {
  MpscQueue queue;
  std::vector<Item> items(1000);
  for (std::size_t i = 0; i < items.size(); ++i) {
    items[i].seq = i;
    queue.push(&items[i].node);
  }
  for (std::size_t i = 0; i < items.size(); ++i) {
    MpscNode* node = queue.try_pop();
    CHECK_MSG(node != nullptr, "queue ran dry at " + std::to_string(i));
    CHECK_EQ(as_item(node)->seq, i);
  }
  CHECK(queue.try_pop() == nullptr);
}

KV_TEST(drain_to_empty_and_refill_repeatedly) {
  // The last node can only be handed out after the stub is pushed back behind it: exercise
  // that path (one element, then empty) many times, interleaved with bursts.
  MpscQueue queue;
  std::vector<Item> items(64);
  for (int round = 0; round < 200; ++round) {
    const std::size_t burst = static_cast<std::size_t>(round % 5);  // 0..4 nodes
    for (std::size_t i = 0; i < burst; ++i) {
      items[i].seq = i;
      queue.push(&items[i].node);
    }
    for (std::size_t i = 0; i < burst; ++i) {
      MpscNode* node = queue.try_pop();
      CHECK_MSG(node != nullptr, "round " + std::to_string(round));
      CHECK_EQ(as_item(node)->seq, i);
    }
    CHECK(queue.try_pop() == nullptr);
  }
}

KV_TEST(many_producers_one_consumer_exactly_once) {
  constexpr unsigned kProducers = 6;
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  constexpr std::size_t kPerProducer = 40000;
#else
  constexpr std::size_t kPerProducer = 200000;
#endif
  MpscQueue queue;
  std::vector<std::vector<Item>> items;
  for (unsigned p = 0; p < kProducers; ++p) items.emplace_back(kPerProducer);
  std::atomic<unsigned> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::jthread> producers;
  for (unsigned p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (std::size_t i = 0; i < kPerProducer; ++i) {
        items[p][i].producer = p;
        items[p][i].seq = i;
        queue.push(&items[p][i].node);
      }
    });
  }
  while (ready.load() != kProducers) std::this_thread::yield();
  go.store(true, std::memory_order_release);

  // The consumer pops while producers push: every node exactly once, and each producer's
  // nodes in the order it pushed them.
  std::vector<std::vector<unsigned char>> seen(kProducers,
                                               std::vector<unsigned char>(kPerProducer));
  std::vector<std::size_t> next_seq(kProducers, 0);
  std::size_t popped = 0, duplicates = 0, out_of_order = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (popped < kProducers * kPerProducer) {
    MpscNode* node = queue.try_pop();
    if (node == nullptr) {
      if (std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::yield();
      continue;
    }
    const Item* item = as_item(node);
    if (seen[item->producer][item->seq]++ != 0) ++duplicates;
    if (item->seq != next_seq[item->producer]) ++out_of_order;
    next_seq[item->producer] = item->seq + 1;
    ++popped;
  }
  for (auto& t : producers) t.join();
  CHECK_EQ(popped, kProducers * kPerProducer);
  CHECK_EQ(duplicates, std::size_t{0});
  CHECK_EQ(out_of_order, std::size_t{0});
  CHECK(queue.try_pop() == nullptr);
  for (unsigned p = 0; p < kProducers; ++p)
    for (std::size_t i = 0; i < kPerProducer; ++i)
      CHECK_MSG(seen[p][i] == 1, "producer " + std::to_string(p) + " item " + std::to_string(i));
}

KV_TEST(nodes_can_be_reused_after_pop) {
  // The engine frees a job right after popping it; a popped node must not be touched by the
  // queue again. Recycle the same few nodes through concurrent producers many times.
  constexpr unsigned kProducers = 4;
  constexpr std::size_t kRounds = 20000;
  MpscQueue queue;
  std::vector<Item> items(kProducers);
  std::vector<std::atomic<bool>> in_queue(kProducers);
  for (auto& flag : in_queue) flag.store(false);
  std::atomic<bool> stop{false};
  std::vector<std::size_t> pushes(kProducers, 0);
  std::vector<std::jthread> producers;
  for (unsigned p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      while (pushes[p] < kRounds && !stop.load(std::memory_order_relaxed)) {
        if (in_queue[p].load(std::memory_order_acquire)) {
          std::this_thread::yield();
          continue;
        }
        items[p].producer = p;
        items[p].seq = pushes[p]++;
        in_queue[p].store(true, std::memory_order_relaxed);
        queue.push(&items[p].node);
      }
    });
  }
  std::size_t popped = 0;
  std::vector<std::size_t> last(kProducers, 0);
  std::size_t bad = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (popped < kProducers * kRounds && std::chrono::steady_clock::now() < deadline) {
    MpscNode* node = queue.try_pop();
    if (node == nullptr) {
      std::this_thread::yield();
      continue;
    }
    Item* item = as_item(node);
    const unsigned p = item->producer;
    if (item->seq != last[p]) ++bad;
    last[p] = item->seq + 1;
    ++popped;
    in_queue[p].store(false, std::memory_order_release);  // hand the node back
  }
  stop.store(true);
  for (auto& t : producers) t.join();
  CHECK_EQ(bad, std::size_t{0});
  CHECK_EQ(popped, kProducers * kRounds);
}
