// Data parallel with c10d over 127.0.0.1: 2 Gloo ranks and 1 process reach the same parameters from the same
// rollouts, and so does a resumed 2-rank run; a killed rank, and a frozen one, make the other stop with an error naming
// it; the rendezvous variables are checked; rollouts survive their exchange between ranks exactly.
#include <signal.h>

#include <torch/torch.h>

#include <chrono>
#include <cstdlib>

#include "qwen_gsm8k/common/json_lines.hpp"
#include "qwen_gsm8k/dist/distributed.hpp"
#include "qwen_gsm8k/train/rollout.hpp"
#include "support/process.hpp"
#include "support/qwen_fixtures.hpp"

namespace {

using dapo::test::read_text;

int free_port() {
  const auto port = qwen::free_loopback_port();
  REQUIRE(port.has_value());
  return *port;
}

// The worker as `rank` of `world` (world 0: no rendezvous variables), its stderr into `log`; its stdout (progress
// lines) into a pipe when `progress`, else into `log` + ".out".
std::unique_ptr<dapo::test::Child> start_worker(const std::vector<std::string>& arguments, int rank, int world,
                                                int port, const std::filesystem::path& log, bool progress = false) {
  dapo::test::SpawnOptions options;
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    options.environment.emplace_back(name, std::nullopt);
  }
  if (world > 0) {
    options.environment.emplace_back("RANK", std::to_string(rank));
    options.environment.emplace_back("WORLD_SIZE", std::to_string(world));
    options.environment.emplace_back("MASTER_ADDR", "127.0.0.1");
    options.environment.emplace_back("MASTER_PORT", std::to_string(port));
  }
  options.pipe_stdout = progress;
  if (!progress) options.stdout_file = log.string() + ".out";
  options.stderr_file = log;
  std::vector<std::string> args{DISTRIBUTED_WORKER};
  args.insert(args.end(), arguments.begin(), arguments.end());
  return std::make_unique<dapo::test::Child>(args, options);
}

std::vector<torch::Tensor> load_parameters(const std::filesystem::path& path) {
  std::vector<torch::Tensor> parameters;
  torch::load(parameters, path.string());
  return parameters;
}

// Largest |a - b| / max(|b|, 1e-3) over every element of every tensor.
double max_relative_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].sizes() == b[i].sizes());
    const torch::Tensor x = a[i].to(torch::kFloat64), y = b[i].to(torch::kFloat64);
    worst = std::max(worst, ((x - y).abs() / y.abs().clamp_min(1e-3)).max().item<double>());
  }
  return worst;
}

void check_two_ranks_match_one_process(const std::string& dtype, double tolerance) {
  dapo::test::ScratchDir scratch;
  const auto single = scratch.path() / "single", ranks = scratch.path() / "ranks";
  std::filesystem::create_directories(single);
  std::filesystem::create_directories(ranks);
  // One process with micro-batches of 1 group computes each mini-batch (2 groups) in the same slices as 2 ranks of
  // 1 group each.
  const auto alone = start_worker({"train", single.string(), "1", dtype}, 0, 0, 0, single / "log");
  REQUIRE_MESSAGE(alone->wait() == 0, read_text(single / "log"));
  const int port = free_port();
  const auto rank0 = start_worker({"train", ranks.string(), "0", dtype}, 0, 2, port, ranks / "log0");
  const auto rank1 = start_worker({"train", ranks.string(), "0", dtype}, 1, 2, port, ranks / "log1");
  const int status0 = rank0->wait(), status1 = rank1->wait();
  REQUIRE_MESSAGE(status0 == 0, read_text(ranks / "log0"));
  REQUIRE_MESSAGE(status1 == 0, read_text(ranks / "log1"));

  const auto reference = load_parameters(single / "params-rank0.pt");
  const auto first = load_parameters(ranks / "params-rank0.pt"), second = load_parameters(ranks / "params-rank1.pt");
  CHECK(std::string(c10::toString(reference[0].scalar_type())) == (dtype == "float64" ? "Double" : "Float"));
  const double across_ranks = max_relative_difference(first, second);
  const double versus_single = max_relative_difference(first, reference);
  MESSAGE(dtype << ": rank 0 vs rank 1 " << across_ranks << ", 2 ranks vs 1 process " << versus_single);
  CHECK(across_ranks == 0.0);  // the same all-reduced gradients, the same optimizer: the very same bits
  // Rank 1 started from its own random weights and got rank 0's; training moved them.
  CHECK(max_relative_difference(load_parameters(ranks / "initial-rank1.pt"),
                                load_parameters(ranks / "initial-rank0.pt")) == 0.0);
  CHECK(max_relative_difference(first, load_parameters(ranks / "initial-rank0.pt")) > 1e-3);
  CHECK(versus_single <= tolerance);

  // The run trained (the parameters moved) and the metrics of the 2-rank run are the single process's.
  const auto metrics_single = dapo::test::read_json(single / "metrics.json");
  const auto metrics_ranks = dapo::test::read_json(ranks / "metrics.json");
  REQUIRE(metrics_single.size() == 3);
  REQUIRE(metrics_ranks.size() == 3);
  for (std::size_t step = 0; step < 3; ++step) {
    for (const char* key : {"sampled/score/mean", "sampled/accuracy", "dapo/kept_groups", "dapo/filtered_groups",
                            "train/num_gen_batches", "critic/score/mean", "response_length/mean"}) {
      CHECK(metrics_single[step].at(key) == metrics_ranks[step].at(key));
    }
    for (const char* key : {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/grad_norm",
                            "actor/kl_loss", "training/rollout_probs_diff_max", "training/rollout_probs_diff_mean",
                            "rollout_corr/rollout_rs_masked_fraction"}) {
      CHECK(metrics_ranks[step].at(key).get<double>() ==
            doctest::Approx(metrics_single[step].at(key).get<double>()).epsilon(tolerance * 10));
    }
  }
  CHECK(metrics_ranks[0].at("dapo/filtered_groups").get<int64_t>() +
            metrics_ranks[1].at("dapo/filtered_groups").get<int64_t>() +
            metrics_ranks[2].at("dapo/filtered_groups").get<int64_t>() >
        0);                                                             // the fixed rollouts exercise dynamic sampling
  CHECK(metrics_ranks[2].at("actor/pg_clipfrac").get<double>() > 0.0);  // and the off-policy updates clip
  // Rollout correction rejected some tokens and kept most; the KL loss acted.
  CHECK(metrics_ranks[0].at("rollout_corr/rollout_rs_masked_fraction").get<double>() > 0.0);
  CHECK(metrics_ranks[0].at("rollout_corr/rollout_rs_masked_fraction").get<double>() < 0.5);
  CHECK(metrics_ranks[2].at("actor/kl_loss").get<double>() > 0.0);
}

}  // namespace

TEST_CASE("2 Gloo ranks reach the parameters of 1 process on the same rollouts (float64 and float32)") {
  check_two_ranks_match_one_process("float64", 1e-9);
  check_two_ranks_match_one_process("float32", 1e-5);
}

TEST_CASE("2 ranks resumed from a checkpoint of step 2 reach the parameters of an uninterrupted 3-step run") {
  dapo::test::ScratchDir scratch;
  auto run_two_ranks = [&](const std::string& name, const std::vector<std::string>& extra) {
    const auto dir = scratch.path() / name;
    std::filesystem::create_directories(dir);
    std::vector<std::string> arguments{"train", dir.string(), "0", "float32"};
    arguments.insert(arguments.end(), extra.begin(), extra.end());
    const int port = free_port();
    const auto rank0 = start_worker(arguments, 0, 2, port, dir / "log0");
    const auto rank1 = start_worker(arguments, 1, 2, port, dir / "log1");
    const int status0 = rank0->wait(), status1 = rank1->wait();
    REQUIRE_MESSAGE(status0 == 0, read_text(dir / "log0"));
    REQUIRE_MESSAGE(status1 == 0, read_text(dir / "log1"));
    return dir;
  };
  const auto whole = run_two_ranks("whole", {"3"});
  const auto first = run_two_ranks("first", {"2"});
  const auto checkpoint = first / "run" / "checkpoints" / "step-000002";
  REQUIRE(std::filesystem::exists(checkpoint / "trainer_state.json"));
  const auto resumed = run_two_ranks("resumed", {"3", checkpoint.string()});
  CHECK(max_relative_difference(load_parameters(resumed / "params-rank0.pt"),
                                load_parameters(whole / "params-rank0.pt")) == 0.0);
  CHECK(max_relative_difference(load_parameters(resumed / "params-rank1.pt"),
                                load_parameters(whole / "params-rank0.pt")) == 0.0);
  // Rank 0 alone wrote its rows: one per step it ran (the resumed run has its own output directory).
  CHECK(qwen::read_json_lines(resumed / "run" / "metrics.jsonl").size() == 1);
  CHECK(qwen::read_json_lines(whole / "run" / "metrics.jsonl").size() == 3);
}

namespace {

// Two ranks of the endless training loop, once rank 1 has reported its first step (which it finished together with
// rank 0: a step ends with collectives).
struct TrainingRanks {
  std::unique_ptr<dapo::test::Child> rank0, rank1;
};
TrainingRanks start_training_ranks(const std::filesystem::path& dir) {
  const int port = free_port();
  TrainingRanks ranks{start_worker({"loop", dir.string()}, 0, 2, port, dir / "log0"),
                      start_worker({"loop", dir.string()}, 1, 2, port, dir / "log1", /*progress=*/true)};
  std::optional<std::string> line;
  while ((line = ranks.rank1->read_line()) && *line != "step 1") {
  }
  REQUIRE_MESSAGE(line.has_value(), "rank 1 ended before its first step; its log:\n"
                                        << read_text(dir / "log1") << "rank 0's log:\n"
                                        << read_text(dir / "log0"));
  return ranks;
}

}  // namespace

// In both cases rank 0 must stop by itself: the driver's collective timeout (20 s in the worker) is the only clock;
// Child::wait's hang guard, far above it, fails the test only if rank 0 would hang. The time taken is reported, never
// checked, so a slow machine passes as long as rank 0 does stop and names rank 1.
TEST_CASE("a rank killed mid-run makes the other exit non-zero naming it") {
  dapo::test::ScratchDir scratch;
  const auto ranks = start_training_ranks(scratch.path());
  ranks.rank1->signal(SIGKILL);  // without warning
  CHECK(ranks.rank1->wait() == 128 + SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  const int status = ranks.rank0->wait();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  const std::string log = read_text(scratch.path() / "log0");
  MESSAGE("rank 0 stopped " << seconds << " s after rank 1 was killed: " << log);
  CHECK(status != 0);
  CHECK(log.find("lost rank 1") != std::string::npos);
}

TEST_CASE("a rank that hangs (stopped) makes the other exit at the collective timeout naming it") {
  dapo::test::ScratchDir scratch;
  const auto ranks = start_training_ranks(scratch.path());
  ranks.rank1->signal(SIGSTOP);  // alive but silent: no collective, no heartbeat
  ranks.rank1->wait_stopped();
  const auto stopped_at = std::chrono::steady_clock::now();
  const int status = ranks.rank0->wait();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  const std::string log = read_text(scratch.path() / "log0");
  MESSAGE("rank 0 stopped " << seconds << " s after rank 1 was frozen: " << log);
  CHECK(status != 0);
  CHECK(log.find("lost rank 1") != std::string::npos);
  // rank 1 is still frozen; its Child kills it on the way out.
}

TEST_CASE("rendezvous variables: torchrun's names, checked") {
  auto with = [](std::vector<std::pair<const char*, const char*>> variables) {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(name);
    for (const auto& [name, value] : variables) ::setenv(name, value, 1);
    struct Restore {
      ~Restore() {
        for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(name);
      }
    };
    Restore restore;
    return qwen::DistributedConfig::from_environment();
  };
  CHECK(with({}).world_size == 1);
  const auto config = with(
      {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.0.0.2"}, {"MASTER_PORT", "29511"}});
  CHECK(config.rank == 1);
  CHECK(config.world_size == 4);
  CHECK(config.master_addr == "10.0.0.2");
  CHECK(config.master_port == 29511);
  CHECK_THROWS_WITH_AS(with({{"RANK", "0"}}), doctest::Contains("RANK and WORLD_SIZE must be set together"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(with({{"RANK", "4"}, {"WORLD_SIZE", "4"}}), doctest::Contains("RANK is 4"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(with({{"RANK", "0"}, {"WORLD_SIZE", "two"}}), doctest::Contains("WORLD_SIZE is \"two\""),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}),
                       doctest::Contains("MASTER_PORT is 70000"), std::invalid_argument);
}

TEST_CASE("rollouts survive their exchange between ranks exactly; shares are contiguous and balanced") {
  qwen::Group group;
  group.problem = {"Tom has 6 coins. \xE4\xBD\xA0 \"quoted\"", "-7.5",
                   qwen::Arithmetic{6, qwen::Arithmetic::Operation::kSubtract, 4}};
  group.prompt = {151644, 8948, 0, 255};
  qwen::Response response;
  response.ids = {1, 2, 151645};
  response.text = "<answer>1,080</answer>";
  response.truncated = true;
  response.score.parts = {2.0, 0.5, 0.0, 0.25};
  response.score.overlong = -0.375;
  response.score.total = 2.375;
  response.score.correct = true;
  response.logprobs = {-0.125f, -3.0e-7f, -17.25f};  // every float exact in the exchange
  group.responses = {response, qwen::Response{}};
  const std::vector<qwen::Group> groups{group, qwen::Group{}};
  const std::vector<double> encoded = qwen::encode_groups(groups);
  const auto decoded = qwen::decode_groups(encoded.data(), encoded.size());
  REQUIRE(decoded.size() == 2);
  CHECK(decoded[0].problem.question == group.problem.question);
  CHECK(decoded[0].problem.reference == "-7.5");
  REQUIRE(decoded[0].problem.arithmetic.has_value());
  CHECK(decoded[0].problem.arithmetic->result() == 2);
  CHECK(decoded[0].prompt == group.prompt);
  REQUIRE(decoded[0].responses.size() == 2);
  CHECK(decoded[0].responses[0].ids == response.ids);
  CHECK(decoded[0].responses[0].text == response.text);
  CHECK(decoded[0].responses[0].truncated);
  CHECK(decoded[0].responses[0].score.parts.mark == 0.25);
  CHECK(decoded[0].responses[0].score.overlong == -0.375);
  CHECK(decoded[0].responses[0].logprobs == response.logprobs);
  CHECK(decoded[0].responses[1].logprobs.empty());
  CHECK(decoded[0].responses[0].score.total == 2.375);
  CHECK(decoded[0].responses[0].score.correct);
  CHECK(decoded[1].responses.empty());
  CHECK_THROWS_WITH_AS(qwen::decode_groups(encoded.data(), encoded.size() - 1), doctest::Contains("end early"),
                       std::runtime_error);

  // shard(): world 1 is everything; 3 ranks split 7 as 3, 2, 2.
  auto text = [](std::pair<int64_t, int64_t> range) {
    return std::to_string(range.first) + ".." + std::to_string(range.second);
  };
  const auto single = qwen::Communicator::create({}, torch::kCPU);
  CHECK(text(single->shard(7)) == "0..7");
  CHECK(text(qwen::Communicator::share(7, 0, 3)) == "0..3");
  CHECK(text(qwen::Communicator::share(7, 1, 3)) == "3..5");
  CHECK(text(qwen::Communicator::share(7, 2, 3)) == "5..7");
  CHECK(text(qwen::Communicator::share(1, 1, 2)) == "1..1");  // nothing left: an empty share
}
