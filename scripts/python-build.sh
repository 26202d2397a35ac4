#!/usr/bin/env bash
# torch.ops.dapo and the dapo Python package (python/), built for the `python3` a user has:
# - the first python3 on the PATH when it imports torch (pip's wheel: its LibTorch, with CUDA where the wheel has it
#   and nvcc is on the PATH, via torch.utils.cmake_prefix_path), into ${DAPO_BUILD_DIR:-build-pip-torch}/python/dapo;
# - else Debian's /usr/bin/python3 with python3-torch (installed if missing, with libtorch-dev, whose LibTorch it
#   loads), into ${DAPO_BUILD_DIR:-build}/python/dapo.
# DAPO_PYTHON=/path/to/python3 picks the interpreter. A dapo.pth file naming the build folder goes into that
# interpreter's site-packages (a virtual environment's, or a writable one's), else its user site-packages, as
# `pip install -e` would (--no-pth leaves it out: then PYTHONPATH=<build>/python). Then `python3 -c "import dapo"`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pth=1
for arg in "$@"; do
  case $arg in
    --no-pth) pth=0 ;;
    *) echo "python-build: unknown argument '$arg' (known: --no-pth)" >&2; exit 2 ;;
  esac
done
python=${DAPO_PYTHON:-$(command -v python3 || true)}
if [[ -n $python ]] && prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2> /dev/null) &&
   [[ $python != /usr/bin/python3 ]]; then
  build=${DAPO_BUILD_DIR:-build-pip-torch}
  cuda_args=""
  command -v nvcc > /dev/null && cuda_args="-DCMAKE_CUDA_COMPILER=$(command -v nvcc)"
  echo "python-build: $python has torch $("$python" -c 'import torch; print(torch.__version__)'): building against its LibTorch"
  DAPO_BUILD_DIR=$build DAPO_EXTRA_CMAKE_ARGS="-DCMAKE_PREFIX_PATH=$prefix -DDAPO_PYTHON=$python $cuda_args" \
    scripts/setup.sh dapo_torch_ops
else
  [[ -z ${DAPO_PYTHON:-} || $DAPO_PYTHON == /usr/bin/python3 ]] || {
    echo "python-build: DAPO_PYTHON=$DAPO_PYTHON cannot import torch" >&2
    exit 1
  }
  [[ -z $python || $python == /usr/bin/python3 ]] ||
    echo "python-build: $python has no torch; using Debian's /usr/bin/python3 with python3-torch"
  python=/usr/bin/python3  # Debian's, whose torch is python3-torch
  build=${DAPO_BUILD_DIR:-build}
  DAPO_BUILD_DIR=$build DAPO_PACKAGE_LISTS="scripts/packages.txt scripts/python-packages.txt" scripts/setup.sh \
    dapo_torch_ops
fi
package=$(realpath "$build/python")
"$python" -c "import sys; sys.path.insert(0, sys.argv[1]); import dapo" "$package"
if ((pth)); then
  # A virtual environment's or a writable interpreter's own site-packages; else the user's (Debian's python3).
  site=$("$python" -c 'import os, sys, sysconfig
purelib = sysconfig.get_paths()["purelib"]
own = sys.prefix != sys.base_prefix or (os.access(purelib, os.W_OK) and not purelib.startswith("/usr/"))
print(purelib if own else __import__("site").getusersitepackages())')
  mkdir -p "$site"
  echo "$package" > "$site/dapo.pth"
  echo "python-build: $package/dapo built; $site/dapo.pth puts it on $python's path: $python -c 'import dapo'"
else
  echo "python-build: $package/dapo built; import it with PYTHONPATH=$package $python -c 'import dapo'"
fi
