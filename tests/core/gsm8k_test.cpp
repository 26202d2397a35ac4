// GSM8K rule rewards: the seed's numbers on the golden file, the lenient mode's fixes, reference parsing.
#include <dapo/rewards/gsm8k.hpp>

#include "support/shared.hpp"

using dapo::gsm8k::AnswerMode;

TEST_CASE("gsm8k rewards reproduce the seed on every golden case") {
  const auto cases = dapo::test::algo_golden("gsm8k_rewards");
  if (!cases) return;
  REQUIRE(cases->size() == 54);
  for (const auto& item : *cases) {
    const std::string response = item.at("response");
    const std::string answer = item.at("answer");
    CAPTURE(response);
    CAPTURE(answer);
    CHECK(dapo::gsm8k::extract_answer(response) == item.at("extracted").get<std::string>());
    CHECK(dapo::gsm8k::correctness_reward(response, answer) == item.at("correctness").get<double>());
    CHECK(dapo::gsm8k::digit_reward(response) == item.at("digit").get<double>());
    CHECK(dapo::gsm8k::hard_format_reward(response) == item.at("hard_format").get<double>());
    CHECK(dapo::gsm8k::mark_reward(response) == item.at("mark").get<double>());
    const auto all = dapo::gsm8k::score(response, answer);
    CHECK(all.total() == doctest::Approx(item.at("correctness").get<double>() + item.at("digit").get<double>() +
                                         item.at("hard_format").get<double>() + item.at("mark").get<double>()));
  }
}

TEST_CASE("seed extraction: last number of the first answer block, Python findall order") {
  using dapo::gsm8k::extract_answer;
  CHECK(extract_answer("<answer>1.2.3</answer>") == "3");  // "1.2" then "3"
  CHECK(extract_answer("<answer>a 3/4 b</answer>") == "3/4");
  CHECK(extract_answer("<answer>7. done</answer>") == "7");  // "7." is not a decimal
  CHECK(extract_answer("<answer>x</answer><answer>5</answer>") == "");
  CHECK(extract_answer("<answer>\n1,080\n</answer>") == "080");  // the seed's flaw, kept in kSeed
  CHECK(extract_answer("<answer>-7</answer>") == "7");
  CHECK(extract_answer("<answer>\xEF\xBC\x97\xEF\xBC\x92</answer>") == "\xEF\xBC\x97\xEF\xBC\x92");  // full-width 72
  CHECK(extract_answer("<answer>\xD9\xA3</answer>") == "\xD9\xA3");  // Arabic-Indic 3 is a Python \d
  CHECK(extract_answer("<answer>\xC2\xB2</answer>").empty());        // superscript two is not (category No)
  CHECK(extract_answer("<answer>\xFF"
                       "9</answer>") == "9");  // invalid UTF-8 is skipped, not a crash
  // An over-long encoding of "0" (C0 B0) is malformed UTF-8, which Python reads as U+FFFD: no digit.
  CHECK(extract_answer("<answer>\xC0\xB0</answer>").empty());
  CHECK(extract_answer("<answer>\xE0\x80\xB5"
                       "4</answer>") == "4");  // over-long "5" skipped, the 4 kept
}

TEST_CASE("lenient mode: minus signs, thousands separators, Unicode digits, trailing zeros") {
  using dapo::gsm8k::extract_answer;
  const auto lenient = AnswerMode::kLenient;
  CHECK(extract_answer("<answer>\n1,080\n</answer>", lenient) == "1080");
  CHECK(extract_answer("<answer>$12,345,678.50</answer>", lenient) == "12345678.5");
  CHECK(extract_answer("<answer>-7</answer>", lenient) == "-7");
  CHECK(extract_answer("<answer>= -7 apples</answer>", lenient) == "-7");
  CHECK(extract_answer("<answer>10-3</answer>", lenient) == "3");  // a binary minus is not a sign
  CHECK(extract_answer("<answer>72.0</answer>", lenient) == "72");
  CHECK(extract_answer("<answer>1,08</answer>", lenient) == "08");  // "1,08" is not a thousands group
  CHECK(extract_answer("<answer>1,0800</answer>", lenient) == "0800");
  CHECK(extract_answer("<answer>\xEF\xBC\x97\xEF\xBC\x92</answer>", lenient) == "72");
  CHECK(extract_answer("<answer>3/4</answer>", lenient) == "3/4");
  CHECK(extract_answer("<answer>-0</answer>", lenient) == "0");
  CHECK(extract_answer("no tags 5", lenient).empty());

  const std::string response = "<think>\na\n</think>\n<answer>\n1,080\n</answer>\n";
  CHECK(dapo::gsm8k::correctness_reward(response, "1080") == 0.0);
  CHECK(dapo::gsm8k::correctness_reward(response, "1080", lenient) == 2.0);
  CHECK(dapo::gsm8k::correctness_reward("<answer>-7</answer>", "-7") == 0.0);
  CHECK(dapo::gsm8k::correctness_reward("<answer>-7</answer>", "-7", lenient) == 2.0);
  CHECK(dapo::gsm8k::correctness_reward("<answer>7</answer>", "-7", lenient) == 0.0);
  CHECK(dapo::gsm8k::correctness_reward("<answer>nothing</answer>", "", lenient) == 0.0);
  CHECK(dapo::gsm8k::digit_reward("<answer>-7</answer>") == 0.5);  // seed extracts "7"
  CHECK(dapo::gsm8k::digit_reward("<answer>-7</answer>", lenient) == 0.5);
  CHECK(dapo::gsm8k::digit_reward("<answer>7.5</answer>", lenient) == 0.0);
}

TEST_CASE("hard format: one thinking line in the seed, any number in lenient mode") {
  using dapo::gsm8k::hard_format_reward;
  const std::string one_line = "<think>\nx\n</think>\n<answer>\n5\n</answer>\n";
  const std::string two_lines = "<think>\nx\ny\n</think>\n<answer>\n5\n</answer>\n";
  CHECK(hard_format_reward(one_line) == 0.5);
  CHECK(hard_format_reward(one_line + "\n") == 0.5);  // `$` matches before one final newline
  CHECK(hard_format_reward(one_line + "\n\n") == 0.0);
  CHECK(hard_format_reward("<think>\n\n</think>\n<answer>\n5\n</answer>\n") == 0.5);  // empty thinking line
  CHECK(hard_format_reward("<think>\n</think>\n<answer>\n5\n</answer>\n") == 0.0);
  CHECK(hard_format_reward(two_lines) == 0.0);
  CHECK(hard_format_reward(two_lines, AnswerMode::kLenient) == 0.5);
  CHECK(hard_format_reward("<think>\nx\n</think>\n<answer>\n5\n6\n</answer>\n", AnswerMode::kLenient) == 0.0);
  CHECK(hard_format_reward("<think>\na\n</think>\n<answer>\nb\n</think>\n<answer>\n5\n</answer>\n",
                           AnswerMode::kLenient) == 0.5);  // backtracks to the second </think>
  CHECK(hard_format_reward("", AnswerMode::kLenient) == 0.0);
}

TEST_CASE("mark reward counts each tag exactly once") {
  CHECK(dapo::gsm8k::mark_reward("<think>\n</think>\n<answer>\n</answer>\n") == 0.5);
  CHECK(dapo::gsm8k::mark_reward("<think>\n<think>\n</think>\n") == 0.125);
  CHECK(dapo::gsm8k::mark_reward("") == 0.0);
}

TEST_CASE("reference_answer takes the text after ####, without commas") {
  using dapo::gsm8k::reference_answer;
  CHECK(reference_answer("Natalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72") == "72");
  CHECK(reference_answer("so...\n#### 1,080") == "1080");
  CHECK(reference_answer("#### -7 ") == "-7");
  CHECK_THROWS_WITH_AS(reference_answer("no marker here"), doctest::Contains("has no '####'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(reference_answer("text ####   "), doctest::Contains("nothing follows '####'"),
                       std::invalid_argument);
}

TEST_CASE("reference_answer on every GSM8K train line yields a number the lenient reader agrees with") {
  const auto dir = dapo::test::require_shared("data/gsm8k/train.jsonl");
  if (!dir) return;
  std::ifstream in(*dir / "data" / "gsm8k" / "train.jsonl");
  REQUIRE(in.good());
  std::string line;
  int lines = 0, negative = 0, with_comma = 0;
  while (std::getline(in, line)) {
    const auto item = nlohmann::json::parse(line);
    const std::string field = item.at("answer");
    const std::string reference = dapo::gsm8k::reference_answer(field);
    CAPTURE(field);
    CHECK(!reference.empty());
    // A response that states the reference in GSM8K's own notation earns the correctness reward in lenient mode.
    const std::string written = field.substr(field.find("####") + 4);
    CHECK(dapo::gsm8k::correctness_reward("<answer>" + written + "</answer>", reference, AnswerMode::kLenient) == 2.0);
    negative += reference.starts_with('-');
    with_comma += written.find(',') != std::string::npos;
    ++lines;
  }
  CHECK(lines == 7473);
  MESSAGE("GSM8K train: " << negative << " negative answers, " << with_comma << " written with thousands separators");
}
