"""Rollout correction with verl's names (rollout_corr_helper): importance-sampling weights between the rollout
engine's log-probs and the trainer's (truncated, TIS, or band-limited, IcePop; per token or per sequence) and the
rejection masks by KL-style statistics. Not differentiable: the weights are detached, as in verl."""

import torch

__all__ = ["rollout_is_weights", "rollout_rejection_mask"]


def _threshold(value):
    """verl's threshold: a number U, or the string "L_U"."""
    return value if isinstance(value, str) else repr(float(value))


def rollout_is_weights(log_ratio, response_mask, rollout_is="token", rollout_is_threshold=2.0, *,
                       rollout_is_batch_normalize=False):
    """log_ratio = old_log_prob - rollout_log_prob [B, T], response_mask [B, T] -> (weights [B, T], metrics).

    rollout_is: "token" or "sequence"; rollout_is_threshold: U (truncate at U) or "L_U" (zero outside [L, U]).
    The weights go to dapo.policy_loss(rollout_is_weights=...). metrics: verl's names without "rollout_corr/".
    """
    weights, metrics = torch.ops.dapo.rollout_is_weights(
        log_ratio, response_mask, str(rollout_is), _threshold(rollout_is_threshold), bool(rollout_is_batch_normalize)
    )
    return weights, dict(metrics)


def rollout_rejection_mask(log_ratio, response_mask, rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0"):
    """log_ratio, response_mask [B, T] -> (the kept mask [B, T], 0/1 in log_ratio's dtype, metrics).

    rollout_rs: verl's options (token_k1..k3, seq_sum_k1..k3, seq_mean_k1..k3, seq_max_k2/k3), comma separated or a
    list; rollout_rs_threshold: one for all or one per option, each U or "L_U" (k1's band), comma separated or a list.
    The kept mask replaces the response mask in the loss.
    """
    names = rollout_rs if isinstance(rollout_rs, str) else ",".join(rollout_rs)
    if isinstance(rollout_rs_threshold, (list, tuple)):
        thresholds = ",".join(_threshold(value) for value in rollout_rs_threshold)
    else:
        thresholds = _threshold(rollout_rs_threshold)
    mask, metrics = torch.ops.dapo.rollout_rejection_mask(log_ratio, response_mask, names, thresholds)
    return mask, dict(metrics)
