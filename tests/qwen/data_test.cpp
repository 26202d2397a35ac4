// qwen::load_problems: GSM8K's own files, malformed lines named by file and line (or skipped and counted), numeric
// answer fields; qwen::ProblemSampler: one permutation per epoch, the same for a sampler restored from its state.
#include "qwen_gsm8k/data/data.hpp"

#include <algorithm>
#include <array>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "support/qwen_fixtures.hpp"

namespace {

std::filesystem::path write_lines(const dapo::test::ScratchDir& scratch, const std::string& name,
                                  const std::vector<std::string>& lines) {
  const auto path = scratch.path() / name;
  std::ofstream out(path, std::ios::binary);
  for (const auto& line : lines) out << line << '\n';
  return path;
}

const std::string kGood =
    R"({"question": "Tom has 6 coins and gives away 4. How many are left?", "answer": "6-4=2\n#### 2"})";

// doctest::Contains takes its own String type.
doctest::Contains contains(const std::string& text) {
  return doctest::Contains(text.c_str());
}

std::vector<std::size_t> sorted(std::vector<std::size_t> indices) {
  std::sort(indices.begin(), indices.end());
  return indices;
}

std::vector<std::size_t> iota(std::size_t count) {
  std::vector<std::size_t> indices(count);
  std::iota(indices.begin(), indices.end(), std::size_t{0});
  return indices;
}

}  // namespace

TEST_CASE("GSM8K train and test files load with their final answers") {
  const auto dir = dapo::test::require_shared("data/gsm8k/train.jsonl", "data/gsm8k/test.jsonl");
  if (!dir) return;
  const auto train = qwen::load_problems(*dir / "data" / "gsm8k" / "train.jsonl");
  REQUIRE(train.problems.size() == 7473);
  CHECK(train.skipped_lines == 0);
  CHECK(train.source == *dir / "data" / "gsm8k" / "train.jsonl");
  CHECK(train.problems[0].question.starts_with("Natalia sold clips to 48 of her friends in April"));
  CHECK(train.problems[0].reference == "72");
  CHECK(train.problems[1].reference == "10");
  CHECK(train.problems[345].reference == "1080");  // line 346: "#### 1,080"
  CHECK_FALSE(train.problems[0].arithmetic.has_value());

  const auto test = qwen::load_problems(*dir / "data" / "gsm8k" / "test.jsonl");
  REQUIRE(test.problems.size() == 1319);
  CHECK(test.problems[0].question.starts_with("Janet\u2019s ducks lay 16 eggs per day."));
  CHECK(test.problems[0].reference == "18");
  CHECK(test.problems[201].reference == "114200");  // line 202: "#### 114,200"

  // Every GSM8K reference is a whole number once the thousands separators are gone.
  auto whole_number = [](const std::string& text) {
    const std::size_t digits = text.starts_with('-') ? 1 : 0;
    return text.size() > digits && text.find_first_not_of("0123456789", digits) == std::string::npos;
  };
  for (const auto* dataset : {&train, &test}) {
    for (const auto& problem : dataset->problems) CHECK_MESSAGE(whole_number(problem.reference), problem.reference);
  }
}

TEST_CASE("a malformed line is an error naming the file, the line and what is wrong") {
  dapo::test::ScratchDir scratch;
  // Line 1 is good, line 2 blank (ignored but counted), line 3 is the bad one.
  auto error_for = [&](const std::string& bad_line, const qwen::DataFields& fields = {}) {
    const auto path = write_lines(scratch, "bad.jsonl", {kGood, "   ", bad_line, kGood});
    try {
      qwen::load_problems(path, fields);
    } catch (const std::invalid_argument& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  const std::string where = (scratch.path() / "bad.jsonl").string() + ":3: ";
  CHECK(error_for(R"({"question": "How many?", "answer": "#### 2")").starts_with(where + "invalid JSON at byte"));
  CHECK(
      error_for(R"({"question": "How many?"})").starts_with(where + "no field \"answer\" (the line has \"question\")"));
  CHECK(error_for(R"({"question": "How many?", "answer": "it is 2"})")
            .starts_with(where + "field \"answer\" has no \"####\" before the final answer"));
  CHECK(error_for(R"({"question": "How many?", "answer": "2 ####  "})")
            .starts_with(where + "field \"answer\" has nothing after \"####\""));
  CHECK(error_for(R"({"question": " ", "answer": "#### 2"})").starts_with(where + "field \"question\" is empty"));
  CHECK(error_for(R"({"question": 7, "answer": "#### 2"})")
            .starts_with(where + "field \"question\" is 7, expected a string"));
  CHECK(error_for(R"({"question": "How many?", "answer": 2})")
            .starts_with(where + "field \"answer\" is 2, expected a string ending in \"#### N\""));
  CHECK(error_for(R"(["question", "answer"])").starts_with(where + "expected a JSON object"));
  CHECK(error_for(R"({"question": "How many?", "answer": "#### 2"})") == "no error");

  const auto path =
      write_lines(scratch, "missing.jsonl", {kGood, R"({"question": "How many?", "solution": "#### 2"})"});
  CHECK_THROWS_WITH_AS(qwen::load_problems(path), contains(path.string() + ":2: no field \"answer\""),
                       std::invalid_argument);
}

TEST_CASE("dotted field names are paths into verl's preprocessed lines; a key with dots is still a key") {
  dapo::test::ScratchDir scratch;
  // The layout of verl's examples/data_preprocess/gsm8k.py, as JSON lines.
  const std::string verl_line =
      R"({"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "How many are left?"}],)"
      R"( "reward_model": {"style": "rule", "ground_truth": "72"}, "extra_info": {"index": 0}})";
  const qwen::DataFields verl{"prompt.0.content", "reward_model.ground_truth", qwen::AnswerFormat::kNumber};
  const auto problems = qwen::load_problems(write_lines(scratch, "verl.jsonl", {verl_line}), verl).problems;
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].question == "How many are left?");
  CHECK(problems[0].reference == "72");

  const auto dotted_key = write_lines(scratch, "dotted.jsonl", {R"({"q.text": "How many?", "answer": "#### 2"})"});
  CHECK(qwen::load_problems(dotted_key, {"q.text", "answer"}).problems.at(0).question == "How many?");

  auto error_for = [&](const std::string& question_field) {
    try {
      qwen::load_problems(write_lines(scratch, "bad.jsonl", {verl_line}), {question_field, verl.answer, verl.format});
    } catch (const std::invalid_argument& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  CHECK_MESSAGE(error_for("prompt.1.content")
                        .find("no field \"prompt.1.content\": \"prompt\" is a list of 1 and \"1\" "
                              "is not an index in it") != std::string::npos,
                error_for("prompt.1.content"));
  CHECK(error_for("prompt.0.text").find("no field \"prompt.0.text\" (\"prompt.0\" has \"content\", \"role\")") !=
        std::string::npos);
  CHECK(error_for("data_source.name").find("\"data_source\" is \"openai/gsm8k\", not an object or a list") !=
        std::string::npos);
  CHECK(error_for("prompt.0").find("field \"prompt.0\" is {") != std::string::npos);  // an object, not a string
}

TEST_CASE("data presets: GSM8K's layout, the seed's Chinese GSM8K, verl's chat-message prompt; hints name the flags") {
  dapo::test::ScratchDir scratch;
  const auto load = [&](const std::string& preset, const std::string& line) {
    return qwen::load_problems(write_lines(scratch, preset + ".jsonl", {line}), qwen::data_preset(preset)).problems;
  };
  CHECK(load("gsm8k", kGood).at(0).reference == "2");
  const auto chinese = load(
      "gsm8k_chinese", R"({"question": "Tom has 6 coins.", "question_zh-cn": "汤姆有6枚硬币，送出4枚。还剩几枚？",)"
                       R"( "answer": "6-4=2\n#### 2", "answer_only": "2"})");
  CHECK(chinese.at(0).question == "汤姆有6枚硬币，送出4枚。还剩几枚？");
  CHECK(chinese.at(0).reference == "2");
  // verl's prompt is a list of chat messages: the question is the last user turn's content (after any system turn).
  const auto verl =
      load("verl", R"({"data_source": "openai/gsm8k", "prompt": [{"role": "system", "content": "Be brief."},)"
                   R"( {"role": "user", "content": "How many are left?"}],)"
                   R"( "reward_model": {"style": "rule", "ground_truth": "72"}})");
  CHECK(verl.at(0).question == "How many are left?");
  CHECK(verl.at(0).reference == "72");
  CHECK_THROWS_WITH_AS(load("verl", R"({"prompt": [{"role": "system", "content": "Be brief."}],)"
                                    R"( "reward_model": {"ground_truth": "72"}})"),
                       contains("field \"prompt\" is a list with no {\"role\": \"user\", \"content\": ...} message"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(qwen::data_preset("openai"),
                       contains("data preset \"openai\" is not one of gsm8k, gsm8k_chinese, verl"),
                       std::invalid_argument);
  // The hints name the options that fix the line.
  CHECK_THROWS_WITH(load("gsm8k", R"({"question": "How many?", "answer": 2})"),
                    contains("(hint: --answer-format number reads a numeric answer field; --skip-bad-lines skips bad "
                             "lines)"));
  CHECK_THROWS_WITH(load("gsm8k", R"({"question_zh-cn": "How many?", "answer": "#### 2"})"),
                    contains("--question-field and --answer-field name the fields, --data-preset gsm8k, "
                             "gsm8k_chinese or verl a known layout"));
}

TEST_CASE("BadLines::kSkip passes over malformed lines and counts them") {
  dapo::test::ScratchDir scratch;
  const auto path =
      write_lines(scratch, "mixed.jsonl",
                  {kGood, "{not json", "", R"({"question": "Q?"})", R"({"question": "Q?", "answer": "2"})",
                   R"({"question": "", "answer": "#### 2"})",
                   R"({"question": "Sam has 3 pens and buys 5 more. How many now?", "answer": "#### 8"})", "\r"});
  CHECK_THROWS_WITH_AS(qwen::load_problems(path), contains(path.string() + ":2: invalid JSON"), std::invalid_argument);
  const auto dataset = qwen::load_problems(path, {}, qwen::BadLines::kSkip);
  CHECK(dataset.skipped_lines == 4);
  REQUIRE(dataset.problems.size() == 2);
  CHECK(dataset.problems[0].reference == "2");
  CHECK(dataset.problems[1].question == "Sam has 3 pens and buys 5 more. How many now?");
  CHECK(dataset.problems[1].reference == "8");
}

TEST_CASE("a file without problems, or that cannot be opened, is an error") {
  dapo::test::ScratchDir scratch;
  const auto empty = write_lines(scratch, "empty.jsonl", {"", "  "});
  CHECK_THROWS_WITH_AS(qwen::load_problems(empty), contains(empty.string() + ": no problems in 2 lines"),
                       std::invalid_argument);
  const auto all_bad = write_lines(scratch, "all_bad.jsonl", {"{", "[]"});
  CHECK_THROWS_WITH_AS(qwen::load_problems(all_bad, {}, qwen::BadLines::kSkip),
                       doctest::Contains("no problems in 2 lines (2 malformed lines skipped"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(qwen::load_problems(scratch.path() / "absent.jsonl"), doctest::Contains("cannot open"),
                       std::runtime_error);
  CHECK_THROWS_WITH_AS(qwen::load_problems(scratch.path()), doctest::Contains("is a directory"), std::runtime_error);
}

TEST_CASE("AnswerFormat::kNumber reads a numeric answer field, normalised as the reward compares it") {
  dapo::test::ScratchDir scratch;
  const qwen::DataFields chinese{"question_zh-cn", "answer_only", qwen::AnswerFormat::kNumber};
  // Answer field as written -> the reference.
  const std::vector<std::pair<std::string, std::string>> cases{
      {"72", "72"},
      {"3.50", "3.5"},
      {"\"1,080\"", "1080"},
      {"-7", "-7"},
      {"\"72\"", "72"},
      {"\" 3.50 \"", "3.5"},
      {"72.0", "72"},
      {"\"-0\"", "0"},
      {"\"007\"", "7"},
      {"\"1,234,567\"", "1234567"},
      {"1e3", "1000"},
      {"0.125", "0.125"},
      {"-0.0", "0"},
      {"\"-2.500\"", "-2.5"},
      {"18446744073709551615", "18446744073709551615"},
  };
  std::vector<std::string> lines;
  for (const auto& [written, reference] : cases) {
    lines.push_back(R"({"question_zh-cn": "问题", "answer_only": )" + written + "}");
  }
  const auto path = write_lines(scratch, "zh.jsonl", lines);
  const auto dataset = qwen::load_problems(path, chinese);
  REQUIRE(dataset.problems.size() == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    CHECK_MESSAGE(dataset.problems[i].reference == cases[i].second, cases[i].first);
    CHECK(dataset.problems[i].question == "问题");
  }

  for (const std::string bad : {"\"1,08\"", "\"10,80\"", "\"1234,567\"", "\"3/4\"", "\"1e3\"", "\"\"", "\"7.\"",
                                "\".5\"", "\"--7\"", "\"72 apples\"", "true", "null", "[72]"}) {
    const auto bad_path =
        write_lines(scratch, "zh_bad.jsonl", {R"({"question_zh-cn": "问题", "answer_only": )" + bad + "}"});
    CHECK_THROWS_WITH_AS(qwen::load_problems(bad_path, chinese),
                         contains(bad_path.string() + ":1: field \"answer_only\" is " + bad + ", expected a number"),
                         std::invalid_argument);
  }
  // The default field names are not there: the error lists the ones that are.
  CHECK_THROWS_WITH_AS(qwen::load_problems(path),
                       doctest::Contains(":1: no field \"question\" (the line has "
                                         "\"answer_only\", \"question_zh-cn\")"),
                       std::invalid_argument);
}

TEST_CASE("ProblemSampler visits every index once per epoch, in a new order each epoch") {
  qwen::ProblemSampler sampler(10, 7);
  CHECK(sampler.count() == 10);
  CHECK(sampler.seed() == 7);
  const auto first = sampler.next(10);
  CHECK(sorted(first) == iota(10));
  CHECK(sampler.epoch() == 1);
  CHECK(sampler.position() == 0);
  const auto second = sampler.next(10);
  CHECK(sorted(second) == iota(10));
  CHECK(first != second);

  // Crossing epoch boundaries gives the same stream as drawing epoch by epoch.
  qwen::ProblemSampler again(10, 7);
  const auto stream = again.next(25);
  std::vector<std::size_t> expected = first;
  expected.insert(expected.end(), second.begin(), second.end());
  expected.resize(25);
  const auto third =
      qwen::ProblemSampler::from_state({{"seed", 7}, {"count", 10}, {"epoch", 2}, {"position", 0}}).next(5);
  std::copy(third.begin(), third.end(), expected.begin() + 20);
  CHECK(stream == expected);
  CHECK(again.epoch() == 2);
  CHECK(again.position() == 5);

  // Seeds give different orders; the same seed the same one.
  CHECK(qwen::ProblemSampler(100, 1).next(100) != qwen::ProblemSampler(100, 2).next(100));
  CHECK(qwen::ProblemSampler(100, 1).next(300) == qwen::ProblemSampler(100, 1).next(300));

  // A single problem is drawn again and again.
  qwen::ProblemSampler single(1, 3);
  CHECK(single.next(3) == std::vector<std::size_t>{0, 0, 0});
  CHECK(single.epoch() == 3);
  CHECK(qwen::ProblemSampler(5, 0).next(0).empty());
  CHECK_THROWS_WITH_AS(qwen::ProblemSampler(0, 1), doctest::Contains("count is 0"), std::invalid_argument);
}

TEST_CASE("ProblemSampler's order is pinned and unbiased") {
  // The order is part of a saved run's state: it must not change between versions or standard libraries.
  CHECK(qwen::ProblemSampler(10, 0).next(10) == std::vector<std::size_t>{6, 1, 2, 4, 7, 5, 3, 0, 9, 8});

  // Fisher-Yates with an unbiased draw: each of the 6 orders of 3 items turns up in about 1/6 of the epochs.
  qwen::ProblemSampler sampler(3, 12345);
  std::map<std::vector<std::size_t>, int> seen;
  // The classic mistake, swapping with any position instead of one not yet placed, gives some orders 4/27 and others
  // 5/27 of the time (8889 and 11111 of 60000); a fair shuffle gives 10000 +- 91 (one standard deviation).
  for (int epoch = 0; epoch < 60000; ++epoch) ++seen[sampler.next(3)];
  CHECK(seen.size() == 6);
  for (const auto& [order, times] : seen) CHECK_MESSAGE((times > 9600 && times < 10400), times);
}

TEST_CASE("ProblemSampler restored from its state continues identically") {
  qwen::ProblemSampler sampler(37, 2024);
  sampler.next(50);
  const nlohmann::json state = sampler.state();
  CHECK(state == nlohmann::json{{"seed", 2024}, {"count", 37}, {"epoch", 1}, {"position", 13}});
  auto restored = qwen::ProblemSampler::from_state(nlohmann::json::parse(state.dump()));
  CHECK(restored.epoch() == 1);
  CHECK(restored.position() == 13);
  CHECK(restored.next(100) == sampler.next(100));
  CHECK(restored.state() == sampler.state());

  const nlohmann::json big_seed{{"seed", UINT64_MAX}, {"count", 4}, {"epoch", 0}, {"position", 0}};
  CHECK(qwen::ProblemSampler::from_state(nlohmann::json::parse(big_seed.dump())).seed() == UINT64_MAX);
}

TEST_CASE("a bad sampler state is refused, naming the field") {
  const nlohmann::json good{{"seed", 1}, {"count", 4}, {"epoch", 2}, {"position", 3}};
  CHECK_NOTHROW(qwen::ProblemSampler::from_state(good));
  auto with = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json state = good;
    state[key] = value;
    return state;
  };
  auto without = [&](const char* key) {
    nlohmann::json state = good;
    state.erase(key);
    return state;
  };
  using qwen::ProblemSampler;
  CHECK_THROWS_WITH_AS(ProblemSampler::from_state(without("seed")), doctest::Contains("missing field \"seed\""),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(ProblemSampler::from_state(with("position", 4)),
                       doctest::Contains("field \"position\" is 4, expected less than count 4"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(ProblemSampler::from_state(with("count", 0)), doctest::Contains("field \"count\" is 0"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(ProblemSampler::from_state(with("epoch", -1)),
                       doctest::Contains("field \"epoch\" is -1, expected a non-negative integer"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(ProblemSampler::from_state(with("seed", "1")),
                       doctest::Contains("field \"seed\" is \"1\", expected a non-negative integer"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(ProblemSampler::from_state(with("count", 4.5)), doctest::Contains("field \"count\" is 4.5"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(ProblemSampler::from_state(nlohmann::json::array({1, 4, 2, 3})),
                       doctest::Contains("qwen::ProblemSampler::from_state: expected an object"),
                       std::invalid_argument);
}
