"""dapo.trl.FusedLinearGRPOLoss against TRL's GRPO loss written here in plain PyTorch from its definition (full
logits: log_softmax(hidden @ W.T / temperature), then the loss_type's formula), for every loss_type, token and sequence
importance sampling, with and without the KL term: loss, metrics and the gradients of the hidden states and the
lm-head, in float64; and its argument errors."""

import pytest
import torch

import dapo.trl
from conftest import DEVICES


def plain_trl_loss(hidden, weight, ids, mask, advantages, old, ref, *, beta, low, high, loss_type, max_length,
                   level, tau_pos, tau_neg, temperature):
    log_prob = torch.log_softmax(hidden @ weight.T / temperature, dim=-1).gather(-1, ids[..., None])[..., 0]
    old = log_prob.detach() if old is None else old
    log_ratio = log_prob - old
    if level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0))[:, None]
    ratio = torch.exp(log_ratio)
    a = advantages[:, None]
    if loss_type == "cispo":
        per_token = -torch.clamp(ratio, max=high).detach() * a * log_prob
        clipped = (ratio > high) & (a > 0)
    elif loss_type == "sapo":
        tau = torch.where(a > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
        per_token = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * a
        clipped = torch.zeros_like(ratio, dtype=torch.bool)
    else:
        per_token = -torch.min(ratio * a, torch.clamp(ratio, 1 - low, 1 + high) * a)
        clipped = ((ratio < 1 - low) & (a < 0)) | ((ratio > 1 + high) & (a > 0))
    per_token = per_token.expand_as(mask)
    clipped = clipped.expand_as(mask)
    if beta != 0.0:
        kl = torch.exp(ref - log_prob) - (ref - log_prob) - 1
        per_token = per_token + beta * kl
    tokens = mask.sum().clamp(min=1.0)
    if loss_type in ("grpo", "sapo"):
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / mask.shape[0]
    elif loss_type == "bnpo":
        loss = (per_token * mask).sum() / tokens
    elif loss_type == "dr_grpo":
        loss = (per_token * mask).sum() / (mask.shape[0] * max_length)
    else:
        loss = (per_token * mask).sum() / tokens
    metrics = ([(kl * mask).sum() / tokens] if beta != 0.0 else []) + [(clipped * mask).sum() / tokens]
    return loss, metrics


def batch(seed=0, rows=4, cols=6, size=8, vocab=23):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, cols, size, generator=g, dtype=torch.float64)
    weight = torch.randn(vocab, size, generator=g, dtype=torch.float64) * 0.5
    ids = torch.randint(0, vocab, (rows, cols), generator=g)
    mask = (torch.rand(rows, cols, generator=g) < 0.8).double()
    mask[:, 0] = 1
    mask[-1] = 0  # a row without tokens
    signs = torch.tensor([1.0, -1.0] * rows, dtype=torch.float64)[:rows]  # both signs: both sides of the clip act
    advantages = torch.rand(rows, generator=g, dtype=torch.float64).add(0.1) * signs
    with torch.no_grad():
        log_prob = torch.log_softmax(hidden @ weight.T, -1).gather(-1, ids[..., None])[..., 0]
    old = log_prob + (torch.rand(rows, cols, generator=g, dtype=torch.float64) - 0.5) * 0.8  # ratios past the clip
    ref = log_prob + (torch.rand(rows, cols, generator=g, dtype=torch.float64) - 0.5) * 0.4
    return hidden, weight, ids, mask, advantages, old, ref


# Sequence-level importance sampling (GSPO) for the clipped losses; cispo and sapo are token-level in TRL.
CASES = [(loss_type, "token") for loss_type in dapo.trl.LOSS_TYPES] + [
    (loss_type, "sequence") for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo")
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("loss_type,level", CASES)
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_equals_plain_pytorch(loss_type, level, beta, device):
    hidden, weight, ids, mask, advantages, old, ref = (t.to(device) for t in batch())
    low, high = (0.003, 0.004) if level == "sequence" else (0.2, 1.2 if loss_type == "cispo" else 0.28)  # GSPO's scale
    settings = {"beta": beta, "epsilon_low": low, "epsilon_high": high,
                "loss_type": loss_type, "max_completion_length": 10, "importance_sampling_level": level,
                "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05, "temperature": 0.9}
    ours = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
    theirs = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
    loss, metrics = dapo.trl.FusedLinearGRPOLoss(chunk_size=5, **settings)(
        ours[0], ours[1], ids, mask, advantages, ref_per_token_logps=ref, old_per_token_logps=old)
    expected, expected_metrics = plain_trl_loss(
        theirs[0], theirs[1], ids, mask, advantages, old, ref, beta=beta, low=low, high=high,
        loss_type=loss_type, max_length=10, level=level, tau_pos=1.0, tau_neg=1.05, temperature=0.9)
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-12)
    assert len(metrics) == len(expected_metrics)
    for ours_metric, expected_metric in zip(metrics, expected_metrics):
        torch.testing.assert_close(ours_metric.double(), expected_metric.double(), rtol=1e-10, atol=1e-12)
    assert expected_metrics[-1] > 0 or loss_type == "sapo", "the batch should reach past the clip"
    loss.backward()
    expected.backward()
    torch.testing.assert_close(ours[0].grad, theirs[0].grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(ours[1].grad, theirs[1].grad, rtol=1e-9, atol=1e-12)


def test_bad_arguments():
    with pytest.raises(ValueError, match="loss_type is 'ppo'"):
        dapo.trl.FusedLinearGRPOLoss(loss_type="ppo")
    with pytest.raises(ValueError, match="max_completion_length"):
        dapo.trl.FusedLinearGRPOLoss(loss_type="dr_grpo")
    with pytest.raises(ValueError, match="epsilon_high"):
        dapo.trl.FusedLinearGRPOLoss(loss_type="cispo", epsilon_high=0.28)
    hidden, weight, ids, mask, advantages, old, ref = batch()
    with pytest.raises(ValueError, match=r"_input has shape \[4, 5, 8\]"):
        dapo.trl.FusedLinearGRPOLoss()(hidden[:, :5], weight, ids, mask, advantages)
    with pytest.raises(ValueError, match="bias"):
        dapo.trl.FusedLinearGRPOLoss()(hidden, weight, ids, mask, advantages, bias=torch.zeros(23))


def test_advantages_by_scale_rewards():
    """dapo.trl.advantages: TRL's GRPOTrainer advantages written from their definition (epsilon 1e-4, stds unbiased)."""
    g = torch.Generator().manual_seed(3)
    rewards = torch.randint(0, 5, (12,), generator=g).double() * 0.5
    grouped = rewards.view(3, 4)
    centred = (grouped - grouped.mean(1, keepdim=True)).reshape(-1)
    group_std = grouped.std(1).repeat_interleave(4)
    expected = {"group": centred / (group_std + 1e-4), "batch": centred / (rewards.std() + 1e-4), "none": centred}
    for scale_rewards, want in expected.items():
        torch.testing.assert_close(dapo.trl.advantages(rewards, 4, scale_rewards), want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="scale_rewards is 'global'"):
        dapo.trl.advantages(rewards, 4, "global")


def test_grpo_loss_equals_the_fused_module_on_the_same_log_probs():
    """dapo.trl.grpo_loss (dapo::trl_loss_type's options) and FusedLinearGRPOLoss (its own mapping) agree for every
    loss_type; steps_per_generation rescales dapo's and cispo's divisor as TRL 1.16 does."""
    hidden, weight, ids, mask, advantages, old, ref = batch()
    log_prob = torch.log_softmax(hidden @ weight.T, dim=-1).gather(-1, ids[..., None])[..., 0]
    for loss_type in dapo.trl.LOSS_TYPES:
        high = 5.0 if loss_type == "cispo" else 0.28
        module = dapo.trl.FusedLinearGRPOLoss(beta=0.04, epsilon_high=high, loss_type=loss_type,
                                              max_completion_length=mask.shape[1])
        want, _ = module(hidden, weight, ids, mask, advantages, ref_per_token_logps=ref, old_per_token_logps=old)
        got, _ = dapo.trl.grpo_loss(log_prob, old, advantages, mask, loss_type=loss_type, epsilon_high=high,
                                    max_completion_length=mask.shape[1], beta=0.04, ref_per_token_logps=ref,
                                    use_bias_correction_kl=False)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        if loss_type in ("dapo", "cispo"):  # divisor tokens * accumulation / steps_per_generation: 2x the loss here
            rescaled, _ = dapo.trl.grpo_loss(log_prob, old, advantages, mask, loss_type=loss_type, epsilon_high=high,
                                             beta=0.04, ref_per_token_logps=ref, gradient_accumulation_steps=2,
                                             steps_per_generation=4, use_bias_correction_kl=False)
            torch.testing.assert_close(rescaled, 2 * want, rtol=1e-10, atol=1e-12)
