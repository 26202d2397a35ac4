// qwen::make_demo_problems and qwen::demo_solution: the test set is new by surface form but not by arithmetic, the
// answers are right, the worked solution earns the seed's format and correctness rewards, and a seed fixes the sample.
#include "qwen_gsm8k/demo/demo_problems.hpp"

#include <doctest/doctest.h>
#include <dapo/rewards/gsm8k.hpp>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace {

using Fact = std::tuple<int64_t, qwen::Arithmetic::Operation, int64_t>;

Fact fact_of(const qwen::Problem& problem) {
  const auto& step = problem.arithmetic.value();
  return {step.left, step.operation, step.right};
}

std::vector<std::string> questions_of(const std::vector<qwen::Problem>& problems) {
  std::vector<std::string> questions;
  for (const auto& problem : problems) questions.push_back(problem.question);
  return questions;
}

// The whole numbers written in the text, in order.
std::vector<int64_t> numbers_in(const std::string& text) {
  std::vector<int64_t> numbers;
  for (std::size_t pos = 0; pos < text.size();) {
    if (text[pos] < '0' || text[pos] > '9') {
      ++pos;
      continue;
    }
    int64_t number = 0;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') number = number * 10 + (text[pos++] - '0');
    numbers.push_back(number);
  }
  return numbers;
}

std::string first_word(const std::string& text) {
  return text.substr(0, text.find(' '));
}

}  // namespace

TEST_CASE("demo problems: sizes, and the test set is held out by surface form only") {
  const auto demo = qwen::make_demo_problems();
  CHECK(demo.train.size() == 15120);
  CHECK(demo.test.size() == 200);
  CHECK(qwen::demo_test_pool_size() == 3024);

  std::set<std::string> train_set;
  std::set<Fact> train_facts;
  std::set<std::string> train_names;
  for (const auto& problem : demo.train) {
    train_set.insert(problem.question);
    train_facts.insert(fact_of(problem));
    train_names.insert(first_word(problem.question));
  }
  CHECK(train_set.size() == demo.train.size());  // no duplicates
  // Every fact a + b and a - b >= 0 with a, b in 1..9 is taught.
  CHECK(train_facts.size() == 81 + 45);

  std::set<std::string> test_set;
  for (const auto& problem : demo.test) {
    CHECK_MESSAGE(train_set.count(problem.question) == 0, problem.question);
    CHECK_MESSAGE(train_facts.count(fact_of(problem)) == 1, problem.question);
    CHECK_MESSAGE(train_names.count(first_word(problem.question)) == 1, problem.question);
    test_set.insert(problem.question);
  }
  CHECK(test_set.size() == demo.test.size());

  // The sample mixes both operations.
  const auto additions = std::count_if(demo.test.begin(), demo.test.end(), [](const qwen::Problem& problem) {
    return problem.arithmetic->operation == qwen::Arithmetic::Operation::kAdd;
  });
  CHECK(additions > 50);
  CHECK(additions < 180);

  // The whole held-out pool: still disjoint from train.
  const auto everything = qwen::make_demo_problems({.test_count = qwen::demo_test_pool_size(), .seed = 5});
  std::set<std::string> pool;
  for (const auto& problem : everything.test) {
    pool.insert(problem.question);
    CHECK(train_set.count(problem.question) == 0);
  }
  CHECK(pool.size() == qwen::demo_test_pool_size());
  CHECK_THROWS_WITH_AS(qwen::make_demo_problems({.test_count = qwen::demo_test_pool_size() + 1, .seed = 0}),
                       doctest::Contains("test_count is 3025, expected at most 3024"), std::invalid_argument);
  CHECK(qwen::make_demo_problems({.test_count = 0, .seed = 0}).test.empty());
}

TEST_CASE("demo problems: short ASCII questions whose numbers and answers match the arithmetic") {
  const auto demo = qwen::make_demo_problems({.test_count = qwen::demo_test_pool_size(), .seed = 1});
  for (const auto* problems : {&demo.train, &demo.test}) {
    for (const auto& problem : *problems) {
      REQUIRE(problem.arithmetic.has_value());
      const auto& step = *problem.arithmetic;
      CHECK(problem.question.size() < 80);
      CHECK(std::all_of(problem.question.begin(), problem.question.end(), [](char c) { return c >= 32 && c < 127; }));
      CHECK(step.left >= 1);
      CHECK(step.left <= 9);
      CHECK(step.right >= 1);
      CHECK(step.right <= 9);
      const int64_t answer =
          step.operation == qwen::Arithmetic::Operation::kAdd ? step.left + step.right : step.left - step.right;
      CHECK(answer >= 0);
      CHECK(problem.reference == std::to_string(answer));
      const std::vector<int64_t> operands{step.left, step.right};
      CHECK_MESSAGE(numbers_in(problem.question) == operands, problem.question);
    }
  }
}

TEST_CASE("demo_solution is the warm start's worked answer and earns the seed's rewards") {
  const auto demo = qwen::make_demo_problems();
  const auto example = std::find_if(demo.train.begin(), demo.train.end(), [](const qwen::Problem& problem) {
    return problem.question == "Tom has 6 coins and gives away 4. How many coins are left?";
  });
  REQUIRE(example != demo.train.end());
  CHECK(example->reference == "2");
  CHECK(qwen::demo_solution(*example) == "<think>\n6 - 4 = 2\n</think>\n<answer>\n2\n</answer>\n");
  const auto addition = std::find_if(demo.train.begin(), demo.train.end(), [](const qwen::Problem& problem) {
    return problem.question == "Mia has 3 apples and buys 5 more. How many apples does Mia have now?";
  });
  REQUIRE(addition != demo.train.end());
  CHECK(qwen::demo_solution(*addition) == "<think>\n3 + 5 = 8\n</think>\n<answer>\n8\n</answer>\n");

  for (const auto* problems : {&demo.train, &demo.test}) {
    for (const auto& problem : *problems) {
      const std::string solution = qwen::demo_solution(problem);
      const auto rewards = dapo::gsm8k::score(solution, problem.reference);
      CHECK(rewards.hard_format == dapo::gsm8k::kHardFormatReward);
      CHECK(rewards.correctness == dapo::gsm8k::kCorrectnessReward);
      CHECK(rewards.digit == dapo::gsm8k::kDigitReward);
      CHECK(rewards.mark == 4 * dapo::gsm8k::kMarkReward);
    }
  }

  qwen::Problem gsm8k{"Natalia sold clips to 48 of her friends...", "72"};
  CHECK_THROWS_WITH_AS(qwen::demo_solution(gsm8k), doctest::Contains("has no arithmetic step"), std::invalid_argument);
  const qwen::Problem wrong{example->question, "3", example->arithmetic};
  CHECK_THROWS_WITH_AS(qwen::demo_solution(wrong),
                       doctest::Contains("the reference is \"3\" but the arithmetic gives 2"), std::invalid_argument);
}

TEST_CASE("demo problems are deterministic per seed; the seed only moves the test sample") {
  const auto a = qwen::make_demo_problems({.test_count = 200, .seed = 3});
  const auto b = qwen::make_demo_problems({.test_count = 200, .seed = 3});
  const auto c = qwen::make_demo_problems({.test_count = 200, .seed = 4});
  CHECK(questions_of(a.test) == questions_of(b.test));
  CHECK(questions_of(a.test) != questions_of(c.test));
  CHECK(questions_of(a.train) == questions_of(c.train));
  // A smaller sample of the same seed is a prefix of the larger one.
  const auto small = qwen::make_demo_problems({.test_count = 20, .seed = 3});
  CHECK(std::equal(small.test.begin(), small.test.end(), a.test.begin(),
                   [](const qwen::Problem& x, const qwen::Problem& y) { return x.question == y.question; }));
}
