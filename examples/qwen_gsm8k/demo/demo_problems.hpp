// Built-in GSM8K-style problems small enough for the demo's tiny byte-level model: one-step word problems a + b and
// a - b with a, b in 1..9, and the worked answer its supervised warm start imitates. Not a GSM8K substitute.
//
// The test set is held out by surface form, not by arithmetic: a surface form is (sentence template, name, object),
// and every template pairs one of its names with test only. So every template, name, object and arithmetic fact is
// seen in training, and a test question is a combination of them that never was; no test question equals a train one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "qwen_gsm8k/data/data.hpp"

namespace qwen {

struct DemoProblems {
  std::vector<Problem> train, test;  // every Problem carries its Arithmetic
};

struct DemoProblemOptions {
  std::size_t test_count = 200;  // drawn without replacement from the held-out forms (at most demo_test_pool_size())
  uint64_t seed = 0;             // chooses the test sample; the train set does not depend on it
};

// Train: every fact in every training surface form, in a fixed order (a sampler shuffles it); 15120 problems.
// Test: options.test_count problems drawn from the held-out forms. Throws std::invalid_argument when test_count is
// larger than the held-out pool.
DemoProblems make_demo_problems(const DemoProblemOptions& options = {});

// How many distinct held-out test problems exist.
std::size_t demo_test_pool_size();

// The worked answer of the warm start, in the seed's strict format (one line of thinking, one line of answer):
// "<think>\n6 - 4 = 2\n</think>\n<answer>\n2\n</answer>\n". Throws std::invalid_argument for a problem without
// Arithmetic (a GSM8K problem) or whose reference disagrees with its arithmetic.
std::string demo_solution(const Problem& problem);

}  // namespace qwen
