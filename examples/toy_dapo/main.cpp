// toy_dapo: the whole DAPO loop of the library on a task small enough to learn in seconds on a CPU.
// Not a language model: a tiny autoregressive policy reads a prompt "a + b" (a, b < 10) and writes tokens; it is right
// when its first token is the last digit of a + b, and it should then stop (EOS) instead of rambling.
// It shows every piece wired together: group sampling, accuracy-based dynamic sampling (DynamicSampler), the soft
// overlong punishment (Eq. 13), group advantages, and several off-policy mini-batch updates per rollout, where the
// decoupled clip acts. Run: toy_dapo [--steps N] [--seed S]
#include <dapo/dapo.hpp>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr int64_t kDigits = 10, kEos = 10, kBos = 11, kVocab = 11;  // tokens 0..9, EOS; BOS only as input
constexpr int64_t kMaxLength = 4, kCacheLength = 2;                 // L_max and the soft zone of Eq. 13
constexpr int64_t kPrompts = kDigits * kDigits;

// Shapes: N = sequences, L = kMaxLength, V = kVocab, H = hidden width.
struct PolicyImpl : torch::nn::Module {
  PolicyImpl()
      : prompt(register_module("prompt", torch::nn::Embedding(kPrompts, 32))),
        previous(register_module("previous", torch::nn::Embedding(kVocab + 1, 32))),
        position(register_module("position", torch::nn::Embedding(kMaxLength, 32))),
        hidden(register_module("hidden", torch::nn::Linear(32, 64))),
        head(register_module("head", torch::nn::Linear(64, kVocab))) {
    // Start from the uniform policy: every prompt then gets ~1/11 right, so most groups are informative at step 1.
    torch::NoGradGuard no_grad;
    head->weight.zero_();
    head->bias.zero_();
  }

  // prompts [N], inputs [N, L] (BOS then the previous tokens) -> logits [N, L, V]
  torch::Tensor forward(const torch::Tensor& prompts, const torch::Tensor& inputs) {
    const auto positions = torch::arange(inputs.size(1), torch::kLong);
    const auto x = prompt(prompts).unsqueeze(1) + previous(inputs) + position(positions).unsqueeze(0);
    return head(torch::tanh(hidden(x)));
  }

  torch::nn::Embedding prompt, previous, position;
  torch::nn::Linear hidden, head;
};
TORCH_MODULE(Policy);

struct Rollouts {
  torch::Tensor prompts;  // [N]
  torch::Tensor tokens;   // [N, L], EOS included, padded with EOS
  torch::Tensor mask;     // [N, L] bool: response tokens
  torch::Tensor lengths;  // [N] int64
};

torch::Tensor shifted_inputs(const torch::Tensor& tokens) {  // [N, L] -> [N, L]: BOS, t0, t1, ...
  return torch::cat({torch::full({tokens.size(0), 1}, kBos, torch::kLong), tokens.slice(1, 0, -1)}, 1);
}

// Autoregressive sampling (temperature 1), or greedy decoding; every sequence stops at its EOS.
Rollouts generate(Policy& policy, const torch::Tensor& prompts, bool greedy) {
  torch::NoGradGuard no_grad;
  const int64_t n = prompts.size(0);
  auto tokens = torch::full({n, kMaxLength}, kEos, torch::kLong);
  auto finished = torch::zeros({n}, torch::kBool);
  auto lengths = torch::zeros({n}, torch::kLong);
  for (int64_t t = 0; t < kMaxLength; ++t) {
    const auto logits = policy->forward(prompts, shifted_inputs(tokens)).select(1, t);  // [N, V]
    const auto next = greedy ? logits.argmax(-1) : torch::multinomial(logits.softmax(-1), 1).squeeze(1);
    tokens.select(1, t).copy_(torch::where(finished, torch::full_like(next, kEos), next));
    lengths += (~finished).to(torch::kLong);
    finished |= next == kEos;
  }
  const auto mask = torch::arange(kMaxLength).unsqueeze(0) < lengths.unsqueeze(1);
  return {prompts, tokens, mask, lengths};
}

torch::Tensor token_logprobs(Policy& policy, const Rollouts& r) {  // -> [N, L]
  const auto logits = policy->forward(r.prompts, shifted_inputs(r.tokens));
  return logits.log_softmax(-1).gather(-1, r.tokens.unsqueeze(-1)).squeeze(-1);
}

torch::Tensor accuracy_of(const Rollouts& r) {  // [N] float: first token is (a + b) mod 10
  const auto target = (r.prompts.div(kDigits, "floor") + r.prompts % kDigits) % kDigits;
  return (r.tokens.select(1, 0) == target).to(torch::kFloat64);
}

double greedy_accuracy(Policy& policy) {
  return accuracy_of(generate(policy, torch::arange(kPrompts), /*greedy=*/true)).mean().item<double>();
}

}  // namespace

// One function of ~100 lines on purpose: the example reads top to bottom as the DAPO loop, its steps numbered, so a
// reader sees the library's whole use in one place (the driver, examples/qwen_gsm8k, splits the same loop by part).
int run(int argc, char** argv) {
  int steps = 100;
  uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps")
      steps = std::atoi(argv[i + 1]);
    else if (flag == "--seed")
      seed = std::strtoull(argv[i + 1], nullptr, 10);
    else {
      std::fprintf(stderr, "toy_dapo: unknown option '%s' (expected --steps N or --seed S)\n", flag.c_str());
      return 2;
    }
  }
  torch::manual_seed(seed);
  at::set_num_threads(2);

  // The paper's settings where they apply; the learning rate suits a 10K-parameter policy, not an LLM.
  constexpr int64_t kGroupSize = 8, kPromptsPerRound = 16, kTrainGroups = 16, kMiniBatches = 4, kEpochs = 2;
  const dapo::PolicyLossOptions loss_options{.clip_low = 0.2, .clip_high = 0.28};
  Policy policy;
  torch::optim::Adam optimizer(policy->parameters(), torch::optim::AdamOptions(3e-3));
  dapo::core::DynamicSampler<Rollouts> sampler(
      {.target_groups = kTrainGroups, .group_size = kGroupSize, .max_rounds = 20});

  const double start_accuracy = greedy_accuracy(policy);
  std::printf("toy_dapo: DAPO on 'last digit of a + b, then stop' (a small example of the dapo library)\n");
  std::printf("%5s %9s %9s %8s %7s %9s %9s %10s\n", "step", "accuracy", "reward", "length", "rounds", "clip_frac",
              "approx_kl", "greedy_acc");
  const auto started = std::chrono::steady_clock::now();
  for (int step = 1; step <= steps; ++step) {
    // 1. Generate groups until kTrainGroups of them disagree on accuracy (dynamic sampling, Eq. 11).
    double sampled_accuracy = 0.0;
    int64_t sampled = 0;
    bool exhausted = false;
    while (!sampler.ready() && !exhausted) {
      const auto prompts = torch::randint(kPrompts, {kPromptsPerRound}, torch::kLong).repeat_interleave(kGroupSize);
      const Rollouts round = generate(policy, prompts, /*greedy=*/false);
      const auto accuracy = accuracy_of(round);
      sampled_accuracy += accuracy.sum().item<double>();
      sampled += accuracy.numel();
      std::vector<Rollouts> groups;
      for (int64_t g = 0; g < kPromptsPerRound; ++g) {
        const auto rows = torch::indexing::Slice(g * kGroupSize, (g + 1) * kGroupSize);
        groups.push_back({round.prompts.index({rows}), round.tokens.index({rows}), round.mask.index({rows}),
                          round.lengths.index({rows})});
      }
      const auto flat = accuracy.contiguous();
      try {
        sampler.add_round(std::move(groups), std::span<const double>(flat.data_ptr<double>(), flat.numel()));
      } catch (const std::runtime_error& error) {
        // Nearly every group is all right (or all wrong): nothing left with a gradient. The run is over.
        std::printf("step %d: %s\n", step, error.what());
        exhausted = true;
      }
    }
    if (exhausted) break;
    const auto kept = sampler.take();
    auto cat = [&](auto member) {
      std::vector<torch::Tensor> parts;
      for (const auto& group : kept) parts.push_back(group.*member);
      return torch::cat(parts);
    };
    const Rollouts batch{cat(&Rollouts::prompts), cat(&Rollouts::tokens), cat(&Rollouts::mask),
                         cat(&Rollouts::lengths)};

    // 2. Rewards: accuracy plus the soft overlong punishment (Eq. 13); group-relative advantages.
    const auto rewards =
        accuracy_of(batch) + dapo::overlong_penalty(batch.lengths, kMaxLength, kCacheLength).to(torch::kFloat64);
    const auto advantages = dapo::group_advantages(rewards.to(torch::kFloat32), kGroupSize);
    const auto old_logp = [&] {
      torch::NoGradGuard no_grad;
      return token_logprobs(policy, batch);
    }();

    // 3. kEpochs passes over kMiniBatches mini-batches of whole groups: after the first update the data is
    //    off-policy, so the ratio leaves 1 and Clip-Higher bounds it.
    double clip_fraction = 0.0, approx_kl = 0.0;
    const int64_t groups_per_batch = kTrainGroups / kMiniBatches;
    for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
      for (int64_t mb = 0; mb < kMiniBatches; ++mb) {
        const auto rows =
            torch::indexing::Slice(mb * groups_per_batch * kGroupSize, (mb + 1) * groups_per_batch * kGroupSize);
        const Rollouts part{batch.prompts.index({rows}), batch.tokens.index({rows}), batch.mask.index({rows}),
                            batch.lengths.index({rows})};
        const auto out = dapo::policy_loss(token_logprobs(policy, part), old_logp.index({rows}),
                                           advantages.index({rows}), part.mask, loss_options);
        optimizer.zero_grad();
        out.loss.backward();
        optimizer.step();
        clip_fraction += out.clip_fraction.item<double>() / (kEpochs * kMiniBatches);
        approx_kl += out.approx_kl.item<double>() / (kEpochs * kMiniBatches);
      }
    }
    if (step % 10 == 0 || step == 1) {
      std::printf("%5d %9.3f %9.3f %8.2f %7lld %9.4f %9.5f %10.3f\n", step, sampled_accuracy / sampled,
                  rewards.mean().item<double>(), batch.lengths.to(torch::kFloat64).mean().item<double>(),
                  static_cast<long long>(sampler.last_rounds()), clip_fraction, approx_kl, greedy_accuracy(policy));
    }
  }
  const double end_accuracy = greedy_accuracy(policy);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("greedy accuracy on all %lld prompts: %.3f before DAPO, %.3f after (%.1f s)\n",
              static_cast<long long>(kPrompts), start_accuracy, end_accuracy, seconds);
  return end_accuracy > start_accuracy ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "toy_dapo: %s\n", error.what());
    return 1;
  }
}
