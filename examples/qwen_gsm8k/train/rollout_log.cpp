// rollouts/step-NNNNNN.jsonl.
#include "qwen_gsm8k/train/rollout_log.hpp"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>

#include "qwen_gsm8k/common/atomic_file.hpp"
#include "qwen_gsm8k/common/run_directory.hpp"

namespace qwen {

std::filesystem::path write_rollout_log(const std::filesystem::path& output_dir, int64_t step,
                                        const std::vector<Group>& groups, const torch::Tensor& advantages,
                                        const Tokenizer& tokenizer, int64_t count) {
  if (count <= 0 || output_dir.empty()) return {};
  const torch::Tensor advantage = advantages.to(torch::kFloat64).cpu().contiguous();
  const auto* values = advantage.data_ptr<double>();
  std::ostringstream lines;
  int64_t row = 0;
  const auto written = std::min<std::size_t>(static_cast<std::size_t>(count), groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const Group& group = groups[g];
    const std::vector<int32_t> prompt_ids(group.prompt.begin(), group.prompt.end());
    const std::string prompt = g < written ? tokenizer.decode(prompt_ids) : std::string();
    for (const Response& response : group.responses) {
      if (g < written) {
        const nlohmann::json line{{"step", step},
                                  {"group", g},
                                  {"question", group.problem.question},
                                  {"reference", group.problem.reference},
                                  {"prompt", prompt},
                                  {"response", response.text},
                                  {"response_length", response.ids.size()},
                                  {"truncated", response.truncated},
                                  {"correct", response.score.correct},
                                  {"score", response.score.total},
                                  {"rewards",
                                   {{"correctness", response.score.parts.correctness},
                                    {"digit", response.score.parts.digit},
                                    {"format", response.score.parts.hard_format},
                                    {"mark", response.score.parts.mark},
                                    {"overlong", response.score.overlong}}},
                                  {"advantage", row < advantage.numel() ? values[row] : 0.0}};
        lines << line.dump() << "\n";
      }
      ++row;
    }
  }
  const auto path = RunDirectory{output_dir}.rollout_log(step);
  std::filesystem::create_directories(path.parent_path());
  write_file_atomically(path, lines.str());
  return path;
}

}  // namespace qwen
