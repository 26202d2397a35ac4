"""The algorithm's pieces beside the policy loss through the Python API, against every case of ../shared's golden.json
(advantages, informative_groups, overlong, gsm8k_rewards) and verl_zoo.json (advantage, kl_penalty, agg_loss,
rollout_is, rollout_rs), read by their fields (whatever cases the files hold): float64 within 1e-10 relative,
float32 within 1e-5, 0/1 decisions and rewards exact; gradients of agg_loss and kl_penalty (against the file's and by
gradcheck); aggregation_weights against policy_loss's own aggregation; the errors a bad argument gives."""

import collections

import pytest
import torch

import dapo
from conftest import DEVICES, algo_fixture

DTYPES = [torch.float64, torch.float32]


def tensor(values, dtype=torch.float64, device="cpu"):
    return torch.tensor(values, dtype=torch.float64).to(device=device, dtype=dtype)


def tolerance(dtype):
    return (1e-10, 1e-12) if dtype == torch.float64 else (1e-5, 1e-5)


def assert_close(name, actual, expected, dtype):
    """Every element of actual within the dtype's bound of expected (a nested list or a tensor)."""
    relative, absolute = tolerance(dtype)
    actual = actual.detach().cpu().double()
    expected = torch.as_tensor(expected, dtype=torch.float64).reshape(actual.shape)
    bad = (actual - expected).abs() > absolute + relative * expected.abs()
    assert not bad.any(), f"{name}: differs at {bad.nonzero()[0].tolist()}: {actual[bad][0]} vs {expected[bad][0]}"


def golden(section):
    cases = algo_fixture("golden.json")[section]
    assert cases, f"golden.json has no {section} case"
    return cases


def zoo(section):
    cases = algo_fixture("verl_zoo.json")[section]
    assert cases, f"verl_zoo.json has no {section} case"
    return cases


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_group_advantages_every_golden_case(dtype, device):
    for index, case in enumerate(golden("advantages")):
        advantages = dapo.group_advantages(
            tensor(case["rewards"], dtype, device),
            case["group_size"],
            scale_by_std=case["scale_by_std"],
            epsilon=case["epsilon"],
        )
        assert advantages.dtype == dtype and advantages.device.type == device
        assert_close(f"golden advantages #{index}", advantages, case["expected"], dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_informative_groups_every_golden_case(device):
    for index, case in enumerate(golden("informative_groups")):
        kept = dapo.informative_groups(tensor(case["scores"], torch.float64, device), case["group_size"])
        assert kept.tolist() == case["expected"], f"golden informative_groups #{index}"


def test_overlong_penalty_every_golden_case():
    for index, case in enumerate(golden("overlong")):
        lengths = torch.tensor([case["length"]], dtype=torch.int64)
        penalty = dapo.overlong_penalty(lengths, case["max_length"], case["cache_length"], case["factor"])
        assert penalty.dtype == torch.get_default_dtype()
        assert_close(f"golden overlong #{index}", penalty, [case["expected"]], penalty.dtype)
        # a plain list of lengths is taken as well
        again = dapo.overlong_penalty([case["length"]], case["max_length"], case["cache_length"], case["factor"])
        assert torch.equal(again, penalty)


def test_gsm8k_rewards_every_golden_case():
    for index, case in enumerate(golden("gsm8k_rewards")):
        rewards = dapo.gsm8k_rewards(case["response"], case["answer"])
        name = f"golden gsm8k_rewards #{index}"
        assert rewards["extracted"] == case["extracted"], name
        for field in ("correctness", "digit", "hard_format", "mark"):
            assert rewards[field] == case[field], f"{name}: {field} {rewards[field]} != {case[field]}"
        total = case["correctness"] + case["digit"] + case["hard_format"] + case["mark"]
        assert rewards["total"] == pytest.approx(total, abs=1e-12), name


def test_gsm8k_lenient_mode_and_reference_answer():
    response = "<think>\nsum\n</think>\n<answer>\n1,080\n</answer>\n"
    assert dapo.gsm8k_reference_answer("3 * 360 = 1080\n#### 1,080") == "1080"
    seed, lenient = dapo.gsm8k_rewards(response, "1080"), dapo.gsm8k_rewards(response, "1080", mode="lenient")
    assert lenient["extracted"] == "1080" and lenient["correctness"] == 2.0
    assert seed["correctness"] == 0.0  # the seed's parser keeps only the digits after the comma
    with pytest.raises(ValueError, match="####"):
        dapo.gsm8k_reference_answer("no marker here")
    with pytest.raises(ValueError, match="mode"):
        dapo.gsm8k_rewards(response, "1080", mode="strict")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_compute_advantage_every_verl_zoo_case(dtype, device):
    per_estimator = collections.Counter()
    for index, case in enumerate(zoo("advantage")):
        estimator = case["estimator"]
        config, kwargs = case["config"], case["kwargs"]
        advantages, returns = dapo.compute_advantage(
            tensor(case["token_level_rewards"], dtype, device),
            tensor(case["response_mask"], dtype, device),
            case["index"],  # verl's uids as the file has them
            "grpo" if estimator == "grpo_no_std" else estimator,
            norm_adv_by_std_in_grpo=kwargs.get("norm_adv_by_std_in_grpo", config.get("norm_adv_by_std_in_grpo", True)),
            epsilon=case.get("epsilon", 1e-6),
            gamma=config.get("gamma", 1.0),
            f_norm=kwargs.get("f_norm", 1.0),
        )
        name = f"verl_zoo advantage #{index} ({estimator})"
        assert advantages.dtype == dtype and advantages.device.type == device, name
        assert_close(f"{name} advantages", advantages, case["advantages"], dtype)
        assert_close(f"{name} returns", returns, case["returns"], dtype)
        per_estimator[estimator] += 1
    print(f"verl_zoo.json advantage: {sum(per_estimator.values())} cases {dict(per_estimator)}")


def test_compute_advantage_index_forms_agree():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0], [3.0, 0.0]], dtype=torch.float64)
    mask = torch.ones_like(rewards)
    by_tensor = dapo.compute_advantage(rewards, mask, torch.tensor([7, 9, 7, 9]))[0]
    by_uid = dapo.compute_advantage(rewards, mask, ["a", "b", "a", "b"])[0]
    assert torch.equal(by_tensor, by_uid)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kl_penalty_every_verl_zoo_case_with_its_gradient(dtype, device):
    for index, case in enumerate(zoo("kl_penalty")):
        logprob = tensor(case["logprob"], dtype, device).requires_grad_()
        value = dapo.kl_penalty(logprob, tensor(case["ref_logprob"], dtype, device), case["kl_penalty"])
        name = f"verl_zoo kl_penalty #{index} ({case['kl_penalty']})"
        assert_close(f"{name} value", value, case["value"], dtype)
        value.sum().backward()
        assert_close(f"{name} d sum / d logprob", logprob.grad, case["grad_logprob"], dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_agg_loss_every_verl_zoo_case_with_its_gradient(dtype, device):
    for index, case in enumerate(zoo("agg_loss")):
        loss_mat = tensor(case["loss_mat"], dtype, device).requires_grad_()
        mask = tensor(case["loss_mask"], dtype, device)
        name = f"verl_zoo agg_loss #{index} ({case['loss_agg_mode']}, {case['kwargs']})"
        loss = dapo.agg_loss(loss_mat, mask, case["loss_agg_mode"], **case["kwargs"])
        assert_close(name, loss.reshape(1), [case["loss"]], dtype)
        loss.backward()
        # linear in loss_mat: the gradient reproduces the loss, and is 0 off the mask
        assert_close(f"{name} sum(grad * loss_mat)", (loss_mat.grad * loss_mat).sum().reshape(1), [case["loss"]], dtype)
        assert not loss_mat.grad[mask == 0].any(), f"{name}: a gradient off the mask"


def test_agg_loss_never_reads_masked_entries():
    loss_mat = torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    assert dapo.agg_loss(loss_mat, mask, "token-mean").item() == pytest.approx(1.5)


@pytest.mark.parametrize("loss_agg_mode", dapo.LOSS_AGG_MODES)
def test_aggregation_weights_are_policy_loss_aggregation(loss_agg_mode):
    """For vanilla without clipping (ratio 1, advantage -x), each token's loss is x: sum(w * x) is the policy loss."""
    generator = torch.Generator().manual_seed(5)
    rows, cols = 4, 6
    mask = (torch.rand(rows, cols, generator=generator) > 0.3).double()
    mask[1] = 0.0  # an empty row
    x = torch.randn(rows, cols, generator=generator, dtype=torch.float64)
    log_prob = torch.zeros(rows, cols, dtype=torch.float64)
    keywords = {"group_size": 2, "dp_size": 2, "batch_num_tokens": 30, "global_batch_size": 9}
    loss, _ = dapo.policy_loss(log_prob, log_prob, -x, mask, loss_agg_mode, **keywords)
    weights = dapo.aggregation_weights(mask, loss_agg_mode, dtype=torch.float64, **keywords)
    assert weights.dtype == torch.float64 and not weights[mask == 0].any()
    assert (weights * x).sum().item() == pytest.approx(loss.item(), rel=1e-12, abs=1e-15)


def test_gradcheck_float64():
    generator = torch.Generator().manual_seed(3)
    logprob = (-torch.rand(3, 4, generator=generator, dtype=torch.float64) * 3).requires_grad_()
    ref = -torch.rand(3, 4, generator=generator, dtype=torch.float64) * 3
    for name in ("k1", "abs", "k2", "low_var_kl"):
        assert torch.autograd.gradcheck(lambda lp: dapo.kl_penalty(lp, ref, name), (logprob,)), name
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    loss_mat = torch.randn(3, 4, generator=generator, dtype=torch.float64).requires_grad_()
    for mode in ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        assert torch.autograd.gradcheck(lambda m: dapo.agg_loss(m, mask, mode), (loss_mat,)), mode


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rollout_is_weights_every_verl_zoo_case(dtype, device):
    for index, case in enumerate(zoo("rollout_is")):
        weights, metrics = dapo.rollout_is_weights(
            tensor(case["log_ratio"], dtype, device),
            tensor(case["response_mask"], dtype, device),
            case["rollout_is"],
            case["rollout_is_threshold"],
        )
        name = f"verl_zoo rollout_is #{index} ({case['rollout_is']}, {case['rollout_is_threshold']})"
        assert weights.dtype == dtype and weights.device.type == device, name
        assert_close(name, weights, case["weights"], dtype)
        assert all(isinstance(value, float) for value in metrics.values()), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rollout_rejection_mask_every_verl_zoo_case(dtype, device):
    for index, case in enumerate(zoo("rollout_rs")):
        kept, metrics = dapo.rollout_rejection_mask(
            tensor(case["log_ratio"], dtype, device),
            tensor(case["response_mask"], dtype, device),
            case["rollout_rs"],
            case["rollout_rs_threshold"],
        )
        name = f"verl_zoo rollout_rs #{index} ({case['rollout_rs']}, {case['rollout_rs_threshold']})"
        assert kept.cpu().double().tolist() == case["mask"], name  # 0/1 decisions: exact
        assert "rollout_rs_masked_fraction" in metrics, name


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match=r"rewards has 5 elements.*group_size = 2"):
        dapo.group_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError, match=r"response_mask has shape \[3, 2\] but token_level_rewards has \[2, 2\]"):
        dapo.compute_advantage(torch.zeros(2, 2), torch.ones(3, 2), [0, 0])
    with pytest.raises(ValueError, match=r"index has 3 ids, expected one per row \(2\)"):
        dapo.compute_advantage(torch.zeros(2, 2), torch.ones(2, 2), [0, 0, 1])
    with pytest.raises(ValueError, match="adv_estimator is 'gae'"):
        dapo.compute_advantage(torch.zeros(2, 2), torch.ones(2, 2), [0, 0], "gae")
    with pytest.raises(ValueError, match=r"ref_logprob has shape \[3\] but logprob has \[2\]"):
        dapo.kl_penalty(torch.zeros(2), torch.zeros(3), "k1")
    with pytest.raises(ValueError, match="kl_penalty is 'k4'"):
        dapo.kl_penalty(torch.zeros(2), torch.zeros(2), "k4")
    with pytest.raises(ValueError, match=r"loss_mask has shape \[2, 3\] but loss_mat has \[2, 2\]"):
        dapo.agg_loss(torch.zeros(2, 2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="batch_num_tokens .* is required when dp_size > 1"):
        dapo.agg_loss(torch.zeros(2, 2), torch.ones(2, 2), "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="group-token-mean is not one of verl's agg_loss modes"):
        dapo.agg_loss(torch.zeros(2, 2), torch.ones(2, 2), "group-token-mean")
    with pytest.raises(ValueError, match="rollout_is_threshold is '0.5_x'"):
        dapo.rollout_is_weights(torch.zeros(2, 2), torch.ones(2, 2), "token", "0.5_x")
    with pytest.raises(ValueError, match="rollout_rs option 'token_k9'"):
        dapo.rollout_rejection_mask(torch.zeros(2, 2), torch.ones(2, 2), "token_k9", 0.1)
    with pytest.raises(ValueError, match=r"lengths.*is negative"):
        dapo.overlong_penalty(torch.tensor([3, -1]), 10, 4)
    with pytest.raises(ValueError, match=r"scores has 3 elements.*group_size = 2"):
        dapo.informative_groups(torch.zeros(3), 2)
