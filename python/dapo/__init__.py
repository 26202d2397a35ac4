"""dapo from Python: the fused policy-loss family and the chunked lm-head log-probs of the C++ library.

The ops are registered with PyTorch's dispatcher as ``torch.ops.dapo.policy_loss`` and
``torch.ops.dapo.linear_logprobs`` (python/csrc/torch_ops.cpp, built by scripts/python-build.sh); the functions here
take verl's argument names and defaults. Both are differentiable, on the CPU and, where LibTorch has CUDA, on CUDA.
A bad argument raises ValueError naming it and its shape.

    import dapo
    loss, metrics = dapo.policy_loss(old_log_prob, log_prob, advantages, response_mask,
                                     loss_agg_mode="token-mean", clip_ratio_low=0.2, clip_ratio_high=0.28)
    log_prob = dapo.linear_logprobs(hidden, lm_head.weight, targets)  # never makes the [N, V] logits

Adapters: dapo.verl (a function for verl's register_policy_loss).
"""

import glob as _glob
import os as _os

import torch

__all__ = ["policy_loss", "linear_logprobs", "LOSS_MODES", "LOSS_AGG_MODES", "library_path"]


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

# verl's policy_loss.loss_mode and loss_agg_mode names (group-token-mean is dapo's own: the DAPO paper's per-group mean).
LOSS_MODES = ("vanilla", "gspo", "sapo", "cispo", "geo_mean", "dppo_tv", "dppo_kl", "dro", "kl_cov", "clip_cov", "gpg")
LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "group-token-mean",
)

# The metrics verl's own function for each loss reports (verl/trainer/ppo/core_algos.py); the rest report all three.
_REPORTED = {
    "clip_cov": ("actor/pg_clipfrac", "actor/ppo_kl"),
    "kl_cov": ("actor/ppo_kl",),
    "dro": ("actor/ppo_kl",),
    "gpg": (),
}
_ALL_METRICS = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")

# verl adds 1e-8 to every count a mean divides by; with it the results equal verl's to the last bits.
VERL_COUNT_EPSILON = 1e-8


def _or(value, default):
    return default if value is None else value


def policy_loss(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode="token-mean",
    *,
    loss_mode="vanilla",
    clip_ratio=0.2,
    clip_ratio_low=None,
    clip_ratio_high=None,
    clip_ratio_c=None,
    delta=None,
    tau_pos=1.0,
    tau_neg=1.05,
    dro_beta=None,
    kl_cov_ratio=0.0002,
    ppo_kl_coef=0.1,
    clip_cov_ratio=0.0002,
    clip_cov_lb=1.0,
    clip_cov_ub=5.0,
    rollout_is_weights=None,
    dp_size=1,
    batch_num_tokens=None,
    global_batch_size=None,
    loss_scale_factor=None,
    group_size=0,
    verl_aggregation=True,
    count_epsilon=VERL_COUNT_EPSILON,
    generator=None,
):
    """verl's policy loss ``loss_mode`` aggregated by ``loss_agg_mode``, as verl computes it, fused.

    Tensors: old_log_prob, log_prob, response_mask [B, T]; advantages [B, T] or [B]; rollout_is_weights [B, T] or
    None (each token's loss times its weight, verl's rollout correction). Differentiable in log_prob.

    Options by verl's names and defaults (actor config): clip_ratio_low / clip_ratio_high default to clip_ratio;
    clip_ratio_c is vanilla's dual clip (default 3.0; 0 turns it off) and dppo_tv / dppo_kl's ratio cap (default
    20.0); tau_pos / tau_neg (sapo); dro_beta (dro, required there), kl_cov_ratio, ppo_kl_coef (kl_cov),
    clip_cov_ratio / lb / ub (clip_cov, whose random choice comes from ``generator``, a CPU torch.Generator).
    delta: TRL's two-sided clip of vanilla (the unclipped ratio capped at delta); None is off.
    dp_size, batch_num_tokens, global_batch_size, loss_scale_factor: verl's agg_loss keywords (global_batch_info)
    for a micro-batch of a data-parallel batch. group_size: group-token-mean's rows per group.
    verl_aggregation: gspo and sapo aggregate with seq-mean-token-mean whatever loss_agg_mode says, as in verl.
    count_epsilon: added to every count a mean divides by (verl's 1e-8; 0 divides by the count itself).

    Returns (loss, metrics): a scalar tensor and a dict of 0-dim tensors by verl's names (actor/pg_clipfrac,
    actor/ppo_kl, actor/pg_clipfrac_lower, those verl reports for the loss), not synchronised with .item().
    """
    if loss_mode not in LOSS_MODES:
        raise ValueError(f"dapo.policy_loss: loss_mode is '{loss_mode}', expected one of {', '.join(LOSS_MODES)}")
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"dapo.policy_loss: loss_agg_mode is '{loss_agg_mode}', expected one of {', '.join(LOSS_AGG_MODES)}"
        )
    if not isinstance(dp_size, int) or dp_size < 1:
        raise ValueError(f"dapo.policy_loss: dp_size is {dp_size!r}, expected an int >= 1")
    if verl_aggregation and loss_mode in ("gspo", "sapo"):
        loss_agg_mode = "seq-mean-token-mean"
    if dp_size > 1 and loss_agg_mode == "token-mean" and batch_num_tokens is None:
        raise ValueError("dapo.policy_loss: batch_num_tokens (the global batch's tokens) is required when dp_size > 1")
    if dp_size > 1 and loss_agg_mode.startswith("seq-mean") and global_batch_size is None:
        raise ValueError("dapo.policy_loss: global_batch_size (the global batch's rows) is required when dp_size > 1")
    if not isinstance(response_mask, torch.Tensor) or response_mask.dim() != 2:
        shape = list(response_mask.shape) if isinstance(response_mask, torch.Tensor) else type(response_mask).__name__
        raise ValueError(f"dapo.policy_loss: response_mask has shape {shape}, expected [B, T]")
    clip_c = _or(clip_ratio_c, 3.0 if loss_mode == "vanilla" else 20.0)
    global_tokens = global_rows = 0.0
    norm_length = 0.0
    if loss_agg_mode == "token-mean" and batch_num_tokens is not None:
        global_tokens = float(batch_num_tokens)
    elif loss_agg_mode in ("seq-mean-token-mean", "seq-mean-token-sum") and global_batch_size is not None:
        global_rows = float(global_batch_size)
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        norm_length = float(_or(loss_scale_factor, response_mask.shape[-1]))
        # verl divides by global_batch_size, else by the rows that have a token (dapo alone: by all rows).
        global_rows = float(
            global_batch_size if global_batch_size is not None else int((response_mask.sum(-1) > 0).sum().item())
        )
    loss, clipfrac, ppo_kl, clipfrac_lower = torch.ops.dapo.policy_loss(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_mode,
        loss_agg_mode,
        float(_or(clip_ratio_low, clip_ratio)),
        float(_or(clip_ratio_high, clip_ratio)),
        float(clip_c) if loss_mode == "vanilla" else 0.0,
        float(_or(delta, 0.0)),
        float(clip_c) if loss_mode in ("dppo_tv", "dppo_kl") else 20.0,
        float(tau_pos),
        float(tau_neg),
        float(_or(dro_beta, 0.0)),
        float(kl_cov_ratio),
        float(_or(ppo_kl_coef, 1.0)),
        float(clip_cov_ratio),
        float(clip_cov_lb),
        float(clip_cov_ub),
        int(group_size),
        norm_length,
        global_tokens,
        0.0,
        global_rows,
        float(count_epsilon),
        rollout_is_weights,
        generator,
    )
    if dp_size > 1:  # verl scales each rank's loss by dp_size: data parallel averages the ranks' gradients
        loss = loss * dp_size
    values = {"actor/pg_clipfrac": clipfrac, "actor/ppo_kl": ppo_kl, "actor/pg_clipfrac_lower": clipfrac_lower}
    return loss, {name: values[name] for name in _REPORTED.get(loss_mode, _ALL_METRICS)}


def linear_logprobs(hidden, weight, targets, *, chunk_size=1024, temperature=1.0, with_entropy=False):
    """log p(targets | hidden @ weight.T / temperature) [N] without the [N, V] logits (chunks of chunk_size rows).

    hidden [N, H], weight [V, H] (the lm-head), targets [N] int64. Differentiable in hidden and weight; the backward
    recomputes each chunk's logits. With with_entropy, returns (log_prob, entropy), both [N].
    """
    log_prob, entropy = torch.ops.dapo.linear_logprobs(
        hidden, weight, targets, int(chunk_size), float(temperature), bool(with_entropy)
    )
    return (log_prob, entropy) if with_entropy else log_prob
