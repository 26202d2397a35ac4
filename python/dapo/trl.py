"""dapo's fused losses for TRL users: GRPOLossMixin, a drop-in for TRL's own GRPOTrainer loss; grpo_loss, that loss
on per-token log-probs by GRPOConfig's names; advantages, TRL's; and a module with the call shape of Liger-Kernel's
fused linear GRPO loss (which TRL 1.16's GRPOTrainer no longer calls: Liger serves its model only there): last hidden
states and the lm-head weight in, loss and metrics out, never the [B, T, V] logits.

    loss_fn = dapo.trl.FusedLinearGRPOLoss(beta=0.0, epsilon_low=0.2, epsilon_high=0.28, loss_type="dapo")
    loss, metrics = loss_fn(last_hidden_state, model.lm_head.weight, completion_ids, completion_mask, advantages,
                            old_per_token_logps=old_logps)

TRL's loss_type names mean what they mean in TRL (GRPOConfig.loss_type), per call:
  grpo, sapo  per row token mean, then the mean over the call's rows (an empty row counts 0)
  bnpo        the call's token mean
  dr_grpo     token sum / (rows * max_completion_length)
  dapo        token sum / the call's tokens (or `loss_normalizer`, e.g. TRL's num_items_in_batch / num_processes)
  cispo       -sg[min(ratio, epsilon_high)] * A * logp with dapo's divisor (epsilon_high is the cap, e.g. 5.0)
importance_sampling_level="sequence" is GSPO (the ratio of the row's mean log-ratio). The KL term beta * k3(ref, logp)
is added to each token's loss before the aggregation, as TRL does (times the importance ratio with
use_bias_correction_kl=True, TRL 1.16's GRPOConfig default; False here, Liger's). metrics: [mean KL (when beta != 0), clip ratio],
each a masked mean over the call's tokens.
"""

import torch

import dapo

__all__ = ["FusedLinearGRPOLoss", "GRPOLossMixin", "grpo_loss", "advantages", "LOSS_TYPES", "SCALE_REWARDS"]

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo")
SCALE_REWARDS = ("group", "batch", "none")


def _k3(log_prob, old_log_prob, ref_log_prob, mask, sequence, bias_correction):
    """TRL's per-token KL k3(ref, logp); with bias_correction (GRPOConfig.use_bias_correction_kl, TRL 1.16's
    default) times the importance ratio exp(logp - old), differentiable (the row's mean log-ratio at sequence level)."""
    difference = ref_log_prob - log_prob
    kl = torch.exp(difference) - difference - 1.0
    if bias_correction:
        log_ratio = log_prob - old_log_prob
        if sequence:
            log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0))[:, None]
        kl = kl * torch.exp(log_ratio)
    return kl


def _loss_mask(mask, dtype):
    """TRL's completion masks are integer tensors; the fused loss takes bool or floating 0/1."""
    return mask if mask.dtype == torch.bool or mask.is_floating_point() else mask.to(dtype)


def advantages(rewards, num_generations, scale_rewards="group", epsilon=1e-4):
    """GRPOTrainer's advantages of one generation batch's rewards [N] (each prompt's num_generations consecutive):
    r - the group's mean, divided by the group's std (scale_rewards="group"), the batch's ("batch") or nothing
    ("none"), plus TRL's epsilon 1e-4; stds unbiased, as TRL's."""
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"dapo.trl: scale_rewards is '{scale_rewards}', expected one of {', '.join(SCALE_REWARDS)}")
    return dapo.group_advantages(
        rewards, num_generations, scale_by_std=scale_rewards != "none", epsilon=epsilon,
        std_over_batch=scale_rewards == "batch",
    )


def grpo_loss(
    per_token_logps,  # [B, T], differentiable
    old_per_token_logps,  # [B, T]; None: on-policy (per_token_logps detached)
    advantages,  # [B]
    completion_mask,  # [B, T]
    *,
    loss_type="dapo",
    epsilon=0.2,
    epsilon_high=None,
    delta=None,
    importance_sampling_level="token",
    sapo_temperature_pos=1.0,
    sapo_temperature_neg=1.05,
    max_completion_length=256,
    gradient_accumulation_steps=1,
    steps_per_generation=None,
    num_processes=1,
    num_items_in_batch=None,
    beta=0.0,
    ref_per_token_logps=None,
    use_bias_correction_kl=True,
):
    """GRPOTrainer's loss of one call (one micro-batch on one process, in training) on per-token log-probs, by TRL's
    names: the options come from dapo::trl_loss_type, the mapping behind the driver's --loss-type, and the loss from
    the fused dapo.policy_loss, times TRL's scale. beta > 0 adds beta * k3(ref, logp) to each token before the
    aggregation, as TRL does, times the importance ratio with use_bias_correction_kl (TRL 1.16's default).
    num_items_in_batch (dapo, cispo): the generation batch's loss tokens over all processes
    (None: this call's). Returns (loss, metrics), metrics as dapo.policy_loss's plus "kl" when beta != 0."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"dapo.trl: loss_type is '{loss_type}', expected one of {', '.join(LOSS_TYPES)}")
    if importance_sampling_level not in ("token", "sequence"):
        raise ValueError(
            f"dapo.trl: importance_sampling_level is '{importance_sampling_level}', expected token or sequence"
        )
    if importance_sampling_level == "sequence" and loss_type in ("cispo", "sapo"):
        raise ValueError(f"dapo.trl: loss_type {loss_type} is token-level only (importance_sampling_level=token)")
    mask = _loss_mask(completion_mask, per_token_logps.dtype)
    if old_per_token_logps is None:
        old_per_token_logps = per_token_logps.detach()
    loss_mode, aggregation, o = torch.ops.dapo.trl_loss_options(
        loss_type,
        float(epsilon),
        float(0.0 if epsilon_high is None else epsilon_high),
        float(0.0 if delta is None else delta),
        float(sapo_temperature_pos),
        float(sapo_temperature_neg),
        int(max_completion_length),
        int(gradient_accumulation_steps),
        int(0 if steps_per_generation is None else steps_per_generation),
        int(num_processes),
        float(0.0 if num_items_in_batch is None else num_items_in_batch),
        int(mask.shape[0]),
    )
    if importance_sampling_level == "sequence":
        loss_mode = "gspo"  # the ratio of the row's mean log-ratio, TRL's sequence level
    loss, clipfrac, ppo_kl, _ = torch.ops.dapo.policy_loss(
        old_per_token_logps, per_token_logps, advantages, mask, loss_mode, aggregation, o["clip_low"], o["clip_high"],
        o["dual_clip"], o["delta"], 20.0, o["tau_pos"], o["tau_neg"], 0.0, 2e-4, 0.1, 2e-4, 1.0, 5.0, 0,
        o["norm_length"], o["global_token_count"], 0.0, o["global_row_count"], o["count_epsilon"], None, None,
    )
    metrics = {"actor/pg_clipfrac": clipfrac, "actor/ppo_kl": ppo_kl}
    if beta != 0.0:
        if ref_per_token_logps is None:
            raise ValueError("dapo.trl: beta != 0 needs ref_per_token_logps")
        kl = _k3(per_token_logps, old_per_token_logps, ref_per_token_logps, mask.to(per_token_logps.dtype),
                 importance_sampling_level == "sequence", use_bias_correction_kl)
        weights = torch.ops.dapo.aggregation_weights(
            mask, aggregation, 0, o["norm_length"], o["global_token_count"], 0.0, o["global_row_count"],
            o["count_epsilon"], per_token_logps.dtype,
        )
        loss = loss + beta * (weights * kl).sum()
        metrics["kl"] = (kl * mask).sum().detach() / mask.sum().clamp(min=1.0)
    return loss * o["loss_scale"], metrics


class FusedLinearGRPOLoss(torch.nn.Module):
    def __init__(
        self,
        beta=0.04,
        chunk_size=1024,
        epsilon_low=0.2,
        epsilon_high=0.2,
        loss_type="dapo",
        max_completion_length=None,
        importance_sampling_level="token",
        sapo_temperature_pos=1.0,
        sapo_temperature_neg=1.05,
        temperature=1.0,
        delta=None,
        use_ref_model=True,
        use_bias_correction_kl=False,
    ):
        super().__init__()
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"dapo.trl: loss_type is '{loss_type}', expected one of {', '.join(LOSS_TYPES)}")
        if importance_sampling_level not in ("token", "sequence"):
            raise ValueError(
                f"dapo.trl: importance_sampling_level is '{importance_sampling_level}', expected token or sequence"
            )
        if loss_type == "dr_grpo" and max_completion_length is None:
            raise ValueError("dapo.trl: loss_type dr_grpo needs max_completion_length")
        if loss_type == "cispo" and not epsilon_high > 1.0:
            raise ValueError(f"dapo.trl: cispo caps the ratio at epsilon_high, which is {epsilon_high}; expected > 1")
        if loss_type in ("cispo", "sapo") and importance_sampling_level == "sequence":
            raise ValueError(f"dapo.trl: loss_type {loss_type} is token-level only (importance_sampling_level=token)")
        if delta is not None and loss_type in ("cispo", "sapo"):
            raise ValueError(f"dapo.trl: delta (the two-sided clip) does not apply to loss_type {loss_type}")
        self.beta = beta
        self.chunk_size = chunk_size
        self.epsilon_low = epsilon_low
        self.epsilon_high = epsilon_high
        self.loss_type = loss_type
        self.max_completion_length = max_completion_length
        self.importance_sampling_level = importance_sampling_level
        self.sapo_temperature_pos = sapo_temperature_pos
        self.sapo_temperature_neg = sapo_temperature_neg
        self.temperature = temperature
        self.delta = delta
        self.use_ref_model = use_ref_model
        self.use_bias_correction_kl = use_bias_correction_kl

    def _log_probs(self, hidden, weight, bias, token_ids, where):
        if bias is not None:
            raise ValueError(f"dapo.trl: {where} has a bias; the fused log-probs take an lm-head without one")
        if hidden.dim() != 3 or token_ids.dim() != 2 or hidden.shape[:2] != token_ids.shape:
            raise ValueError(
                f"dapo.trl: {where} has shape {list(hidden.shape)} and selected_token_ids {list(token_ids.shape)}; "
                "expected [B, T, H] and [B, T]"
            )
        rows, cols, size = hidden.shape
        log_prob = dapo.linear_logprobs(
            hidden.reshape(rows * cols, size),
            weight,
            token_ids.reshape(-1),
            chunk_size=self.chunk_size,
            temperature=self.temperature,
        )
        return log_prob.reshape(rows, cols)

    def forward(
        self,
        _input,  # [B, T, H] last hidden states of the completions
        lin_weight,  # [V, H] lm-head
        selected_token_ids,  # [B, T] completion ids
        attention_mask,  # [B, T] completion mask
        advantages,  # [B]
        bias=None,
        ref_per_token_logps=None,  # [B, T]
        old_per_token_logps=None,  # [B, T]; None: on-policy (the current log-probs, detached)
        ref_input=None,
        ref_weight=None,
        ref_bias=None,
        loss_normalizer=None,  # dapo, cispo: the divisor (default: the call's tokens)
    ):
        log_prob = self._log_probs(_input, lin_weight, bias, selected_token_ids, "_input")
        mask = attention_mask.to(log_prob.dtype)
        if old_per_token_logps is None:
            old_per_token_logps = log_prob.detach()
        rows = mask.shape[0]
        tokens = float(mask.sum().item())
        normalizer = float(loss_normalizer) if loss_normalizer is not None else max(tokens, 1.0)
        sequence = self.importance_sampling_level == "sequence"
        options = {
            "loss_mode": "gspo" if sequence else {"cispo": "cispo", "sapo": "sapo"}.get(self.loss_type, "vanilla"),
            "clip_ratio_low": self.epsilon_low,
            "clip_ratio_high": self.epsilon_high,
            "clip_ratio_c": 0.0,  # TRL has no dual clip
            "delta": self.delta,
            "tau_pos": self.sapo_temperature_pos,
            "tau_neg": self.sapo_temperature_neg,
            "verl_aggregation": False,
            "count_epsilon": 0.0,
        }
        if self.loss_type == "cispo":  # no lower bound; the cap is epsilon_high itself
            options.update(clip_ratio_low=1.0, clip_ratio_high=self.epsilon_high - 1.0)
        if self.loss_type in ("grpo", "sapo"):
            aggregation, options["global_batch_size"] = "seq-mean-token-mean", rows
        elif self.loss_type == "bnpo":
            aggregation = "token-mean"
        elif self.loss_type == "dr_grpo":
            aggregation = "seq-mean-token-sum-norm"
            options.update(global_batch_size=rows, loss_scale_factor=self.max_completion_length)
        else:
            aggregation, options["batch_num_tokens"] = "token-mean", normalizer
            if tokens > normalizer:
                raise ValueError(f"dapo.trl: loss_normalizer {normalizer} is below the call's {tokens:g} tokens")
        loss, pg_metrics = dapo.policy_loss(
            old_per_token_logps, log_prob, advantages, _loss_mask(attention_mask, log_prob.dtype), aggregation, **options
        )
        metrics = []
        if self.beta != 0.0:
            if ref_per_token_logps is None:
                if ref_input is not None and ref_weight is not None and self.use_ref_model:
                    with torch.no_grad():
                        ref_per_token_logps = self._log_probs(
                            ref_input, ref_weight, ref_bias, selected_token_ids, "ref_input"
                        )
                else:
                    ref_per_token_logps = log_prob.detach()
            kl = _k3(log_prob, old_per_token_logps, ref_per_token_logps, mask, sequence, self.use_bias_correction_kl)
            # aggregated as the policy loss is: the same aggregation, the same counts
            weights = dapo.aggregation_weights(
                _loss_mask(attention_mask, log_prob.dtype),
                aggregation,
                batch_num_tokens=options.get("batch_num_tokens"),
                global_batch_size=options.get("global_batch_size"),
                loss_scale_factor=options.get("loss_scale_factor"),
                count_epsilon=0.0,
                dtype=log_prob.dtype,
            )
            loss = loss + self.beta * (weights * kl).sum()
            metrics.append((kl * mask).sum().detach() / max(tokens, 1.0))
        if self.loss_type == "cispo":  # TRL counts the capped tokens of positive advantage only (verl: all of them)
            with torch.no_grad():
                capped = (torch.exp(log_prob - old_per_token_logps) > self.epsilon_high) & (advantages[:, None] > 0)
                metrics.append((capped * mask).sum() / max(tokens, 1.0))
        else:
            metrics.append(pg_metrics["actor/pg_clipfrac"])
        return loss, metrics


class GRPOLossMixin:
    """dapo's fused loss inside TRL's own GRPOTrainer, a drop-in for its loss:

        from trl import GRPOTrainer
        import dapo.trl

        class Trainer(dapo.trl.GRPOLossMixin, GRPOTrainer):
            pass

        trainer = Trainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...)

    Everything else stays TRL's (generation, rewards, advantages, masks, the reference model, the optimizer): only
    _compute_loss is replaced. The per-token log-probs come from TRL's own _get_per_token_logps_and_entropies and the
    loss from dapo.trl.grpo_loss with the trainer's settings (loss_type, epsilon / epsilon_high, delta,
    importance_sampling_level, beta with use_bias_correction_kl, sapo temperatures, the accumulation and
    steps_per_generation divisors, num_items_in_batch over the processes). Settings whose loss it does not compute are
    refused by name: top_entropy_quantile < 1, off_policy_mask_threshold, vLLM importance-sampling correction, an
    entropy bonus, a router aux loss, and the loss types vespo and luspo. Logs TRL's kl and clip_ratio/region_mean."""

    def _dapo_unsupported(self):
        args = self.args
        checks = [
            (self.loss_type not in LOSS_TYPES, f"loss_type '{self.loss_type}'"),
            (getattr(self, "top_entropy_quantile", 1.0) < 1.0, "top_entropy_quantile < 1"),
            (getattr(self, "off_policy_mask_threshold", None) is not None, "off_policy_mask_threshold"),
            (getattr(self, "use_vllm", False) and getattr(self, "vllm_importance_sampling_correction", False),
             "vllm_importance_sampling_correction"),
            (getattr(self, "_entropy_bonus_enabled", False), "an entropy bonus (entropy_coef)"),
            (getattr(self, "aux_loss_enabled", False), "a router aux loss"),
        ]
        return [name for bad, name in checks if bad]

    def _compute_loss(self, model, inputs):
        unsupported = self._dapo_unsupported()
        if unsupported:
            raise ValueError(f"dapo.trl.GRPOLossMixin: {', '.join(unsupported)} is not computed by dapo's loss; "
                             "use TRL's own GRPOTrainer for it")
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        logps, _, _ = self._get_per_token_logps_and_entropies(model, input_ids, attention_mask, completion_ids.size(1))
        training = self.model.training
        accumulation = self.current_gradient_accumulation_steps if training else 1
        loss, metrics = grpo_loss(
            logps,
            inputs.get("old_per_token_logps"),
            inputs["advantages"],
            mask,
            loss_type=self.loss_type,
            epsilon=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            delta=self.args.delta,
            importance_sampling_level=self.importance_sampling_level,
            sapo_temperature_pos=self.args.sapo_temperature_pos,
            sapo_temperature_neg=self.args.sapo_temperature_neg,
            max_completion_length=self.max_completion_length,
            gradient_accumulation_steps=accumulation,
            steps_per_generation=self.args.steps_per_generation if training else 1,
            num_processes=self.accelerator.num_processes,
            num_items_in_batch=float(inputs["num_items_in_batch"]),
            beta=self.beta,
            ref_per_token_logps=inputs.get("ref_per_token_logps"),
            use_bias_correction_kl=self.args.use_bias_correction_kl,
        )
        mode = "train" if training else "eval"
        if "kl" in metrics:
            self._metrics[mode]["kl"].append(self.accelerator.gather(metrics["kl"]).mean().item())
        if self.loss_type not in ("cispo", "sapo"):
            clipped = self.accelerator.gather(metrics["actor/pg_clipfrac"].detach()).mean().item()
            self._metrics[mode]["clip_ratio/region_mean"].append(clipped)
        return loss
