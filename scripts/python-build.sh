#!/usr/bin/env bash
# torch.ops.dapo and the dapo Python package (python/): installs what is missing (python3-torch), builds the ops
# against libtorch-dev's LibTorch, which is python3-torch's, into ${DAPO_BUILD_DIR:-build}/python/dapo, and puts that
# folder on /usr/bin/python3's path with a dapo.pth file in the user's site-packages (as `pip install --user -e`
# would; --no-pth leaves it out: then PYTHONPATH=build/python). Then `python3 -c "import dapo"` works.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pth=1
for arg in "$@"; do
  case $arg in
    --no-pth) pth=0 ;;
    *) echo "python-build: unknown argument '$arg' (known: --no-pth)" >&2; exit 2 ;;
  esac
done
DAPO_PACKAGE_LISTS="scripts/packages.txt scripts/python-packages.txt" scripts/setup.sh dapo_torch_ops
package=$(realpath "${DAPO_BUILD_DIR:-build}/python")
python=/usr/bin/python3  # Debian's, whose torch is python3-torch (not a pyenv or virtualenv python3 on the PATH)
"$python" -c "import sys; sys.path.insert(0, sys.argv[1]); import dapo" "$package"
if ((pth)); then
  site=$("$python" -m site --user-site)
  mkdir -p "$site"
  echo "$package" > "$site/dapo.pth"
  echo "python-build: $package/dapo built; $site/dapo.pth puts it on $python's path: $python -c 'import dapo'"
else
  echo "python-build: $package/dapo built; import it with PYTHONPATH=$package $python -c 'import dapo'"
fi
