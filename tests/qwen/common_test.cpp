// The driver's file helpers (common/): write_file_atomically leaves the old file or the whole new one and never a
// .tmp behind, whatever fails; read_json_lines reads rows and names file:line for a bad one; the run directory refuses,
// resumes or overwrites a run and removes only the run's own files.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "qwen_gsm8k/common/atomic_file.hpp"
#include "qwen_gsm8k/common/json_lines.hpp"
#include "qwen_gsm8k/common/run_directory.hpp"
#include "support/files.hpp"
#include "support/qwen_fixtures.hpp"

namespace {

namespace fs = std::filesystem;

using dapo::test::contains;
using dapo::test::read_file;
using dapo::test::write_file;

// How many entries a directory has: a failed write must not leave one behind.
std::size_t entries_in(const fs::path& dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir)) ++n;
  return n;
}

// The message of the std::runtime_error `write` throws; fails the test when it throws none.
template <class Write>
std::string runtime_error_of(Write&& write) {
  try {
    write();
  } catch (const std::runtime_error& error) {
    return error.what();
  }
  FAIL("expected std::runtime_error");
  return {};
}

}  // namespace

TEST_CASE("write_file_atomically writes and replaces whole files, text and streamed, and leaves no .tmp") {
  dapo::test::ScratchDir dir;
  const fs::path path = dir.path() / "state.json";
  qwen::write_file_atomically(path, std::string("{\"step\": 1}\n"));
  CHECK(read_file(path) == "{\"step\": 1}\n");
  qwen::write_file_atomically(path, "short");  // a shorter file replaces a longer one entirely
  CHECK(read_file(path) == "short");
  const std::string binary("a\0b\xFF", 4);
  qwen::write_file_atomically(path, [&](std::ostream& out) {
    out.write(binary.data(), 2);
    out.write(binary.data() + 2, 2);
  });
  CHECK(read_file(path) == binary);
  qwen::write_file_atomically(path, std::string());
  CHECK(read_file(path).empty());
  CHECK_FALSE(fs::exists(path.string() + ".tmp"));
  CHECK(entries_in(dir.path()) == 1);
}

TEST_CASE("a failing write_file_atomically leaves the old file intact and no .tmp") {
  dapo::test::ScratchDir dir;
  const fs::path path = dir.path() / "model.safetensors";
  write_file(path, "old content");

  SUBCASE("the writer throws after writing part of the file: its exception propagates") {
    CHECK_THROWS_WITH_AS(qwen::write_file_atomically(path,
                                                     [](std::ostream& out) {
                                                       out << "half of the new";
                                                       throw std::invalid_argument("tensor 3 is not contiguous");
                                                     }),
                         "tensor 3 is not contiguous", std::invalid_argument);
  }
  SUBCASE("the stream fails (as on a full disk): the error names the file and a hint") {
    const std::string message = runtime_error_of([&] {
      qwen::write_file_atomically(path, [](std::ostream& out) {
        out << "half of the new";
        out.setstate(std::ios::badbit);
      });
    });
    CHECK(contains(message, path.string() + ".tmp: write failed"));
    CHECK(contains(message, "disk full?"));
  }
  SUBCASE("the target is a directory: the rename fails, naming the path") {
    const fs::path occupied = dir.path() / "occupied";
    fs::create_directories(occupied / "inside");
    const std::string message = runtime_error_of([&] { qwen::write_file_atomically(occupied, "new"); });
    CHECK(contains(message, occupied.string() + ": cannot move occupied.tmp into place"));
    CHECK(fs::is_directory(occupied / "inside"));
    CHECK_FALSE(fs::exists(occupied.string() + ".tmp"));
  }
  CHECK(read_file(path) == "old content");
  CHECK_FALSE(fs::exists(path.string() + ".tmp"));
}

TEST_CASE("write_file_atomically into a missing directory names the file and a hint, and creates nothing") {
  dapo::test::ScratchDir dir;
  const fs::path path = dir.path() / "missing" / "config.json";
  const std::string message = runtime_error_of([&] { qwen::write_file_atomically(path, "{}"); });
  CHECK(contains(message, path.string() + ".tmp: cannot open for writing"));
  CHECK(contains(message, "does the directory exist"));
  CHECK_FALSE(fs::exists(dir.path() / "missing"));
  CHECK(entries_in(dir.path()) == 0);
}

TEST_CASE("read_json_lines: rows, blank lines, CRLF; a malformed line names file and line") {
  dapo::test::ScratchDir dir;
  const fs::path good = dir.path() / "metrics.jsonl";
  write_file(good, "{\"step\": 1, \"accuracy\": 0.5}\n\n{\"step\": 2}\r\n   \n{\"step\": 3}");
  const auto rows = qwen::read_json_lines(good);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].at("accuracy") == 0.5);
  CHECK(rows[2].at("step") == 3);

  const fs::path bad = dir.path() / "eval.jsonl";
  write_file(bad, "{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3, \"accuracy\": }\n{\"step\": 4}\n");
  const std::string message = runtime_error_of([&] { qwen::read_json_lines(bad); });
  CHECK(contains(message, bad.string() + ":3: "));
  CHECK(contains(message, "not valid JSON"));
  CHECK_FALSE(contains(message, "partial last line"));

  const fs::path truncated = dir.path() / "truncated.jsonl";
  write_file(truncated, "{\"step\": 1}\n{\"step\": 2, \"acc");
  CHECK_THROWS_WITH_AS(qwen::read_json_lines(truncated), doctest::Contains(":2: not valid JSON"), std::runtime_error);
  CHECK_THROWS_WITH_AS(qwen::read_json_lines(truncated), doctest::Contains("partial last line"), std::runtime_error);

  const fs::path not_object = dir.path() / "array.jsonl";
  write_file(not_object, "{\"step\": 1}\n[1, 2]\n");
  CHECK_THROWS_WITH_AS(qwen::read_json_lines(not_object), doctest::Contains(":2: expected one JSON object per line"),
                       std::runtime_error);

  CHECK_THROWS_WITH_AS(qwen::read_json_lines(dir.path() / "missing.jsonl"), doctest::Contains("missing.jsonl"),
                       std::runtime_error);
  write_file(dir.path() / "empty.jsonl", "");
  CHECK(qwen::read_json_lines(dir.path() / "empty.jsonl").empty());
}

TEST_CASE("run directory: names, what a run holds, and refuse / resume / overwrite touching only the run's files") {
  dapo::test::ScratchDir scratch;
  const qwen::RunDirectory run{scratch.path() / "out"};
  CHECK(run.rollout_log(7) == scratch.path() / "out" / "rollouts" / "step-000007.jsonl");
  CHECK(run.metrics().filename() == "metrics.jsonl");
  run.prepare(qwen::OutputReuse::kRefuse, "hint");  // a new directory: created, nothing refused
  CHECK(fs::is_directory(run.root));
  CHECK(run.files_present().empty());

  write_file(run.metrics(), "{}\n");
  write_file(run.eval(), "{}\n");
  fs::create_directories(run.checkpoints() / "step-000001");
  fs::create_directories(run.rollouts());
  fs::create_directories(run.plots());
  write_file(run.report(), "<html>");
  write_file(run.root / "events.out.tfevents.1.host.2.0", "x");
  write_file(run.root / "notes.txt", "mine");
  CHECK(run.files_present() == std::vector<std::string>{"metrics.jsonl", "eval.jsonl", "checkpoints/"});
  CHECK_THROWS_WITH_AS(
      run.prepare(qwen::OutputReuse::kRefuse, "pass --overwrite"),
      doctest::Contains("already holds a run (metrics.jsonl, eval.jsonl, checkpoints/): pass --overwrite"),
      std::invalid_argument);
  run.prepare(qwen::OutputReuse::kResume, "hint");
  CHECK(run.files_present().size() == 3);
  run.prepare(qwen::OutputReuse::kOverwrite, "hint");
  CHECK(run.files_present().empty());
  CHECK(entries_in(run.root) == 1);  // notes.txt only
  CHECK(read_file(run.root / "notes.txt") == "mine");
}
