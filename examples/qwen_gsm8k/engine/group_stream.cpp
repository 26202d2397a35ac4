// Streaming dynamic sampling's schedule: see group_stream.hpp.
#include "qwen_gsm8k/engine/group_stream.hpp"

#include <dapo/core/error.hpp>

namespace qwen {

GroupStream::GroupStream(int64_t group_size, int64_t target_groups, int64_t max_groups)
    : group_size_(group_size), target_(target_groups), max_groups_(max_groups) {
  DAPO_REQUIRE(group_size > 0 && target_groups > 0 && max_groups >= 0, "qwen::GroupStream", "group_size ", group_size,
               ", target_groups ", target_groups, " and max_groups ", max_groups,
               " must be positive (max_groups 0: no bound)");
}

bool GroupStream::admit() {
  if (done() || (max_groups_ > 0 && pulled_ >= max_groups_)) return false;
  const double informative = decided_ > 0 ? static_cast<double>(kept_) / static_cast<double>(decided_) : 1.0;
  if (static_cast<double>(kept_) + informative * static_cast<double>(pulled_ - decided_) >=
      static_cast<double>(target_)) {
    return false;
  }
  ++pulled_;
  finished_.push_back(0);
  return true;
}

bool GroupStream::response_done(int64_t index) {
  DAPO_REQUIRE(index >= 0 && index < pulled_, "qwen::GroupStream::response_done", "group ", index,
               " was never admitted (", pulled_, " were)");
  auto& finished = finished_[static_cast<std::size_t>(index)];
  DAPO_REQUIRE(finished < group_size_, "qwen::GroupStream::response_done", "group ", index, " has all its ",
               group_size_, " responses already");
  return ++finished == group_size_;
}

bool GroupStream::decide(const std::function<bool(int64_t)>& keep) {
  while (!done() && decided_ < pulled_ && finished_[static_cast<std::size_t>(decided_)] == group_size_) {
    if (keep(decided_)) ++kept_;
    ++decided_;
  }
  return !done();
}

}  // namespace qwen
