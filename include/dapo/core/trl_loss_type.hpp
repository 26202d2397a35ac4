// TRL's GRPOConfig.loss_type as dapo's loss options, read in TRL's grpo_trainer.py: which loss each name computes and
// what one call (one micro-batch on one process, as TRL's compute_loss sees it) divides by. The options go to
// dapo::policy_loss (or core::policy_loss); the call's loss times loss_scale is TRL's loss for that micro-batch.
//
//   grpo     vanilla clip, per row token mean, mean over ALL the call's rows (an empty row counts 0), / grad. accum.
//   sapo     the same aggregation with SAPO's soft gate (sapo_temperature_pos/neg = tau_pos/neg)
//   bnpo     vanilla clip, the call's own token mean, / gradient accumulation steps
//   dr_grpo  vanilla clip, token sum / (the call's rows * max_completion_length), / gradient accumulation steps
//   dapo     vanilla clip, token sum / (num_items_in_batch / num_processes * gradient_accumulation_steps /
//            steps_per_generation): the generation batch's tokens over every process, rescaled to one accumulation
//            window (TRL 1.16; the factor is 1 with TRL's default steps_per_generation); data parallel averages the
//            processes' gradients, so each call's loss is num_processes times its exact share of the token mean
//   cispo    -sg[min(ratio, epsilon_high)] * A * logp (epsilon_high the cap itself; TRL recommends 5.0), dapo's divisor
// TRL's two-sided clip (delta) applies to grpo, bnpo, dr_grpo and dapo; epsilon_high 0 means epsilon (TRL's default).
#pragma once

#include <cstdint>
#include <string_view>

#include "dapo/core/error.hpp"
#include "dapo/core/policy_loss_options.hpp"

namespace dapo {

struct TrlLossTypeArgs {  // GRPOConfig's fields, and what the trainer knows of the call
  double epsilon = 0.2;
  double epsilon_high = 0.0;  // 0: epsilon (cispo: required, the ratio's cap)
  double delta = 0.0;         // two-sided clip; 0: None
  double sapo_temperature_pos = 1.0, sapo_temperature_neg = 1.05;
  int64_t max_completion_length = 256;
  int64_t gradient_accumulation_steps = 1;  // TRL's current_gradient_accumulation_steps
  int64_t steps_per_generation = 0;         // dapo, cispo: TRL's steps_per_generation; 0: gradient_accumulation_steps
  int64_t num_processes = 1;
  double num_items_in_batch = 0.0;  // dapo, cispo: loss tokens of the generation batch on all processes; 0: this call's
  int64_t rows = 0;                 // grpo, sapo: the call's rows, empty ones included; 0: the rows with a token
};

struct TrlLossType {
  PolicyLossOptions options;
  double loss_scale = 1.0;  // TRL's loss of the call = dapo's loss of the call with `options`, times this
};

inline TrlLossType trl_loss_type(std::string_view loss_type, const TrlLossTypeArgs& args = {}) {
  constexpr const char* kWhere = "dapo::trl_loss_type";
  DAPO_REQUIRE(args.gradient_accumulation_steps >= 1 && args.num_processes >= 1 && args.max_completion_length >= 1 &&
                   args.rows >= 0 && args.num_items_in_batch >= 0.0 && args.steps_per_generation >= 0,
               kWhere, "gradient_accumulation_steps ", args.gradient_accumulation_steps, ", num_processes ",
               args.num_processes, ", max_completion_length ", args.max_completion_length, ", rows ", args.rows,
               ", num_items_in_batch ", args.num_items_in_batch, ", steps_per_generation ", args.steps_per_generation,
               ": expected the first three >= 1 and the last three >= 0 (0 = this call's own, or TRL's default)");
  TrlLossType out;
  PolicyLossOptions& o = out.options;
  o.clip_low = args.epsilon;
  o.clip_high = args.epsilon_high > 0.0 ? args.epsilon_high : args.epsilon;
  o.dual_clip = 0.0;  // TRL has no dual clip
  const double per_accumulation = 1.0 / static_cast<double>(args.gradient_accumulation_steps);
  const auto global_tokens = [&] {
    o.aggregation = LossAggregation::kTokenMean;
    o.global_token_count = args.num_items_in_batch;
    const int64_t steps_per_generation =
        args.steps_per_generation > 0 ? args.steps_per_generation : args.gradient_accumulation_steps;
    out.loss_scale = static_cast<double>(args.num_processes) * static_cast<double>(steps_per_generation) /
                     static_cast<double>(args.gradient_accumulation_steps);
  };
  if (loss_type == "grpo" || loss_type == "sapo") {
    o.mode = loss_type == "grpo" ? PolicyLossMode::kVanilla : PolicyLossMode::kSapo;
    o.aggregation = LossAggregation::kSeqMeanTokenMean;
    o.global_row_count = static_cast<double>(args.rows);
    o.tau_pos = args.sapo_temperature_pos;
    o.tau_neg = args.sapo_temperature_neg;
    out.loss_scale = per_accumulation;
  } else if (loss_type == "bnpo") {
    o.aggregation = LossAggregation::kTokenMean;
    out.loss_scale = per_accumulation;
  } else if (loss_type == "dr_grpo") {
    o.aggregation = LossAggregation::kSeqMeanTokenSumNorm;
    o.norm_length = static_cast<double>(args.max_completion_length);
    out.loss_scale = per_accumulation;
  } else if (loss_type == "dapo") {
    global_tokens();
  } else if (loss_type == "cispo") {
    DAPO_REQUIRE(args.epsilon_high > 1.0, kWhere, "cispo caps the ratio at epsilon_high, which is ", args.epsilon_high,
                 "; expected a value > 1 (TRL recommends 5.0)");
    o.mode = PolicyLossMode::kCispo;
    o.clip_low = 1.0;  // no lower bound: the ratio is never below 0
    o.clip_high = args.epsilon_high - 1.0;
    global_tokens();
  } else {
    DAPO_REQUIRE(false, kWhere, "loss_type '", loss_type,
                 "' is not one of grpo, bnpo, dr_grpo, dapo, cispo, sapo (TRL's luspo and vespo have no dapo loss)");
  }
  const bool clipped = o.mode == PolicyLossMode::kVanilla;
  DAPO_REQUIRE(args.delta == 0.0 || clipped, kWhere, "delta is ", args.delta, " but loss_type ", loss_type,
               " has no two-sided clip (TRL applies it to grpo, bnpo, dr_grpo and dapo)");
  o.delta = args.delta;
  check_policy_loss_options(o, args.rows, kWhere);
  return out;
}

}  // namespace dapo
