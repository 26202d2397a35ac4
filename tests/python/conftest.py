"""Shared set-up of the Python tests (run by ctest's `python` test, or `python3 -m pytest tests/python` with the
built package on PYTHONPATH): the reference data ../shared (or $DAPO_SHARED_DIR), skipped with a message when absent,
except under CI=true, where a missing file fails."""

import json
import os

import pytest
import torch

# Every test that takes a `device` runs on the CPU and, where PyTorch sees a GPU, on CUDA (the GPU device check).
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shared_dir():
    return os.environ.get("DAPO_SHARED_DIR") or os.path.join(os.path.dirname(ROOT), "shared")


def algo_fixture(name):
    """../shared/fixtures/algo/<name> parsed, or a skip (a failure under CI=true) when it is missing."""
    path = os.path.join(shared_dir(), "fixtures", "algo", name)
    if not os.path.exists(path):
        message = f"{path} not found (the reference data: place shared/ beside the checkout or set DAPO_SHARED_DIR)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    with open(path) as f:
        return json.load(f)
