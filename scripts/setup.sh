#!/usr/bin/env bash
# Installs the Debian packages dapo needs (only the missing ones), then configures and builds the given targets
# (all when none) in ${DAPO_BUILD_DIR:-build}. Sourced by demo.sh and test.sh; usable alone: scripts/setup.sh [targets]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# DAPO_PACKAGE_LISTS: the lists to install (default scripts/packages.txt; test.sh adds scripts/test-packages.txt).
# shellcheck disable=SC2086  # a list of files
mapfile -t packages < <(grep -hv '^#' ${DAPO_PACKAGE_LISTS:-scripts/packages.txt} | grep -v '^$')
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]]; then
    echo "dapo: installing ${missing[*]}"
    # One apt at a time: CI makes its Debian roots (scripts/libtorch2.sh installs mmdebstrap) while this runs.
    flock /run/lock/dapo-apt apt-get update
    DEBIAN_FRONTEND=noninteractive flock /run/lock/dapo-apt apt-get install -y "${missing[@]}"
  else
    echo "dapo: missing Debian packages; run this, then try again:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

build_dir=${DAPO_BUILD_DIR:-build}
# shellcheck disable=SC2086  # DAPO_EXTRA_CMAKE_ARGS is a list of words
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
      -DDAPO_WERROR="${DAPO_WERROR:-OFF}" ${DAPO_EXTRA_CMAKE_ARGS:-}
if (($#)); then
  cmake --build "$build_dir" -j"$(nproc)" --target "$@"
else
  cmake --build "$build_dir" -j"$(nproc)"
fi
