// The demo's word problems: 8 templates x 6 names x 6 objects x every fact a +- b (a, b in 1..9, a - b >= 0), split
// by (template, name): template t keeps name t % 6 for the test set, so each name is held out with some templates only.
#include "qwen_gsm8k/demo/demo_problems.hpp"

#include <array>
#include <stdexcept>
#include <string_view>

namespace qwen {
namespace {

using Operation = Arithmetic::Operation;

struct Template {
  Operation operation;
  // {name}; {a} and {b}: the operands; {obj_a} / {obj_b}: the object in the number of a / b; {objs}: its plural.
  std::string_view text;
};

// Short (under 80 bytes with every name, object and operand), ASCII, and the name in every template, so that a
// (template, name) pair held out of training makes every one of its questions new.
constexpr std::array<Template, 8> kTemplates{{
    {Operation::kAdd, "{name} has {a} {obj_a} and buys {b} more. How many {objs} does {name} have now?"},
    {Operation::kAdd, "{name} had {a} {obj_a}. Then {name} got {b} more. How many {objs} does {name} have?"},
    {Operation::kAdd, "{name} found {a} {obj_a} on Monday and {b} on Tuesday. How many {objs} in all?"},
    {Operation::kAdd, "{name} has {a} red {obj_a} and {b} blue {obj_b}. How many {objs} does {name} have?"},
    {Operation::kSubtract, "{name} has {a} {obj_a} and gives away {b}. How many {objs} are left?"},
    {Operation::kSubtract, "{name} had {a} {obj_a} and lost {b}. How many {objs} does {name} have now?"},
    {Operation::kSubtract, "{name} bought {a} {obj_a} and used {b}. How many {objs} are left?"},
    {Operation::kSubtract, "{name} has {a} {obj_a}. {name} sells {b}. How many {objs} remain?"},
}};

constexpr std::array<std::string_view, 6> kNames{"Tom", "Mia", "Sam", "Ana", "Ben", "Zoe"};

struct Object {
  std::string_view one, many;
};
constexpr std::array<Object, 6> kObjects{{
    {"apple", "apples"},
    {"coin", "coins"},
    {"book", "books"},
    {"pen", "pens"},
    {"shell", "shells"},
    {"stamp", "stamps"},
}};

constexpr int64_t kLargestOperand = 9;

bool held_out(std::size_t template_index, std::size_t name_index) {
  return name_index == template_index % kNames.size();
}

std::string question_of(const Template& form, std::string_view name, const Object& object, int64_t a, int64_t b) {
  auto counted = [&](int64_t n) { return std::string(n == 1 ? object.one : object.many); };
  const std::array<std::pair<std::string_view, std::string>, 6> fields{{{"{name}", std::string(name)},
                                                                        {"{a}", std::to_string(a)},
                                                                        {"{b}", std::to_string(b)},
                                                                        {"{obj_a}", counted(a)},
                                                                        {"{obj_b}", counted(b)},
                                                                        {"{objs}", std::string(object.many)}}};
  std::string question;
  std::string_view rest = form.text;
  while (!rest.empty()) {
    bool replaced = false;
    for (const auto& [placeholder, value] : fields) {
      if (rest.starts_with(placeholder)) {
        question += value;
        rest.remove_prefix(placeholder.size());
        replaced = true;
        break;
      }
    }
    if (!replaced) {
      question += rest.front();
      rest.remove_prefix(1);
    }
  }
  return question;
}

// Every problem of the held-out forms (held = true) or of the training forms (held = false), in a fixed order.
std::vector<Problem> problems_of_forms(bool held) {
  std::vector<Problem> problems;
  for (std::size_t t = 0; t < kTemplates.size(); ++t) {
    const Template& form = kTemplates[t];
    for (std::size_t n = 0; n < kNames.size(); ++n) {
      if (held_out(t, n) != held) continue;
      for (const Object& object : kObjects) {
        for (int64_t a = 1; a <= kLargestOperand; ++a) {
          for (int64_t b = 1; b <= kLargestOperand; ++b) {
            if (form.operation == Operation::kSubtract && b > a) continue;
            const Arithmetic arithmetic{a, form.operation, b};
            problems.push_back(
                Problem{question_of(form, kNames[n], object, a, b), std::to_string(arithmetic.result()), arithmetic});
          }
        }
      }
    }
  }
  return problems;
}

}  // namespace

std::size_t demo_test_pool_size() {
  std::size_t size = 0;
  for (const Template& form : kTemplates) {
    const std::size_t facts = form.operation == Operation::kAdd ? kLargestOperand * kLargestOperand
                                                                : kLargestOperand * (kLargestOperand + 1) / 2;
    size += kObjects.size() * facts;  // one held-out name per template
  }
  return size;
}

DemoProblems make_demo_problems(const DemoProblemOptions& options) {
  std::vector<Problem> pool = problems_of_forms(true);
  if (options.test_count > pool.size()) {
    throw std::invalid_argument("qwen::make_demo_problems: test_count is " + std::to_string(options.test_count) +
                                ", expected at most " + std::to_string(pool.size()) +
                                " (the number of held-out demo problems)");
  }
  DemoProblems problems;
  problems.train = problems_of_forms(false);
  // The first test_count indices of the seed's permutation: a sample without replacement, the same on every platform.
  if (options.test_count > 0) {
    for (const std::size_t index : ProblemSampler(pool.size(), options.seed).next(options.test_count)) {
      problems.test.push_back(pool[index]);
    }
  }
  return problems;
}

std::string demo_solution(const Problem& problem) {
  constexpr const char* kWhere = "qwen::demo_solution: ";
  if (!problem.arithmetic) {
    throw std::invalid_argument(std::string(kWhere) +
                                "the problem has no arithmetic step (only demo problems carry one): \"" +
                                problem.question.substr(0, 60) + "\"");
  }
  const Arithmetic& step = *problem.arithmetic;
  const std::string result = std::to_string(step.result());
  if (problem.reference != result) {
    throw std::invalid_argument(std::string(kWhere) + "the reference is \"" + problem.reference +
                                "\" but the arithmetic gives " + result);
  }
  const char* symbol = step.operation == Operation::kAdd ? " + " : " - ";
  return "<think>\n" + std::to_string(step.left) + symbol + std::to_string(step.right) + " = " + result +
         "\n</think>\n<answer>\n" + result + "\n</answer>\n";
}

}  // namespace qwen
