"""ctest's `python` test: pytest over tests/python with the built package (${build}/python) first on the path.
Usage: run_tests.py LIBTORCH_VERSION PACKAGE_DIR [pytest args]. Skips (exit 77) with the reason when python3 lacks
torch or pytest, or its torch is not the LibTorch the ops were built against (they would not load); under CI=true
that fails instead."""

import os
import sys


def unavailable(reason):
    if os.environ.get("CI") == "true":
        print(f"python tests: {reason}; CI=true, so this fails instead of skipping")
        sys.exit(1)
    print(f"python tests: skipped: {reason}")
    sys.exit(77)


libtorch_version, package_dir = sys.argv[1], sys.argv[2]
try:
    import torch
except ImportError:
    unavailable("python3 has no torch (Debian: python3-torch, in scripts/test-packages.txt)")
try:
    import pytest
except ImportError:
    unavailable("python3 has no pytest (Debian: python3-pytest, in scripts/test-packages.txt)")
# major.minor: Debian's python3-torch 1.13 calls itself 1.13.0a0, its libtorch-dev 1.13.1 (the same libraries).
if torch.__version__.split(".")[:2] != libtorch_version.split(".")[:2]:
    unavailable(f"python3's torch is {torch.__version__} but the ops were built against LibTorch {libtorch_version}")
sys.path.insert(0, package_dir)
sys.exit(pytest.main(["-q", "-s", "-p", "no:cacheprovider", os.path.dirname(os.path.abspath(__file__))] + sys.argv[3:]))
