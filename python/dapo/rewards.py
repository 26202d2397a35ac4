"""Rewards: DAPO's soft overlong punishment (Eq. 13) and the GSM8K rule rewards of the project dapo reproduces
(correctness 2.0, digit 0.5, strict <think>/<answer> format 0.5, tag marks 0.125 each)."""

import torch

__all__ = ["overlong_penalty", "gsm8k_rewards", "gsm8k_reference_answer"]


def overlong_penalty(lengths, max_length, cache_length, factor=1.0):
    """lengths [N] (integer response lengths in tokens) -> penalties [N] in the default dtype: 0 up to
    max_length - cache_length, then a ramp down to -factor at max_length, -factor beyond (verl's overlong_buffer:
    len = cache_length, penalty_factor = factor)."""
    if not isinstance(lengths, torch.Tensor):
        lengths = torch.as_tensor(lengths, dtype=torch.int64)
    return torch.ops.dapo.overlong_penalty(lengths, int(max_length), int(cache_length), float(factor))


def gsm8k_rewards(response, reference, *, mode="seed"):
    """The rule rewards of one response against the reference answer (e.g. "72", see gsm8k_reference_answer):
    a dict of extracted (the answer read from <answer>...</answer>, "" when none), correctness, digit, hard_format,
    mark and total. mode "seed" reads answers as the reproduced project does; "lenient" reads "1,080" and "-7"."""
    if mode not in ("seed", "lenient"):
        raise ValueError(f"dapo.gsm8k_rewards: mode is '{mode}', expected seed or lenient")
    if not isinstance(response, str) or not isinstance(reference, str):
        raise ValueError(
            f"dapo.gsm8k_rewards: response and reference are {type(response).__name__} and "
            f"{type(reference).__name__}, expected str"
        )
    extracted, correctness, digit, hard_format, mark = torch.ops.dapo.gsm8k_rewards(
        response, reference, mode == "lenient"
    )
    return {
        "extracted": extracted,
        "correctness": correctness,
        "digit": digit,
        "hard_format": hard_format,
        "mark": mark,
        "total": correctness + digit + hard_format + mark,
    }


def gsm8k_reference_answer(answer_field):
    """The reference answer of a GSM8K ``answer`` field: the text after "####", trimmed, commas removed."""
    return torch.ops.dapo.gsm8k_reference_answer(str(answer_field))
