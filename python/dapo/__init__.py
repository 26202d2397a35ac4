"""dapo from Python: the fused policy-loss family, the chunked lm-head log-probs and the rest of the algorithm (verl's
advantage estimators, dynamic sampling, rollout correction, KL penalties, aggregations, overlong shaping, GSM8K
rewards) of the C++ library.

The ops are registered with PyTorch's dispatcher as ``torch.ops.dapo.*`` (python/csrc, built by
scripts/python-build.sh); the functions here take verl's argument names and defaults. The losses are differentiable,
on the CPU and, where LibTorch has CUDA, on CUDA. A bad argument raises ValueError naming it and its shape.

    import dapo
    loss, metrics = dapo.policy_loss(old_log_prob, log_prob, advantages, response_mask,
                                     loss_agg_mode="token-mean", clip_ratio_low=0.2, clip_ratio_high=0.28)
    log_prob = dapo.linear_logprobs(hidden, lm_head.weight, targets)  # never makes the [N, V] logits
    advantages, returns = dapo.compute_advantage(token_level_rewards, response_mask, index, "grpo")

Modules: dapo.losses, dapo.advantages, dapo.rollout, dapo.rewards (all re-exported here); adapters: dapo.verl (a
function for verl's register_policy_loss), dapo.trl (Liger's fused linear GRPO call shape).
"""

import glob as _glob
import os as _os

import torch


def _load():
    here = _os.path.dirname(_os.path.abspath(__file__))
    found = sorted(_glob.glob(_os.path.join(here, "libdapo_torch_ops*.so")))
    if not found:
        raise ImportError(
            f"dapo: the compiled ops (libdapo_torch_ops.so) are not in {here}; build them with scripts/python-build.sh"
        )
    torch.ops.load_library(found[0])
    return found[0]


library_path = _load()

from dapo import advantages, losses, rewards, rollout  # noqa: E402  (the ops load first)
from dapo.advantages import *  # noqa: E402,F401,F403
from dapo.losses import *  # noqa: E402,F401,F403
from dapo.rewards import *  # noqa: E402,F401,F403
from dapo.rollout import *  # noqa: E402,F401,F403

__all__ = [*losses.__all__, *advantages.__all__, *rollout.__all__, *rewards.__all__, "library_path"]
