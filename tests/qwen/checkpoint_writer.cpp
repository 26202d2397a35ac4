// Test helper for checkpoint_test: writes checkpoints of a small model under ROOT, step FIRST_STEP, FIRST_STEP + 1, ...
// without end, each holding its step in every weight and every optimizer value, and reports its progress on stdout so
// that the test can kill it at a chosen point of a write. Not a user tool.
//   checkpoint_writer ROOT FIRST_STEP [STOP_AFTER]
// One line per stage, written before the next stage starts:
//   begin N       the temporary directory exists, nothing written into it yet
//   weights N     config.json and model.safetensors written
//   optimizer N   optimizer.pt written
//   state N       trainer_state.json written: the commit (fsync, rename, latest, deleting old ones) comes next
//   committed N   latest names step N and the old checkpoints beyond the newest 3 are gone
// With STOP_AFTER, the writer stops itself (SIGSTOP) right after its STOP_AFTER-th line, for an exact kill point.
#include <signal.h>
#include <unistd.h>

#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/checkpoint.hpp"

namespace {

long long lines_written = 0, stop_after = -1;

void report(const char* stage, int64_t step) {
  char line[64];
  const int length = std::snprintf(line, sizeof line, "%s %lld\n", stage, static_cast<long long>(step));
  if (::write(STDOUT_FILENO, line, static_cast<std::size_t>(length)) != length) std::_Exit(3);  // the test is gone
  if (++lines_written == stop_after) ::raise(SIGSTOP);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: checkpoint_writer ROOT FIRST_STEP [STOP_AFTER]\n");
    return 2;
  }
  const int64_t first_step = std::stoll(argv[2]);
  if (argc == 4) stop_after = std::stoll(argv[3]);
  at::set_num_threads(1);
  const qwen::Config config = qwen::Config::from_json({{"model_type", "qwen2"},
                                                       {"vocab_size", 4096},
                                                       {"hidden_size", 128},
                                                       {"intermediate_size", 256},
                                                       {"num_hidden_layers", 2},
                                                       {"num_attention_heads", 4},
                                                       {"num_key_value_heads", 2},
                                                       {"tie_word_embeddings", false}},
                                                      "checkpoint_writer");
  qwen::Qwen2ForCausalLM model(config);
  torch::NoGradGuard no_grad;
  for (int64_t step = first_step;; ++step) {
    for (auto& parameter : model->parameters())
      parameter.fill_(static_cast<double>(step));  // the step, in every weight
    char name[32];
    std::snprintf(name, sizeof name, "step-%06lld", static_cast<long long>(step));
    qwen::commit_checkpoint(
        argv[1], name,
        [&](const std::filesystem::path& dir) {
          report("begin", step);
          qwen::save_model(model, dir);
          report("weights", step);
          // Stands in for the optimizer's moments: as large as the weights, and holding the step too.
          std::vector<torch::Tensor> moments;
          for (const auto& parameter : model->parameters()) moments.push_back(parameter.clone());
          torch::save(moments, (dir / "optimizer.pt").string());
          report("optimizer", step);
          std::ofstream(dir / "trainer_state.json") << "{\"step\": " << step << "}\n";
          report("state", step);
        },
        /*keep=*/3);
    report("committed", step);
  }
}
