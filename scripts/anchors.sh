#!/usr/bin/env bash
# The anchors' virtual environment: pip's torch (with LibTorch and CUDA), transformers, TRL, accelerate, datasets and
# pytest at the versions of scripts/anchors-requirements.txt, made once with the first usable `python3` on the PATH
# (else Debian's /usr/bin/python3 with python3-venv) and cached outside the clone:
# ${DAPO_CACHE_DIR:-/var/cache/dapo}/anchors-<key>, the key a hash of the requirements and the interpreter's version,
# so a changed list makes a new one (old ones can be deleted by hand). First run about 2 minutes and 6 GB (torch's
# CUDA wheels); later runs reuse it. Packages come from pip's configured index (this machine's pip configuration).
#   scripts/anchors.sh [env]            make (or find) it and print its path
#   scripts/anchors.sh python ARGS      run its python3 with ARGS
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
requirements=scripts/anchors-requirements.txt

interpreter() {
  local candidate
  for candidate in "$(command -v python3 || true)" /usr/bin/python3; do
    [[ -n $candidate && -x $candidate ]] || continue
    "$candidate" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2> /dev/null &&
      { echo "$candidate"; return 0; }
  done
  if [[ -x /usr/bin/python3 && $(id -u) -eq 0 ]]; then  # Debian's python3 without its venv module
    flock /run/lock/dapo-apt apt-get update -q > /dev/null
    DEBIAN_FRONTEND=noninteractive flock /run/lock/dapo-apt apt-get install -y -q python3-venv > /dev/null
    echo /usr/bin/python3
    return 0
  fi
  echo "anchors: no python3 >= 3.10 with the venv module (Debian: apt-get install python3-venv)" >&2
  return 1
}

python=$(interpreter)
version=$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
key=$( (grep -v '^#' "$requirements"; echo "python=$version recipe=1") | sha256sum | cut -c1-12)
cache=${DAPO_CACHE_DIR:-/var/cache/dapo}
venv=$cache/anchors-$key
if [[ ! -f $venv/.dapo-anchors-complete ]]; then
  echo "anchors: making $venv with $python ($version): $(grep -v '^#' "$requirements" | tr '\n' ' ')" >&2
  mkdir -p "$cache"
  # A venv names its own path inside, so it is made in place; the marker says it is complete (an interrupted one is
  # made again).
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements" >&2
  touch "$venv/.dapo-anchors-complete"
fi
case ${1:-env} in
  env) echo "$venv" ;;
  python) shift; exec "$venv/bin/python" "$@" ;;
  *) echo "anchors: unknown mode '$1' (env or python)" >&2; exit 2 ;;
esac
