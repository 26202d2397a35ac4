// Everything of dapo that works on LibTorch tensors, and the rule rewards. Includes only; each topic has its header.
#pragma once

#include "dapo/advantage.hpp"
#include "dapo/aggregation.hpp"
#include "dapo/core/trl_loss_type.hpp"
#include "dapo/kl_penalty.hpp"
#include "dapo/logprob.hpp"
#include "dapo/loss.hpp"
#include "dapo/reward.hpp"
#include "dapo/rewards/gsm8k.hpp"
#include "dapo/rollout_correction.hpp"
#include "dapo/sampling.hpp"
