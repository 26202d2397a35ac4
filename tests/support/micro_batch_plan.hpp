// Test support for the accumulation tests (core and torch): a mini-batch cut into micro-batches the way the
// qwen_gsm8k trainer cuts it. Its units (rows, or groups of group_size rows under group-token-mean) are shared out
// contiguously over the data-parallel ranks, each rank's share is cut into contiguous micro-batches, and each
// micro-batch keeps only the columns up to its longest masked row.
//
// Shapes: B = rows of the mini-batch, T = its columns; mask [B, T] row-major.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dapo::test {

struct Split {
  int64_t ranks = 1, micro_batches = 1;  // micro-batches per rank
  std::string name() const {
    return std::to_string(ranks) + " rank(s) x " + std::to_string(micro_batches) + " micro-batch(es)";
  }
};

// The ways every case is split: 1, 2 and 4 micro-batches on one rank, and 2 ranks with 2 micro-batches each.
inline const std::vector<Split> kSplits{{1, 1}, {1, 2}, {1, 4}, {2, 2}};

struct RowRange {
  int64_t first = 0, rows = 0;
};

struct MicroBatch {
  int64_t rank = 0;
  RowRange range;
  int64_t cols = 0;  // the columns it keeps: up to its longest masked row
};

struct MicroBatchPlan {
  std::vector<RowRange> rank_rows;  // each rank's share of the mini-batch (what it counts)
  std::vector<MicroBatch> micro_batches;
};

// `count` units from `first` in `parts` contiguous pieces of near-equal size; empty pieces are left out.
inline std::vector<RowRange> contiguous_pieces(int64_t first, int64_t count, int64_t parts) {
  std::vector<RowRange> pieces;
  for (int64_t part = 0; part < parts; ++part) {
    const int64_t begin = first + count * part / parts, end = first + count * (part + 1) / parts;
    if (end > begin) pieces.push_back({begin, end - begin});
  }
  return pieces;
}

// The columns up to and including the last masked one of rows [first, first + rows): 0 when no row has a token.
inline int64_t longest_masked_row(const std::vector<double>& mask, int64_t cols, const RowRange& range) {
  int64_t longest = 0;
  for (int64_t row = range.first; row < range.first + range.rows; ++row) {
    for (int64_t col = cols; col > longest; --col) {
      if (mask[static_cast<std::size_t>(row * cols + col - 1)] != 0.0) {
        longest = col;
        break;
      }
    }
  }
  return longest;
}

// unit_rows: 1, or group_size under group-token-mean (micro-batches hold whole groups).
inline MicroBatchPlan plan_micro_batches(const std::vector<double>& mask, int64_t rows, int64_t cols, int64_t unit_rows,
                                         const Split& split) {
  MicroBatchPlan plan;
  const int64_t units = rows / unit_rows;
  int64_t rank = 0;
  for (const RowRange& share : contiguous_pieces(0, units, split.ranks)) {
    plan.rank_rows.push_back({share.first * unit_rows, share.rows * unit_rows});
    for (const RowRange& piece : contiguous_pieces(share.first, share.rows, split.micro_batches)) {
      const RowRange range{piece.first * unit_rows, piece.rows * unit_rows};
      plan.micro_batches.push_back({rank, range, longest_masked_row(mask, cols, range)});
    }
    ++rank;
  }
  return plan;
}

// rows [range.first, + range.rows) and columns [0, keep_cols) of a row-major [*, cols] buffer.
inline std::vector<double> sub_block(const std::vector<double>& values, int64_t cols, const RowRange& range,
                                     int64_t keep_cols) {
  std::vector<double> block;
  for (int64_t row = range.first; row < range.first + range.rows; ++row) {
    const auto start = values.begin() + row * cols;
    block.insert(block.end(), start, start + keep_cols);
  }
  return block;
}

}  // namespace dapo::test
