// The BPE merge loop: a linked list of symbols and a priority queue of candidate merges.
#include "qwen_gsm8k/text/bpe.hpp"

#include <functional>
#include <queue>

namespace qwen::detail {

void MergeTable::add(int32_t left, int32_t right, int32_t rank, int32_t result) {
  merges_.insert_or_assign(pair_key(left, right), Merge{rank, result});
}

const MergeTable::Merge* MergeTable::find(int32_t left, int32_t right) const {
  const auto found = merges_.find(pair_key(left, right));
  return found == merges_.end() ? nullptr : &found->second;
}

// The order of `tokenizers`' priority queue: lowest rank, then leftmost. Stale queue entries are recognised because
// their result no longer matches the pair now at their position.
void MergeTable::apply(std::string_view piece, const std::array<int32_t, 256>& byte_ids,
                       std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // neighbours in the linked list, -1 at the ends
    bool alive;
  };
  struct Candidate {
    int32_t rank, pos, result;
    bool operator>(const Candidate& other) const { return rank != other.rank ? rank > other.rank : pos > other.pos; }
  };
  const auto n = static_cast<int32_t>(piece.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_ids[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1, true};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto push_pair = [&](int32_t left) {
    if (const Merge* merge = find(symbols[left].id, symbols[symbols[left].next].id)) {
      queue.push({merge->rank, left, merge->result});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const Merge* merge = find(left.id, right.id);
    if (merge == nullptr || merge->result != top.result) continue;
    left.id = top.result;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    if (left.next >= 0) push_pair(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

bool PieceCache::append_cached(std::string_view piece, std::vector<int32_t>& ids) const {
  std::lock_guard lock(mutex_);
  const auto found = entries_.find(piece);
  if (found == entries_.end()) return false;
  ids.insert(ids.end(), found->second.begin(), found->second.end());
  return true;
}

void PieceCache::insert(std::string_view piece, std::span<const int32_t> ids) const {
  if (piece.size() > kMaxPieceBytes) return;
  std::lock_guard lock(mutex_);
  if (entries_.size() >= kCapacity) return;
  entries_.try_emplace(std::string(piece), ids.begin(), ids.end());
}

}  // namespace qwen::detail
