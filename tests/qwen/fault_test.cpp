// Fault cases of a training run (docs/reliability.md, "Fault cases"), on the real qwen_gsm8k program and a tiny model
// written here: a preempted job (SIGTERM, SIGINT, one rank among two), a disk that fills up while a checkpoint is
// written (a file size limit on the process), and checkpoints damaged before a resume. Every signal follows a line the
// program printed, never the clock; the runs are a few GRPO steps of a 165K-parameter model, seconds each.
#include <signal.h>

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "qwen_gsm8k/common/json_lines.hpp"
#include "qwen_gsm8k/common/zip_check.hpp"
#include "qwen_gsm8k/demo/demo.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/text/tokenizer.hpp"
#include "qwen_gsm8k/train/checkpoint.hpp"
#include "qwen_gsm8k/train/trainer_state_file.hpp"
#include "support/files.hpp"
#include "support/process.hpp"
#include "support/qwen_fixtures.hpp"

namespace {

namespace fs = std::filesystem;
using dapo::test::contains;
using dapo::test::read_file;
using dapo::test::write_file;

// tokenizer.json of a byte-level tokenizer: the 256 bytes as GPT-2 byte-level tokens, no merges, then <|endoftext|>,
// <|im_start|> and <|im_end|> as 256..258, the demo model's vocabulary of 259.
nlohmann::json byte_tokenizer_json() {
  const qwen::Tokenizer bytes = qwen::Tokenizer::byte_level({});
  nlohmann::json vocab = nlohmann::json::object();
  for (int32_t byte = 0; byte < 256; ++byte) vocab[bytes.id_to_token(byte)] = byte;
  nlohmann::json added = nlohmann::json::array();
  int32_t id = 256;
  for (const char* token : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    added.push_back({{"id", id++}, {"content", token}, {"special", true}});
  }
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"use_regex", true}, {"add_prefix_space", false}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
}

// A model directory the train command takes (the demo's tiny model with random weights, the tokenizer above) and 16
// GSM8K-style problems, in a scratch directory.
class TinyRun {
 public:
  TinyRun() : model_(scratch_.path() / "model"), train_(scratch_.path() / "train.jsonl") {
    torch::manual_seed(0);
    qwen::Qwen2ForCausalLM model(qwen::demo_model_config());
    qwen::initialize_weights(model);
    qwen::save_model(model, model_);
    write_file(model_ / "tokenizer.json", byte_tokenizer_json().dump());
    std::string lines;
    for (int a = 1; a <= 16; ++a) {
      const int b = 17 - a;
      lines += nlohmann::json{{"question", "What is " + std::to_string(a) + " plus " + std::to_string(b) + "?"},
                              {"answer", std::to_string(a) + " + " + std::to_string(b) + " = 17\n#### 17"}}
                   .dump() +
               "\n";
    }
    write_file(train_, lines);
  }

  fs::path dir(const std::string& name) const { return scratch_.path() / name; }

  // `steps` GRPO steps (no dynamic sampling: a random model is never right) of 2 prompts x 2 responses, 8 new
  // tokens, 2 updates per step; a checkpoint every `save_every` steps (by default none but the final one); one
  // thread, so that two runs agree to the bit.
  std::vector<std::string> train(const fs::path& output, int steps, const std::vector<std::string>& extra = {},
                                 int save_every = 100) const {
    std::vector<std::string> command{QWEN_GSM8K,
                                     "--threads",
                                     "1",
                                     "train",
                                     "--model",
                                     model_.string(),
                                     "--train",
                                     train_.string(),
                                     "--output",
                                     output.string(),
                                     "--algo",
                                     "grpo",
                                     "--steps",
                                     std::to_string(steps),
                                     "--train-batch-size",
                                     "2",
                                     "--rollout-n",
                                     "2",
                                     "--ppo-mini-batch-size",
                                     "1",
                                     "--max-new-tokens",
                                     "8",
                                     "--overlong-buffer-len",
                                     "4",
                                     "--lr",
                                     "1e-3",
                                     "--seed",
                                     "3",
                                     "--save-every",
                                     std::to_string(save_every)};
    command.insert(command.end(), extra.begin(), extra.end());
    return command;
  }

 private:
  dapo::test::ScratchDir scratch_;
  fs::path model_, train_;
};

dapo::test::SpawnOptions spawn_options(const fs::path& log) {
  dapo::test::SpawnOptions options;
  // OpenBLAS's sums follow its thread count: every run gets the same one, for runs to agree to the bit.
  options.environment = {{"OMP_NUM_THREADS", "1"}, {"RANK", std::nullopt}, {"WORLD_SIZE", std::nullopt}};
  options.stderr_file = log;
  return options;
}

struct Finished {
  int status = -1;
  bool killed = false;  // by a signal (status is then 128 + it)
  std::string output;   // stdout and stderr
  std::string errors;   // stderr
};

// Runs `command` to its end, stdout and stderr into files beside `log`.
Finished run_to_end(const std::vector<std::string>& command, const fs::path& log,
                    std::optional<rlim_t> file_size_limit = std::nullopt) {
  auto options = spawn_options(log);
  options.stdout_file = log.string() + ".out";
  options.file_size_limit = file_size_limit;
  dapo::test::Child child(command, options);
  Finished result;
  result.status = child.wait();
  result.killed = child.killed_by_signal();
  result.errors = dapo::test::read_text(log);
  result.output = dapo::test::read_text(log.string() + ".out") + result.errors;
  return result;
}

// Reads the child's lines until one starts with `prefix`; fails, showing what came instead, if the child ends first.
void wait_for_line_starting(dapo::test::Child& child, const std::string& prefix) {
  std::string seen;
  while (const auto line = child.read_line()) {
    if (line->rfind(prefix, 0) == 0) return;
    seen += *line + "\n";
  }
  FAIL("the program ended without a line starting \"" << prefix << "\"; it printed:\n" << seen);
}

// Every file under `dir` (relative path -> bytes; directories as "<dir>"), to show that nothing changed.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    const std::string name = fs::relative(entry.path(), dir).string();
    files[name] = entry.is_directory() ? "<dir>" : read_file(entry.path());
  }
  return files;
}

// The clock's metrics (timing_s/*, perf/* but the token count) differ between two runs of the same step.
std::vector<nlohmann::json> rows_without_clock(const fs::path& path) {
  std::vector<nlohmann::json> rows;
  for (nlohmann::json row : qwen::read_json_lines(path)) {
    for (auto it = row.begin(); it != row.end();) {
      const std::string& key = it.key();
      const bool timing = key.starts_with("timing_s/") || (key.starts_with("perf/") && key != "perf/total_num_tokens");
      it = timing ? row.erase(it) : std::next(it);
    }
    rows.push_back(row);
  }
  return rows;
}

// The complete checkpoint directories under root (never a .partial- one).
std::vector<std::string> checkpoint_names(const fs::path& root) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

int64_t checkpoint_step(const fs::path& dir) {
  return dapo::test::read_json(dir / "trainer_state.json").at("step").get<int64_t>();
}

// Stops a run of `steps` steps with `signal` once it printed step 1's progress line. The stop comes after the step
// under way when the signal reached the process (or, through a launcher, every rank): returns that step, after
// checking the status, the stop line, and that the checkpoint written at the stop is the only one, complete and
// loadable.
int64_t stop_run(const TinyRun& setup, const fs::path& output, int signal, int steps,
                 const std::vector<std::string>& extra = {}) {
  auto options = spawn_options(output.string() + ".log");
  options.pipe_stdout = true;
  dapo::test::Child child(setup.train(output, steps, extra), options);
  wait_for_line_starting(child, "step 1/" + std::to_string(steps) + " |");
  child.signal(signal);
  while (child.read_line()) {
  }
  const int status = child.wait();
  const std::string errors = dapo::test::read_text(output.string() + ".log");
  INFO("stderr: " << errors);
  CHECK_FALSE(child.killed_by_signal());  // it ended by itself, after its checkpoint
  REQUIRE(status == 128 + signal);
  const auto root = output / "checkpoints";
  const auto latest = qwen::find_checkpoint(root);
  REQUIRE(latest.has_value());
  const int64_t step = checkpoint_step(*latest);
  CHECK(step >= 1);
  CHECK(step < steps);
  const std::string name = latest->filename().string();
  CHECK(contains(errors, std::string("qwen_gsm8k: stopped by ") + (signal == SIGTERM ? "SIGTERM" : "SIGINT") +
                             " after step " + std::to_string(step) + "; checkpoint " + (root / name).string() +
                             "; continue with the same command plus --resume " + root.string()));
  CHECK(checkpoint_names(root) == std::vector<std::string>{name});  // --save-every 100: only the stop wrote one
  CHECK(qwen::read_json_lines(output / "metrics.jsonl").size() == static_cast<std::size_t>(step));
  qwen::load_model(*latest);  // complete: it loads
  return step;
}

}  // namespace

TEST_CASE(
    "fault: SIGTERM mid-run stops after the step with a checkpoint, status 143; --resume ends as an uninterrupted "
    "run") {
  TinyRun setup;
  const auto reference = setup.dir("reference");
  const Finished whole = run_to_end(setup.train(reference, 4), setup.dir("reference.log"));
  REQUIRE_MESSAGE(whole.status == 0, whole.output);

  const auto output = setup.dir("stopped");
  const int64_t step = stop_run(setup, output, SIGTERM, 4);
  CHECK(step <= 2);  // the step whose line came, or the one under way when the signal came right after it
  const Finished resumed =
      run_to_end(setup.train(output, 4, {"--resume", (output / "checkpoints").string()}), setup.dir("resumed.log"));
  REQUIRE_MESSAGE(resumed.status == 0, resumed.output);
  CHECK(contains(resumed.output, "resumed at step " + std::to_string(step)));
  // The same metrics rows (clock fields aside) and the same final weights, to the bit.
  CHECK(rows_without_clock(output / "metrics.jsonl") == rows_without_clock(reference / "metrics.jsonl"));
  const auto final_weights = fs::path("checkpoints") / "step-000004" / "model.safetensors";
  CHECK(read_file(output / final_weights) == read_file(reference / final_weights));
}

TEST_CASE(
    "fault: SIGKILL after a periodic checkpoint; --resume with a smaller micro-batch (memory) repeats the run within "
    "float32 rounding; a changed learning rate is refused") {
  TinyRun setup;
  // Two groups per update in one micro-batch; the resumed run cuts the update into two micro-batches of one group.
  const auto command = [&](const fs::path& output, const std::vector<std::pair<std::string, std::string>>& settings) {
    std::vector<std::string> arguments = setup.train(output, 3, {}, 2);
    for (const auto& [name, value] : settings) {
      const auto given = std::find(arguments.begin(), arguments.end(), name);
      if (given == arguments.end()) {
        arguments.insert(arguments.end(), {name, value});
      } else {
        *std::next(given) = value;
      }
    }
    return arguments;
  };
  const std::vector<std::pair<std::string, std::string>> whole_batch{{"--ppo-mini-batch-size", "2"},
                                                                     {"--ppo-micro-batch-size", "2"}};
  const auto reference = setup.dir("reference");
  const Finished whole = run_to_end(command(reference, whole_batch), setup.dir("reference.log"));
  REQUIRE_MESSAGE(whole.status == 0, whole.output);

  // Killed without warning right after step 2's checkpoint (--save-every 2), while step 3 runs.
  const auto output = setup.dir("killed");
  {
    auto options = spawn_options(output.string() + ".log");
    options.pipe_stdout = true;
    dapo::test::Child child(command(output, whole_batch), options);
    wait_for_line_starting(child, "checkpoint step-000002: saved");
    child.signal(SIGKILL);
    while (child.read_line()) {
    }
    REQUIRE(child.wait() == 128 + SIGKILL);
  }
  const auto root = output / "checkpoints";
  REQUIRE(qwen::find_checkpoint(root) == root / "step-000002");

  // A setting that changes what an update computes is refused, naming it; the run directory is left as it was.
  const auto before = snapshot(output);
  auto other_lr = whole_batch;
  other_lr.insert(other_lr.end(), {{"--lr", "2e-3"}, {"--resume", root.string()}});
  const Finished refused = run_to_end(command(output, other_lr), setup.dir("refused.log"));
  CHECK(refused.status != 0);
  CHECK(contains(refused.errors, "option lr was 0.001 in the checkpointed run but is 0.002 now"));
  CHECK(contains(refused.errors, "a resume may change only"));
  CHECK(snapshot(output) == before);

  // One group per micro-batch: taken, and said.
  const Finished resumed = run_to_end(
      command(output, {{"--ppo-mini-batch-size", "2"}, {"--ppo-micro-batch-size", "1"}, {"--resume", root.string()}}),
      setup.dir("resumed.log"));
  REQUIRE_MESSAGE(resumed.status == 0, resumed.output);
  CHECK(contains(resumed.output, "resumed at step 2"));
  CHECK(contains(resumed.output, "resume from step-000002: took ppo_micro_batch_size 2 -> 1 (memory"));
  // Steps 1 and 2 are the checkpointed run's rows; step 3 (from the same weights, the same rollouts) sums its
  // update's two micro-batches where the reference summed one: every metric within float32 rounding.
  const std::vector<nlohmann::json> got = rows_without_clock(output / "metrics.jsonl");
  const std::vector<nlohmann::json> want = rows_without_clock(reference / "metrics.jsonl");
  REQUIRE(got.size() == 3);
  REQUIRE(want.size() == 3);
  CHECK(got[0] == want[0]);
  CHECK(got[1] == want[1]);
  int compared = 0;
  double largest = 0.0;
  for (const auto& [key, value] : want[2].items()) {
    CAPTURE(key);
    REQUIRE(got[2].contains(key));
    if (!value.is_number()) {
      CHECK(got[2].at(key) == value);
      continue;
    }
    const double expected = value.get<double>(), actual = got[2].at(key).get<double>();
    const double difference = std::abs(actual - expected) / std::max(1.0, std::abs(expected));
    CHECK(difference <= 1e-5);
    largest = std::max(largest, difference);
    ++compared;
  }
  MESSAGE("step 3 with one micro-batch against two: " << compared << " metrics, largest difference " << largest);
  CHECK(compared > 10);
  CHECK(got[2].size() == want[2].size());
}

TEST_CASE("fault: --device cuda where CUDA cannot run is refused before --overwrite removes the run it would replace") {
  if (torch::cuda::is_available()) {
    MESSAGE("a GPU is visible: --device cuda runs here, nothing to refuse");
    return;
  }
  TinyRun setup;
  const auto output = setup.dir("run");
  const Finished first = run_to_end(setup.train(output, 1), setup.dir("first.log"));
  REQUIRE_MESSAGE(first.status == 0, first.output);
  const auto before = snapshot(output);
  const Finished refused =
      run_to_end(setup.train(output, 1, {"--device", "cuda", "--overwrite"}), setup.dir("refused.log"));
  CHECK(refused.status != 0);
  CHECK(contains(refused.errors, "train: --device cuda asks for CUDA"));
  CHECK(snapshot(output) == before);  // the old run is still there, every byte
}

TEST_CASE("fault: SIGINT (Ctrl-C) stops the same way with status 130; a second signal kills at once") {
  TinyRun setup;
  CHECK(stop_run(setup, setup.dir("interrupted"), SIGINT, 4) <= 2);

  // Two signals: the first restores the default actions, so the second (delivered after the first's handler, which
  // masks both) ends the process before any further step or checkpoint.
  const auto output = setup.dir("killed");
  auto options = spawn_options(output.string() + ".log");
  options.pipe_stdout = true;
  dapo::test::Child child(setup.train(output, 4), options);
  wait_for_line_starting(child, "step 1/4 |");
  child.signal(SIGTERM);
  child.signal(SIGINT);
  while (child.read_line()) {
  }
  const int status = child.wait();
  INFO("stderr: " << dapo::test::read_text(output.string() + ".log"));
  CHECK(child.killed_by_signal());
  CHECK((status == 128 + SIGTERM || status == 128 + SIGINT));
  CHECK_FALSE(contains(dapo::test::read_text(output.string() + ".log"), "stopped by"));
  CHECK_FALSE(fs::exists(output / "checkpoints" / "latest"));
}

TEST_CASE("fault: SIGTERM to the --nproc 2 launcher stops both ranks after the same step; rank 0 checkpoints") {
  TinyRun setup;
  const auto output = setup.dir("ranks");
  // The launcher passes the signal on (it polls its ranks every 50 ms: the stop may come a few tiny steps later, hence
  // the longer run); the ranks sum their stop flags each step, so neither waits alone in a collective; both exit with
  // 143, which the launcher returns.
  const int64_t step = stop_run(setup, output, SIGTERM, 12, {"--nproc", "2"});
  CHECK(qwen::read_json_lines(output / "metrics.jsonl").back().at("step") == step);
}

TEST_CASE(
    "fault: a disk that fills up during a checkpoint: a clear error, latest still loads, a later resume goes on") {
  TinyRun setup;
  const auto output = setup.dir("run");
  const auto root = output / "checkpoints";
  const Finished first = run_to_end(setup.train(output, 2), setup.dir("first.log"));
  REQUIRE_MESSAGE(first.status == 0, first.output);
  REQUIRE(qwen::find_checkpoint(root) == root / "step-000002");

  // A file size limit below model.safetensors (the first large file of a checkpoint) and far above the files the
  // resumed run appends to before it (metrics, TensorBoard, rollouts, the report): sizes from the first run.
  const auto weights_bytes = fs::file_size(root / "step-000002" / "model.safetensors");
  const rlim_t limit = weights_bytes / 2;
  for (const auto& entry : fs::recursive_directory_iterator(output)) {
    if (entry.is_regular_file() && !contains(entry.path().string(), root.string())) {
      CAPTURE(entry.path().string());
      REQUIRE(entry.file_size() * 4 < limit);
    }
  }
  const auto before = snapshot(root);
  const Finished full =
      run_to_end(setup.train(output, 4, {"--resume", root.string()}, /*save_every=*/1), setup.dir("full.log"), limit);
  INFO(full.output);
  CHECK_FALSE(full.killed);  // SIGXFSZ is ignored: the write fails with EFBIG, and the program reports it
  CHECK(full.status == 1);
  const std::string partial = (root / ".partial-step-000003" / "model.safetensors.tmp").string();
  CHECK(contains(full.errors,
                 "qwen_gsm8k: checkpoint step-000003: not saved (latest still names the previous "
                 "checkpoint): " +
                     partial + ": write failed (" + std::strerror(EFBIG)));
  // Nothing of the failed checkpoint is left (no .partial- directory to mistake for one); latest and step 2 as they
  // were, and loadable.
  CHECK(snapshot(root) == before);
  CHECK(qwen::find_checkpoint(root) == root / "step-000002");
  qwen::load_model(root / "step-000002");

  const Finished later = run_to_end(setup.train(output, 4, {"--resume", root.string()}), setup.dir("later.log"));
  REQUIRE_MESSAGE(later.status == 0, later.output);
  CHECK(contains(later.output, "resumed at step 2"));
  CHECK(qwen::find_checkpoint(root) == root / "step-000004");
  std::vector<int64_t> steps;
  for (const auto& row : qwen::read_json_lines(output / "metrics.jsonl")) steps.push_back(row.at("step"));
  CHECK(steps == std::vector<int64_t>{1, 2, 3, 4});  // the failed run's rows of steps 3 and 4 were cut at the resume
}

TEST_CASE(
    "fault: a damaged checkpoint at --resume fails naming the file, and changes nothing in the output directory") {
  TinyRun setup;
  const auto original = setup.dir("original");
  // Checkpoints of steps 1 and 2; resuming from step 1 would cut metrics.jsonl back to its first row.
  const Finished first = run_to_end(setup.train(original, 2, {}, /*save_every=*/1), setup.dir("original.log"));
  REQUIRE_MESSAGE(first.status == 0, first.output);
  const auto step1 = fs::path("checkpoints") / "step-000001";
  REQUIRE(fs::exists(original / step1 / "optimizer.pt"));
  REQUIRE(qwen::read_json_lines(original / "metrics.jsonl").size() == 2);

  const auto cut_to_half = [](const fs::path& file) { fs::resize_file(file, fs::file_size(file) / 2); };
  // 64 bytes of 0xAB over the end (a ZIP archive's end record) or the middle of the largest entry's tensor data (which
  // only the entry's CRC-32 can tell): the middle of the longest stretch between two local headers ("PK\3\4"), so
  // that no header is hit wherever the entries fall.
  const auto data_middle = [](const std::string& bytes) {
    const std::string header("PK\x03\x04", 4);
    std::size_t longest_begin = 0, longest = 0, previous = 0;
    for (std::size_t at = bytes.find(header); at != std::string::npos; at = bytes.find(header, at + 4)) {
      if (at - previous > longest) {
        longest_begin = previous;
        longest = at - previous;
      }
      previous = at;
    }
    REQUIRE(longest > 1024);
    return longest_begin + longest / 2;
  };
  const auto overwrite = [&](const fs::path& file, bool at_end) {
    std::string bytes = read_file(file);
    REQUIRE(bytes.size() > 128);
    const auto begin = at_end ? bytes.size() - 64 : data_middle(bytes);
    std::fill(bytes.begin() + static_cast<std::ptrdiff_t>(begin),
              bytes.begin() + static_cast<std::ptrdiff_t>(begin + 64), '\xab');
    write_file(file, bytes);
  };
  const auto edit_state = [](const fs::path& file, const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json state = dapo::test::read_json(file);
    edit(state);
    write_file(file, state.dump(2));
  };
  struct Damage {
    std::string name;
    std::function<void(const fs::path& run)> apply;
    std::string resume_from;            // under the run directory
    std::vector<std::string> expected;  // parts of the error, run directory as "RUN"
  };
  const std::vector<Damage> damages{
      {"model.safetensors cut short",
       [&](const fs::path& run) { cut_to_half(run / step1 / "model.safetensors"); },
       step1.string(),
       {"RUN/checkpoints/step-000001/model.safetensors: ", "truncated"}},
      {"optimizer.pt cut short",
       [&](const fs::path& run) { cut_to_half(run / step1 / "optimizer.pt"); },
       step1.string(),
       {"RUN/checkpoints/step-000001/optimizer.pt: cannot be read (", "damaged checkpoint?"}},
      {"optimizer.pt overwritten at its end",
       [&](const fs::path& run) { overwrite(run / step1 / "optimizer.pt", /*at_end=*/true); },
       step1.string(),
       {"RUN/checkpoints/step-000001/optimizer.pt: cannot be read (", "damaged checkpoint?"}},
      {"optimizer.pt overwritten in the middle",
       [&](const fs::path& run) { overwrite(run / step1 / "optimizer.pt", /*at_end=*/false); },
       step1.string(),
       {"RUN/checkpoints/step-000001/optimizer.pt: cannot be read (entry \"", "fails its CRC-32 check",
        "damaged checkpoint?"}},
      {"latest names a missing directory",
       [](const fs::path& run) { write_file(run / "checkpoints" / "latest", "step-000009\n"); },
       "checkpoints",
       {"RUN/checkpoints/latest names step-000009, which is not a complete checkpoint"}},
      {"trainer_state.json is not JSON",
       [&](const fs::path& run) { cut_to_half(run / step1 / "trainer_state.json"); },
       step1.string(),
       {"RUN/checkpoints/step-000001/trainer_state.json: invalid JSON at byte"}},
      {"trainer_state.json lacks a field",
       [&](const fs::path& run) {
         edit_state(run / step1 / "trainer_state.json", [](nlohmann::json& state) { state.erase("updates"); });
       },
       step1.string(),
       {"RUN/checkpoints/step-000001/trainer_state.json: field \"updates\" is missing"}},
      {"trainer_state.json has a mistyped field",
       [&](const fs::path& run) {
         edit_state(run / step1 / "trainer_state.json", [](nlohmann::json& state) { state["eval_rows"] = "one"; });
       },
       step1.string(),
       {"RUN/checkpoints/step-000001/trainer_state.json: field \"eval_rows\" is \"one\", expected an integer >= 0"}},
      {"trainer_state.json has a broken sampler",
       [&](const fs::path& run) {
         edit_state(run / step1 / "trainer_state.json", [](nlohmann::json& state) { state["sampler"].erase("count"); });
       },
       step1.string(),
       {"RUN/checkpoints/step-000001/trainer_state.json: field \"sampler\": ", "\"count\""}},
      {"trainer_state.json's sampler drew from other data",
       [&](const fs::path& run) {
         edit_state(run / step1 / "trainer_state.json", [](nlohmann::json& state) { state["sampler"]["count"] = 99; });
       },
       step1.string(),
       {"RUN/checkpoints/step-000001/trainer_state.json: the checkpointed run drew from 99 training problems, this one "
        "has 16"}},
  };
  for (const auto& damage : damages) {
    CAPTURE(damage.name);
    const auto run_dir = setup.dir("damaged");
    fs::remove_all(run_dir);
    fs::copy(original, run_dir, fs::copy_options::recursive);
    damage.apply(run_dir);
    const auto before = snapshot(run_dir);
    const Finished resumed = run_to_end(setup.train(run_dir, 3, {"--resume", (run_dir / damage.resume_from).string()}),
                                        setup.dir("damaged.log"));
    INFO(resumed.output);
    CHECK_FALSE(resumed.killed);
    CHECK(resumed.status == 1);
    for (std::string part : damage.expected) {
      if (part.rfind("RUN/", 0) == 0) part = run_dir.string() + part.substr(3);
      CHECK_MESSAGE(contains(resumed.errors, part), part);
    }
    CHECK(snapshot(run_dir) == before);  // metrics.jsonl not cut, no file written
  }
}

TEST_CASE("fault: a ZIP archive (LibTorch's .pt) is checked entry by entry against its CRC-32 before it is loaded") {
  dapo::test::ScratchDir scratch;
  const auto file = scratch.path() / "moments.pt";
  torch::save(std::vector<torch::Tensor>{torch::arange(1000, torch::kFloat32), torch::ones({7})}, file.string());
  CHECK_FALSE(qwen::zip_archive_problem(file).has_value());
  const std::string sound = read_file(file);
  const auto problem_with = [&](const std::string& bytes) {
    write_file(file, bytes);
    return qwen::zip_archive_problem(file).value_or("no problem found");
  };
  std::string flipped = sound;
  const auto data = flipped.find(
      std::string(reinterpret_cast<const char*>(torch::arange(1000, torch::kFloat32).data_ptr<float>()) + 400, 16));
  REQUIRE(data != std::string::npos);
  flipped[data] ^= 1;  // one bit of one float
  CHECK(contains(problem_with(flipped), "fails its CRC-32 check"));
  CHECK(contains(problem_with(sound.substr(0, sound.size() - 10)), "has no ZIP end of central directory record"));
  CHECK(contains(problem_with(sound.substr(0, 10)), "too short for a ZIP archive's end record"));
  CHECK(contains(problem_with(""), "too short"));
  CHECK(contains(problem_with(sound.substr(0, sound.size() / 2) + sound.substr(sound.size() - 22)),
                 "beyond the end of the file"));  // the end record kept, what it points at cut away
  CHECK(contains(qwen::zip_archive_problem(scratch.path() / "missing.pt").value_or(""), "cannot open"));
}

TEST_CASE("fault: trainer_state.json is checked field by field, naming the file and the field") {
  const nlohmann::json good{{"step", 2},
                            {"updates", 4},
                            {"sampler", {{"seed", 3}, {"count", 16}, {"epoch", 0}, {"position", 4}}},
                            {"options", {{"lr", 0.001}}},
                            {"metrics_rows", 2},
                            {"eval_rows", 0}};
  const qwen::TrainerStateFile state = qwen::parse_trainer_state(good.dump(), "ckpt/trainer_state.json");
  CHECK(state.step == 2);
  CHECK(state.updates == 4);
  CHECK(state.metrics_rows == 2);
  CHECK(qwen::to_json(state) == good);
  const auto error_of = [](const std::string& text) {
    try {
      qwen::parse_trainer_state(text, "ckpt/trainer_state.json");
    } catch (const std::runtime_error& error) {
      return std::string(error.what());
    }
    FAIL("no error for " << text);
    return std::string();
  };
  const auto with = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json changed = good;
    changed[key] = value;
    return error_of(changed.dump());
  };
  const auto without = [&](const char* key) {
    nlohmann::json changed = good;
    changed.erase(key);
    return error_of(changed.dump());
  };
  CHECK(contains(error_of(""), "ckpt/trainer_state.json: the file is empty"));
  CHECK(contains(error_of(good.dump().substr(0, 20)), "ckpt/trainer_state.json: invalid JSON at byte"));
  CHECK(contains(error_of("[1, 2]"), "ckpt/trainer_state.json: the top level is [1,2], expected a JSON object"));
  CHECK(contains(without("step"), "ckpt/trainer_state.json: field \"step\" is missing"));
  CHECK(contains(with("step", -1), "field \"step\" is -1, expected an integer >= 0"));
  CHECK(contains(with("updates", 1.5), "field \"updates\" is 1.5, expected an integer >= 0"));
  CHECK(contains(with("sampler", nlohmann::json::array()), "field \"sampler\" is [], expected an object"));
  CHECK(contains(with("options", "lr"), "field \"options\" is \"lr\", expected an object"));
  CHECK(contains(with("metrics_rows", true), "field \"metrics_rows\" is true, expected an integer >= 0"));
  CHECK(contains(without("eval_rows"), "field \"eval_rows\" is missing"));
  CHECK(contains(with("step", 18446744073709551615ull), "field \"step\" is 18446744073709551615, too large"));
}
