#pragma once

#include <cstddef>

namespace kvtier::detail {

struct Job;

/// A load block waiting for pending stores of its path (read-after-write). The links live in
/// the job, allocated at submit, so parking never allocates on a worker.
struct ParkedLoad {
  Job* job = nullptr;
  std::size_t index = 0;
  ParkedLoad* next = nullptr;
};

/// Intrusive FIFO of parked loads. No locking of its own: its owner's lock guards it.
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
  /// Moves `other` to the end of this list, keeping its order.
  void append(ParkedList& other) noexcept {
    if (other.head == nullptr) return;
    (tail != nullptr ? tail->next : head) = other.head;
    tail = other.tail;
    size += other.size;
    other = ParkedList{};
  }
  /// Moves the loads for which `match(const ParkedLoad&)` holds to the end of `out`, keeping
  /// the order of both lists.
  template <class Match>
  void extract_if(Match match, ParkedList& out) noexcept {
    ParkedList kept;
    while (ParkedLoad* p = pop()) (match(*p) ? out : kept).push(p);
    *this = kept;
  }
};

}  // namespace kvtier::detail
