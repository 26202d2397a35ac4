// Streaming dynamic sampling's schedule (DAPO's dynamic sampling without rounds), shared by the trainer and
// rollout_bench: which prompt the engine may take next, and when its groups are decided. A group (the n responses of
// one prompt) is complete when its last response ends; complete groups are decided in prompt order, each once every
// group before it is, so that the batch is the first target informative groups in the order their prompts were
// taken, as sequential rounds would keep them, not in the order they finish (which would favour short responses).
// Admission control: no prompt is taken while the kept groups plus the undecided ones, at the informative share
// decided so far (1 before any is decided), would reach the target; fewer groups are then dropped at the end.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace qwen {

class GroupStream {
 public:
  // group_size responses per prompt; target_groups to keep; at most max_groups prompts (verl's max_num_gen_batches x
  // gen_batch_size; 0 = no bound).
  GroupStream(int64_t group_size, int64_t target_groups, int64_t max_groups);

  // Whether the engine may take another prompt now; if so it becomes group pulled() - 1.
  bool admit();
  // One response of group `index` ended; true when it was the group's last.
  bool response_done(int64_t index);
  // Decides, in prompt order, each complete group whose predecessors are decided: keep(index) says whether it joins
  // the batch. Stops at the target_groups-th kept group and returns false then (the engine's sink stops the run).
  bool decide(const std::function<bool(int64_t)>& keep);

  bool done() const { return kept_ >= target_; }
  int64_t pulled() const { return pulled_; }    // prompts taken
  int64_t decided() const { return decided_; }  // groups decided
  int64_t kept() const { return kept_; }
  int64_t dropped() const { return pulled_ - decided_; }  // taken but never decided: in flight or waiting at the stop

 private:
  int64_t group_size_, target_, max_groups_;
  int64_t pulled_ = 0, decided_ = 0, kept_ = 0;
  std::vector<int64_t> finished_;  // responses ended, by group
};

}  // namespace qwen
