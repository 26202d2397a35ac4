"""dapo.policy_loss and the verl adapter (dapo.verl) against every policy_loss case of ../shared's golden.json and
verl_zoo.json (read by their fields: whatever cases the files hold), in float64 (1e-10 relative) and float32 (1e-5),
loss, verl's metrics and d loss / d log_prob; gradcheck in float64; the adapter against verl's vanilla loss written
here in plain PyTorch from its definition; and the errors a bad argument gives."""

import collections
import math

import pytest
import torch

import dapo
import dapo.verl
from conftest import DEVICES, algo_fixture

METRIC_OF_GOLDEN = {"clipfrac": "actor/pg_clipfrac", "clipfrac_lower": "actor/pg_clipfrac_lower", "ppo_kl": "actor/ppo_kl"}


def tensor(values, dtype, device="cpu"):
    return torch.tensor(values, dtype=torch.float64).to(device=device, dtype=dtype)


def close(actual, expected, relative, absolute):
    return abs(actual - expected) <= absolute + relative * abs(expected)


def check_case(name, loss, metrics, grad, expected_loss, expected_metrics, expected_grad, dtype):
    relative, absolute = (1e-10, 1e-12) if dtype == torch.float64 else (1e-5, 1e-5)
    loss = float(loss.detach())
    assert close(loss, expected_loss, relative, absolute), f"{name}: loss {loss} != {expected_loss}"
    for metric, value in expected_metrics.items():
        assert metric in metrics, f"{name}: metric {metric} missing (got {sorted(metrics)})"
        assert close(float(metrics[metric]), value, relative, absolute), f"{name}: {metric} {float(metrics[metric])} != {value}"
    grad = grad.cpu()
    expected = torch.tensor(expected_grad, dtype=torch.float64).reshape(grad.shape)
    bad = (grad.double() - expected).abs() > absolute + relative * expected.abs()
    assert not bad.any(), f"{name}: d loss / d log_prob differs at {bad.nonzero()[0].tolist()}: {grad[bad][0]} vs {expected[bad][0]}"


def zoo_cases():
    return algo_fixture("verl_zoo.json")["policy_loss"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_every_verl_zoo_case_through_the_verl_adapter(dtype, device):
    per_mode = collections.Counter()
    for index, case in enumerate(zoo_cases()):
        mode = case["loss_mode"]
        name = f"verl_zoo policy_loss #{index} ({mode}, {case['loss_agg_mode']})"
        log_prob = tensor(case["log_prob"], dtype, device).requires_grad_()
        weights = case["rollout_is_weights"]
        loss, metrics = dapo.verl.policy_loss_fn(mode)(
            tensor(case["old_log_prob"], dtype, device),
            log_prob,
            tensor(case["advantages"], dtype, device),
            tensor(case["response_mask"], dtype, device),
            case["loss_agg_mode"],
            case["config"],
            None if weights is None else tensor(weights, dtype, device),
        )
        assert all(isinstance(value, float) for value in metrics.values()), f"{name}: verl's metrics are floats"
        assert set(metrics) == set(case["metrics"]), f"{name}: metrics {sorted(metrics)}, verl's {sorted(case['metrics'])}"
        loss.backward()
        check_case(name, loss, metrics, log_prob.grad, case["loss"], case["metrics"], case["grad_log_prob"], dtype)
        per_mode[mode + ("+is" if weights is not None else "")] += 1
    print(f"verl_zoo.json policy_loss ({dtype}, {device}): {sum(per_mode.values())} cases ({dict(sorted(per_mode.items()))})")
    for mode in ("vanilla", "gspo", "sapo", "cispo", "geo_mean", "dppo_tv", "dppo_kl", "dro", "kl_cov", "gpg"):
        assert per_mode[mode] + per_mode[mode + "+is"] > 0, f"verl_zoo.json holds no {mode} case"


def test_every_golden_case_through_policy_loss():
    cases = algo_fixture("golden.json")["policy_loss"]
    per_mode = collections.Counter()
    for index, case in enumerate(cases):
        name = f"golden policy_loss #{index} ({case['aggregation']})"
        for dtype in (torch.float64, torch.float32):
            log_prob = tensor(case["logp"], dtype).requires_grad_()
            mask = tensor(case["mask"], dtype)
            loss, metrics = dapo.policy_loss(
                tensor(case["old_logp"], dtype),
                log_prob,
                tensor(case["advantages"], dtype),
                mask,
                case["aggregation"],
                clip_ratio_low=case["clip_low"],
                clip_ratio_high=case["clip_high"],
                clip_ratio_c=case["dual_clip"],  # 0: no dual clip
                group_size=case["group_size"],
                loss_scale_factor=case["norm_length"],
                # the golden's seq-mean-token-sum-norm divides by every row, verl's by the rows with a token
                global_batch_size=mask.shape[0] if case["aggregation"] == "seq-mean-token-sum-norm" else None,
                count_epsilon=0.0,  # the golden's means divide by the counts themselves
            )
            loss.backward()
            expected = case["expected"]
            check_case(
                f"{name} {dtype}",
                loss,
                metrics,
                log_prob.grad,
                expected["loss"],
                {METRIC_OF_GOLDEN[key]: expected[key] for key in METRIC_OF_GOLDEN},
                expected["grad_logp"],
                dtype,
            )
        per_mode[case["aggregation"]] += 1
    print(f"golden.json policy_loss: {len(cases)} cases ({dict(sorted(per_mode.items()))})")
    assert cases, "golden.json holds no policy_loss case"


def random_batch(rows=4, cols=6, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, cols, generator=generator, dtype=dtype) * 3
    new = old + (torch.rand(rows, cols, generator=generator, dtype=dtype) - 0.5)  # ratios past the clip range
    advantages = torch.randn(rows, cols, generator=generator, dtype=dtype)
    mask = (torch.rand(rows, cols, generator=generator) < 0.8).to(dtype)
    mask[:, 0] = 1
    return old, new, advantages, mask


# The losses whose value is a smooth function of log_prob. gspo, cispo, dppo_tv and dppo_kl differentiate a surrogate
# with stop-gradients (gspo's sg[s_i], cispo's detached clipped weight, dppo's detached ratio): their gradient is by
# definition not the derivative of their value, and is checked against verl's in the zoo cases above.
@pytest.mark.parametrize("mode", ["vanilla", "sapo", "geo_mean", "dro", "gpg"])
def test_gradcheck_float64(mode):
    old, new, advantages, mask = random_batch()
    extra = {"dro_beta": 0.1} if mode == "dro" else {}

    def loss_of(log_prob):
        return dapo.policy_loss(old, log_prob, advantages, mask, "token-mean", loss_mode=mode, **extra)[0]

    assert torch.autograd.gradcheck(loss_of, (new.clone().requires_grad_(),), eps=1e-6, atol=1e-7)


def plain_verl_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, weights):
    """verl's vanilla policy loss with its agg_loss, written from their definition (shared/README.md, verl's
    core_algos docstrings) in plain PyTorch: the reference the adapter is held to."""
    low = config.get("clip_ratio_low") or config["clip_ratio"]
    high = config.get("clip_ratio_high") or config["clip_ratio"]
    c = config.get("clip_ratio_c", 3.0)
    eps = 1e-8

    def masked_mean(x, m):
        return (x * m).sum() / (m.sum() + eps)

    log_ratio = torch.clamp(log_prob - old_log_prob, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    pg = torch.maximum(unclipped, clipped)
    bounded = torch.minimum(-advantages * c, pg)
    metrics = {
        "actor/pg_clipfrac": masked_mean((clipped > unclipped).double(), response_mask).item(),
        "actor/ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        "actor/pg_clipfrac_lower": masked_mean(((pg > -advantages * c) & (advantages < 0)).double(), response_mask).item(),
    }
    pg = torch.where(advantages < 0, bounded, pg)
    if weights is not None:
        pg = pg * weights
    info = config.get("global_batch_info", {})
    dp = info.get("dp_size", 1)
    rows_with_tokens = (response_mask.sum(-1) > 0).double()
    if loss_agg_mode == "token-mean":
        loss = (pg * response_mask).sum() / info.get("batch_num_tokens", response_mask.sum()) * dp
    elif loss_agg_mode == "token-sum":
        loss = (pg * response_mask).sum() * dp
    elif loss_agg_mode == "seq-mean-token-mean":
        row = (pg * response_mask).sum(-1) / (response_mask.sum(-1) + eps)
        loss = (row * rows_with_tokens).sum() / info.get("global_batch_size", rows_with_tokens.sum()) * dp
    else:
        row = (pg * response_mask).sum(-1)
        loss = (row * rows_with_tokens).sum() / info.get("global_batch_size", rows_with_tokens.sum()) * dp
        if loss_agg_mode == "seq-mean-token-sum-norm":
            loss = loss / info.get("loss_scale_factor", response_mask.shape[-1])
    return loss, metrics


@pytest.mark.parametrize(
    "loss_agg_mode", ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
@pytest.mark.parametrize("batch_info", [{}, {"dp_size": 2, "batch_num_tokens": 40.0, "global_batch_size": 9}])
def test_verl_adapter_equals_plain_pytorch_vanilla(loss_agg_mode, batch_info):
    old, new, advantages, mask = random_batch(rows=5, cols=7, seed=3)
    mask[2] = 0  # a row without tokens
    weights = torch.rand(5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) + 0.5
    config = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
              "global_batch_info": batch_info}
    ours = new.clone().requires_grad_()
    reference = new.clone().requires_grad_()
    loss, metrics = dapo.verl.policy_loss_fn("vanilla")(old, ours, advantages, mask, loss_agg_mode, config, weights)
    expected_loss, expected_metrics = plain_verl_vanilla(old, reference, advantages, mask, loss_agg_mode, config, weights)
    loss.backward()
    expected_loss.backward()
    assert math.isclose(loss.item(), expected_loss.item(), rel_tol=1e-12, abs_tol=1e-14)
    for name, value in expected_metrics.items():
        assert math.isclose(metrics[name], value, rel_tol=1e-12, abs_tol=1e-14), name
    assert torch.allclose(ours.grad, reference.grad, rtol=1e-12, atol=1e-14)


def test_bad_arguments_name_the_argument_and_its_shape():
    old, new, advantages, mask = random_batch()
    with pytest.raises(ValueError, match=r"mask has shape \[4, 5\]"):
        dapo.policy_loss(old, new, advantages, mask[:, :5])
    with pytest.raises(ValueError, match="loss_mode is 'ppo'"):
        dapo.policy_loss(old, new, advantages, mask, loss_mode="ppo")
    with pytest.raises(ValueError, match="loss_agg_mode is 'mean'"):
        dapo.policy_loss(old, new, advantages, mask, "mean")
    with pytest.raises(ValueError, match="dro_beta"):
        dapo.policy_loss(old, new, advantages, mask, loss_mode="dro")
    with pytest.raises(ValueError, match="batch_num_tokens"):
        dapo.policy_loss(old, new, advantages, mask, dp_size=2)
    with pytest.raises(ValueError, match="loss_mode is 'bogus'"):
        dapo.verl.policy_loss_fn("bogus")
    # The op itself, called directly, raises the library's message too.
    with pytest.raises(ValueError, match="advantages has shape"):
        dapo.policy_loss(old, new, advantages[:3], mask)
