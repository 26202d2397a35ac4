"""dapo.linear_logprobs against log_softmax(hidden @ weight.T / temperature).gather(...) and its autograd (values,
entropy, d/d hidden, d/d weight, in float64 and float32), gradcheck in float64, and its argument errors."""

import pytest
import torch

import dapo
from conftest import DEVICES


def reference(hidden, weight, targets, temperature):
    logits = (hidden @ weight.T) / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return log_probs.gather(1, targets[:, None])[:, 0], entropy


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("chunk_size", [1, 5, 1024])
def test_equals_the_full_logits(dtype, chunk_size, device):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(13, 8, generator=generator, dtype=dtype).to(device)
    weight = torch.randn(37, 8, generator=generator, dtype=dtype).to(device)
    targets = torch.randint(0, 37, (13,), generator=generator).to(device)
    tolerance = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    ours = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
    theirs = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
    log_prob, entropy = dapo.linear_logprobs(*ours, targets, chunk_size=chunk_size, temperature=0.7, with_entropy=True)
    expected_log_prob, expected_entropy = reference(*theirs, targets, 0.7)
    torch.testing.assert_close(log_prob, expected_log_prob, **tolerance)
    torch.testing.assert_close(entropy, expected_entropy, **tolerance)
    upstream = torch.randn(13, generator=generator, dtype=dtype).to(device)
    ((log_prob * upstream).sum() + entropy.sum()).backward()
    ((expected_log_prob * upstream).sum() + expected_entropy.sum()).backward()
    torch.testing.assert_close(ours[0].grad, theirs[0].grad, **tolerance)
    torch.testing.assert_close(ours[1].grad, theirs[1].grad, **tolerance)
    assert isinstance(dapo.linear_logprobs(hidden, weight, targets, chunk_size=chunk_size), torch.Tensor)


def test_gradcheck_float64():
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(5, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(9, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 9, (5,), generator=generator)
    assert torch.autograd.gradcheck(
        lambda h, w: dapo.linear_logprobs(h, w, targets, chunk_size=2, with_entropy=True), (hidden, weight)
    )


def test_bad_arguments_name_the_argument_and_its_shape():
    hidden = torch.randn(3, 4)
    weight = torch.randn(7, 4)
    with pytest.raises(ValueError, match=r"weight has shape \[7, 5\]"):
        dapo.linear_logprobs(hidden, torch.randn(7, 5), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="targets has dtype"):
        dapo.linear_logprobs(hidden, weight, torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match=r"targets\[1\] is 9"):
        dapo.linear_logprobs(hidden, weight, torch.tensor([0, 9, 2]))
    with pytest.raises(ValueError, match="chunk_size is 0"):
        dapo.linear_logprobs(hidden, weight, torch.tensor([0, 1, 2]), chunk_size=0)
