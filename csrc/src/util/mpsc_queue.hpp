#pragma once

#include <atomic>

namespace kvtier::detail {

/// Intrusive link for MpscQueue; embed it in the object being queued.
struct MpscNode {
  std::atomic<MpscNode*> next{nullptr};
};

/// Lock-free multi-producer / single-consumer queue of intrusive nodes (Vyukov's design).
///
/// push() is wait-free: one exchange and one store, never blocks, never allocates, so worker
/// threads can publish completions from any state. try_pop() never blocks; while a producer
/// is between its two steps the consumer sees the queue as (momentarily) shorter and simply
/// finds that node on a later call.
class MpscQueue {
 public:
  MpscQueue() noexcept : head_(&stub_), tail_(&stub_) {}
  MpscQueue(const MpscQueue&) = delete;
  MpscQueue& operator=(const MpscQueue&) = delete;

  void push(MpscNode* node) noexcept {
    node->next.store(nullptr, std::memory_order_relaxed);
    // acq_rel: release publishes the node's payload to the consumer; acquire orders us after
    // the previous producer so the link below targets a fully initialised node.
    MpscNode* prev = head_.exchange(node, std::memory_order_acq_rel);
    prev->next.store(node, std::memory_order_release);
  }

  /// Returns the oldest node, or nullptr if none is (yet) available. Single consumer only.
  [[nodiscard]] MpscNode* try_pop() noexcept {
    MpscNode* tail = tail_;
    MpscNode* next = tail->next.load(std::memory_order_acquire);
    if (tail == &stub_) {
      if (next == nullptr) return nullptr;
      tail_ = next;
      tail = next;
      next = next->next.load(std::memory_order_acquire);
    }
    if (next != nullptr) {
      tail_ = next;
      return tail;
    }
    if (tail != head_.load(std::memory_order_acquire)) return nullptr;  // producer mid-push
    // `tail` is the last node: re-insert the stub behind it so `tail` can be handed out.
    push(&stub_);
    next = tail->next.load(std::memory_order_acquire);
    if (next != nullptr) {
      tail_ = next;
      return tail;
    }
    return nullptr;
  }

 private:
  // Producers hammer head_, the consumer owns tail_: separate cache lines avoid false sharing.
  alignas(64) std::atomic<MpscNode*> head_;
  alignas(64) MpscNode* tail_;
  MpscNode stub_;
};

}  // namespace kvtier::detail
