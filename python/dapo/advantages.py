"""Advantages and dynamic sampling with verl's names: GRPO / DAPO group-relative advantages on outcome rewards,
verl's advantage estimators on token-level rewards (by prompt index, as verl groups them), and DAPO's filter that
keeps the groups whose responses disagree. None of them is differentiable (rewards are data)."""

import torch

__all__ = ["group_advantages", "compute_advantage", "informative_groups", "ADV_ESTIMATORS"]

# verl's algorithm.adv_estimator names dapo computes (verl/trainer/ppo/core_algos.py).
ADV_ESTIMATORS = ("grpo", "grpo_passk", "rloo", "opo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gpg")


def group_advantages(rewards, group_size, *, scale_by_std=True, epsilon=1e-6, std_over_batch=False):
    """rewards [N] (a group's group_size responses consecutive) -> (r - mean_g) / (std_g + epsilon) [N], std
    unbiased; with scale_by_std=False, r - mean_g (Dr. GRPO); with std_over_batch=True, the std of all N rewards
    instead of std_g (TRL's scale_rewards="batch"; dapo.trl.advantages takes TRL's names)."""
    return torch.ops.dapo.group_advantages(
        rewards, int(group_size), bool(scale_by_std), float(epsilon), bool(std_over_batch)
    )


def _prompt_ids(index, rows):
    """verl's index (a uid per row: strings in a numpy array, or ints) as int64 ids, numbered by first appearance."""
    if isinstance(index, torch.Tensor):
        if index.dtype.is_floating_point or index.dtype == torch.bool or index.dim() != 1:
            raise ValueError(
                f"dapo.compute_advantage: index has shape {list(index.shape)} and dtype {index.dtype}, expected [{rows}] "
                "of an integer dtype or a sequence of prompt ids"
            )
        return index.to(torch.int64)
    values = index.tolist() if hasattr(index, "tolist") else list(index)
    if len(values) != rows:
        raise ValueError(f"dapo.compute_advantage: index has {len(values)} ids, expected one per row ({rows})")
    ids = {}
    return torch.tensor([ids.setdefault(value, len(ids)) for value in values], dtype=torch.int64)


def compute_advantage(
    token_level_rewards,
    response_mask,
    index,
    adv_estimator="grpo",
    *,
    norm_adv_by_std_in_grpo=True,
    epsilon=1e-6,
    gamma=1.0,
    f_norm=1.0,
):
    """verl's advantage estimator ``adv_estimator`` (ADV_ESTIMATORS) -> (advantages, returns), both [B, T] with the
    rewards' dtype and device, as verl's compute_<estimator>_outcome_advantage returns them.

    token_level_rewards, response_mask [B, T]; index: each row's prompt id ([B] integer tensor, or verl's uid array /
    any sequence of hashable ids; rows of one prompt may be anywhere). norm_adv_by_std_in_grpo (grpo, grpo_passk),
    epsilon, gamma (reinforce_plus_plus's discount) and f_norm (gpg) as verl names them.
    """
    if adv_estimator not in ADV_ESTIMATORS:
        raise ValueError(
            f"dapo.compute_advantage: adv_estimator is '{adv_estimator}', expected one of {', '.join(ADV_ESTIMATORS)}"
        )
    if not isinstance(token_level_rewards, torch.Tensor) or token_level_rewards.dim() != 2:
        shape = list(token_level_rewards.shape) if isinstance(token_level_rewards, torch.Tensor) else None
        raise ValueError(f"dapo.compute_advantage: token_level_rewards has shape {shape}, expected [B, T]")
    ids = _prompt_ids(index, token_level_rewards.shape[0])
    return torch.ops.dapo.estimate_advantages(
        token_level_rewards,
        response_mask,
        ids,
        adv_estimator,
        bool(norm_adv_by_std_in_grpo),
        float(epsilon),
        float(gamma),
        float(f_norm),
    )


def informative_groups(scores, group_size):
    """scores [N] (pass accuracy per response, a group's consecutive) -> bool [N / group_size]: True where the group's
    scores are not all equal (DAPO's dynamic sampling keeps those groups)."""
    return torch.ops.dapo.informative_groups(scores, int(group_size))
