// Test helper: writes checkpoints of a small model under ROOT in an endless loop (step-000001, step-000002, ...),
// so that checkpoint_test can kill it with SIGKILL at arbitrary moments. Not a user tool.
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "qwen_gsm8k/train/checkpoint.hpp"
#include "qwen_gsm8k/model/weights.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: checkpoint_writer ROOT\n");
    return 2;
  }
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
  for (int64_t step = 1;; ++step) {
    torch::NoGradGuard no_grad;
    for (auto& parameter : model->parameters()) parameter.fill_(static_cast<double>(step));  // the step, in every weight
    char name[32];
    std::snprintf(name, sizeof name, "step-%06lld", static_cast<long long>(step));
    qwen::commit_checkpoint(
        argv[1], name,
        [&](const std::filesystem::path& dir) {
          qwen::save_model(model, dir);
          std::ofstream(dir / "trainer_state.json") << "{\"step\": " << step << "}\n";
        },
        /*keep=*/3);
  }
}
