"""The loss side of torch.ops.dapo with verl's names: the fused policy-loss family, the chunked lm-head log-probs,
the aggregations (verl's agg_loss, and each token's weight in one) and the KL estimators."""

import torch

__all__ = [
    "policy_loss",
    "linear_logprobs",
    "agg_loss",
    "aggregation_weights",
    "kl_penalty",
    "LOSS_MODES",
    "LOSS_AGG_MODES",
    "KL_PENALTIES",
    "VERL_COUNT_EPSILON",
]

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


def _check_aggregation(where, mask, mask_name, loss_agg_mode, dp_size, batch_num_tokens, global_batch_size):
    """verl's agg_loss keywords checked as verl checks them, naming the argument."""
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"{where}: loss_agg_mode is '{loss_agg_mode}', expected one of {', '.join(LOSS_AGG_MODES)}")
    if not isinstance(dp_size, int) or dp_size < 1:
        raise ValueError(f"{where}: dp_size is {dp_size!r}, expected an int >= 1")
    if dp_size > 1 and loss_agg_mode == "token-mean" and batch_num_tokens is None:
        raise ValueError(f"{where}: batch_num_tokens (the global batch's tokens) is required when dp_size > 1")
    if dp_size > 1 and loss_agg_mode.startswith("seq-mean") and global_batch_size is None:
        raise ValueError(f"{where}: global_batch_size (the global batch's rows) is required when dp_size > 1")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        shape = list(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{where}: {mask_name} has shape {shape}, expected [B, T]")


def _global_counts(mask, loss_agg_mode, batch_num_tokens, global_batch_size, loss_scale_factor):
    """(norm_length, global_token_count, global_row_count) of the library's options from verl's agg_loss keywords."""
    global_tokens = global_rows = norm_length = 0.0
    if loss_agg_mode == "token-mean" and batch_num_tokens is not None:
        global_tokens = float(batch_num_tokens)
    elif loss_agg_mode in ("seq-mean-token-mean", "seq-mean-token-sum") and global_batch_size is not None:
        global_rows = float(global_batch_size)
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        norm_length = float(_or(loss_scale_factor, mask.shape[-1]))
        # verl divides by global_batch_size, else by the rows that have a token (dapo alone: by all rows).
        global_rows = float(global_batch_size if global_batch_size is not None else int((mask.sum(-1) > 0).sum().item()))
    return norm_length, global_tokens, global_rows


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
    if verl_aggregation and loss_mode in ("gspo", "sapo"):
        loss_agg_mode = "seq-mean-token-mean"
    _check_aggregation("dapo.policy_loss", response_mask, "response_mask", loss_agg_mode, dp_size, batch_num_tokens,
                       global_batch_size)
    clip_c = _or(clip_ratio_c, 3.0 if loss_mode == "vanilla" else 20.0)
    norm_length, global_tokens, global_rows = _global_counts(
        response_mask, loss_agg_mode, batch_num_tokens, global_batch_size, loss_scale_factor
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


def aggregation_weights(
    response_mask,
    loss_agg_mode="token-mean",
    *,
    dp_size=1,
    batch_num_tokens=None,
    global_batch_size=None,
    loss_scale_factor=None,
    group_size=0,
    count_epsilon=VERL_COUNT_EPSILON,
    dtype=torch.float32,
):
    """Each token's weight [B, T] in ``loss_agg_mode``'s aggregation, the keywords as policy_loss takes them:
    ``(w * x).sum()`` is any per-token term x (a KL penalty, an entropy) aggregated as policy_loss aggregates its
    losses, counts and data-parallel share included. Not differentiable; ``dtype`` on response_mask's device."""
    _check_aggregation("dapo.aggregation_weights", response_mask, "response_mask", loss_agg_mode, dp_size,
                       batch_num_tokens, global_batch_size)
    norm_length, global_tokens, global_rows = _global_counts(
        response_mask, loss_agg_mode, batch_num_tokens, global_batch_size, loss_scale_factor
    )
    weights = torch.ops.dapo.aggregation_weights(
        response_mask, loss_agg_mode, int(group_size), norm_length, global_tokens, 0.0, global_rows,
        float(count_epsilon), dtype,
    )
    return weights * dp_size if dp_size > 1 else weights


def agg_loss(loss_mat, loss_mask, loss_agg_mode="token-mean", *, dp_size=1, batch_num_tokens=None,
             global_batch_size=None, loss_scale_factor=None):
    """verl's ``agg_loss(loss_mat, loss_mask, loss_agg_mode, **global_batch_info)``: loss_mat [B, T] aggregated over
    loss_mask's tokens (verl's five modes; masked-out entries are never read). Differentiable in loss_mat."""
    if loss_agg_mode == "group-token-mean":
        raise ValueError("dapo.agg_loss: group-token-mean is not one of verl's agg_loss modes (policy_loss has it)")
    _check_aggregation("dapo.agg_loss", loss_mask, "loss_mask", loss_agg_mode, dp_size, batch_num_tokens,
                       global_batch_size)
    return torch.ops.dapo.agg_loss(
        loss_mat, loss_mask, loss_agg_mode, int(dp_size), float(_or(batch_num_tokens, 0.0)),
        float(_or(global_batch_size, 0.0)), float(_or(loss_scale_factor, 0.0)),
    )


# verl's kl_penalty names (k3+ and k1+: the estimator's value with k2's gradient, straight through).
KL_PENALTIES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k3+", "low_var_kl+")


def kl_penalty(logprob, ref_logprob, kl_penalty="low_var_kl"):
    """verl's ``kl_penalty(logprob, ref_logprob, kl_penalty)``: the per-token estimate of KL(pi || pi_ref), same
    shape. Differentiable in logprob (and ref_logprob)."""
    return torch.ops.dapo.kl_penalty(logprob, ref_logprob, str(kl_penalty))
