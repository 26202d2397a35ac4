"""dapo's fused losses as verl policy losses: functions with the signature of verl's registered ones.

verl looks a policy loss up by ``actor.policy_loss.loss_mode`` in its registry; one line registers dapo's fused
version of any of verl's losses under a name of your choice:

    from verl.trainer.ppo.core_algos import register_policy_loss
    import dapo.verl
    register_policy_loss("dapo_fused")(dapo.verl.policy_loss_fn("vanilla"))  # then actor.policy_loss.loss_mode=dapo_fused

The function reads verl's actor config as verl's own function for that loss does (clip_ratio, clip_ratio_low/high,
clip_ratio_c, tau_pos/neg, policy_loss.dro_beta / kl_cov_ratio / ppo_kl_coef / clip_cov_*, global_batch_info) and
returns (loss, metrics) with the metrics as Python floats, as verl's do. It imports nothing from verl.
"""

import dapo

__all__ = ["policy_loss_fn", "options_from_config"]


def _get(config, key, default=None):
    """config[key] for a dict, config.key for verl's dataclass configs (and OmegaConf), else default; None -> default."""
    if config is None:
        return default
    value = config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)
    return default if value is None else value


def options_from_config(loss_mode, config):
    """dapo.policy_loss's keyword arguments for verl's loss ``loss_mode`` under verl's actor ``config``."""
    if loss_mode not in dapo.LOSS_MODES:
        raise ValueError(f"dapo.verl: loss_mode is '{loss_mode}', expected one of {', '.join(dapo.LOSS_MODES)}")
    clip_ratio = _get(config, "clip_ratio", 0.2)
    policy = _get(config, "policy_loss")
    options = {
        "loss_mode": loss_mode,
        "clip_ratio": clip_ratio,
        "clip_ratio_low": _get(config, "clip_ratio_low", clip_ratio),
        "clip_ratio_high": _get(config, "clip_ratio_high", clip_ratio),
        "clip_ratio_c": _get(config, "clip_ratio_c", 3.0 if loss_mode == "vanilla" else 20.0),
        "tau_pos": _get(config, "tau_pos", 1.0),
        "tau_neg": _get(config, "tau_neg", 1.05),
        "dro_beta": _get(policy, "dro_beta"),
        "kl_cov_ratio": _get(policy, "kl_cov_ratio", 0.0002),
        "ppo_kl_coef": _get(policy, "ppo_kl_coef", 1.0),  # core_algos.py's default where the key is null
        "clip_cov_ratio": _get(policy, "clip_cov_ratio", 0.0002),
        "clip_cov_lb": _get(policy, "clip_cov_lb", 1.0),
        "clip_cov_ub": _get(policy, "clip_cov_ub", 5.0),
    }
    batch_info = _get(config, "global_batch_info", {}) or {}
    for key in ("dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor"):
        if batch_info.get(key) is not None:
            options[key] = batch_info[key]
    return options


def policy_loss_fn(loss_mode="vanilla"):
    """A verl policy loss (verl's PolicyLossFn signature) computing verl's ``loss_mode`` with dapo's fused kernels."""
    options_from_config(loss_mode, None)  # checks the name now, not at the first step

    def compute_policy_loss(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
        rollout_is_weights=None,
    ):
        loss, metrics = dapo.policy_loss(
            old_log_prob,
            log_prob,
            advantages,
            response_mask,
            loss_agg_mode,
            rollout_is_weights=rollout_is_weights,
            **options_from_config(loss_mode, config),
        )
        return loss, {name: value.detach().item() for name, value in metrics.items()}

    compute_policy_loss.__name__ = f"compute_policy_loss_dapo_{loss_mode}"
    compute_policy_loss.__qualname__ = compute_policy_loss.__name__
    return compute_policy_loss
