#!/usr/bin/env bash
# The LibTorch 2.x legs: a Debian root (scripts/packages.txt: LibTorch 2.x, its compiler and the rest) made once with
# mmdebstrap and cached outside the clone, then used with chroot. Needs root (chroot, mounts) and Debian's package
# archive, whose address is taken from this machine's apt configuration (DAPO_DEBIAN_MIRROR to choose another).
# The first word picks the root: trixie (Debian 13: LibTorch 2.6, g++ 14, and libtorch-cuda-dev's headers for the CUDA
# compile check; the default) or sid (Debian unstable: the newest packaged LibTorch, 2.14 with g++ 16 when written).
#   scripts/libtorch2.sh [trixie|sid] test [ctest args]   build everything inside the root (build-libtorch2/ or
#                                                         build-sid/) and run the tests
#   scripts/libtorch2.sh [trixie|sid] library             build and run only the library's tests (core, torch):
#                                                         CI's Debian 13 leg (the driver is compiled there by the
#                                                         CUDA check; the consumer projects run on 1.13 and 2.14)
#   scripts/libtorch2.sh [trixie] cuda                    compile the CUDA build against Debian 13's
#                                                         libtorch-cuda-dev headers with /usr/local/cuda's nvcc, in
#                                                         build-cuda/ (scripts/cuda-compile-in-root.sh, run in the
#                                                         root; see docs/platforms.md)
#   scripts/libtorch2.sh [trixie|sid] root                only make (or find) the root and print its path
#   scripts/libtorch2.sh [trixie|sid] shell               a shell in the root, the clone at /src, ../shared at /shared
#   scripts/libtorch2.sh sid python FILE [ARGS]           python3 FILE ARGS in the sid root, which holds transformers
#                                                         too (scripts/transformers-packages.txt), in /src
# The cache: ${DAPO_CACHE_DIR:-/var/cache/dapo}/<debian13|sid>-<key>, the key a hash of this recipe and the package
# list, so a changed list makes a new root (old ones can be deleted by hand). First run 1 to 14 min (the mirror
# decides), 1.4 GB (trixie) or 2.3 GB (sid, with transformers); later runs reuse it. A sid root is a snapshot of a
# moving suite: it is remade when the recipe changes, or by deleting it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
src=$(pwd)
shared=$(realpath -m "${DAPO_SHARED_DIR:-../shared}")

if [[ $(id -u) -ne 0 ]]; then
  echo "libtorch2: needs root (mmdebstrap, chroot and bind mounts); run it as root or under sudo" >&2
  exit 1
fi
suite=trixie
if [[ ${1:-} == trixie || ${1:-} == sid ]]; then
  suite=$1
  shift
fi
mode=${1:-test}
shift || true

# The Debian archive this machine's apt uses (deb822 .sources or one-line sources.list), security archives aside.
apt_mirror() {
  {
    sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | tr ' ' '\n'
    sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\).*/\2/p' \
      /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null
  } | grep -v -e security -e '^$' | grep -m1 '/debian/\?$' || true
}
mirror=${DAPO_DEBIAN_MIRROR:-$(apt_mirror)}
[[ -n $mirror ]] || { echo "libtorch2: no Debian archive in this machine's apt sources; set DAPO_DEBIAN_MIRROR" >&2; exit 1; }
mapfile -t packages < <(grep -v '^#' scripts/packages.txt | grep -v '^$')
cache=${DAPO_CACHE_DIR:-/var/cache/dapo}
if [[ $suite == trixie ]]; then
  # What the root holds beyond the build: libtorch-cuda-dev is downloaded and unpacked, never installed (its runtime,
  # libtorch-cuda-2.6 and the NVIDIA libraries, cannot be installed without a GPU driver and non-free downloads).
  components=main,contrib
  recipe="suite=$suite components=$components packages=${packages[*]} cuda-dev=libtorch-cuda-dev recipe=1"
  root=$cache/debian13-$(printf '%s' "$recipe" | sha256sum | cut -c1-12)
  build_dir=build-libtorch2
else
  # sid's Release file on a mirror may be past its Valid-Until date (a snapshot): apt is told not to mind. The root
  # holds transformers and PyTorch's Python package too: one root for LibTorch 2.14 and for transformers.
  components=main
  mapfile -t -O "${#packages[@]}" packages < <(grep -v '^#' scripts/transformers-packages.txt | grep -v '^$')
  recipe="suite=$suite components=$components packages=${packages[*]} recipe=1"
  root=$cache/sid-$(printf '%s' "$recipe" | sha256sum | cut -c1-12)
  build_dir=build-sid
fi

make_root() {
  [[ -f $root/.dapo-root-complete ]] && return 0
  command -v mmdebstrap > /dev/null || {
    echo "libtorch2: installing mmdebstrap"
    # One apt at a time (flock): CI runs this beside scripts/setup.sh's installs.
    flock /run/lock/dapo-apt apt-get update
    DEBIAN_FRONTEND=noninteractive flock /run/lock/dapo-apt apt-get install -y mmdebstrap
  }
  echo "libtorch2: making the Debian $suite root $root (once per package list; 1 to 14 minutes, by the mirror)"
  mkdir -p "$cache"
  rm -rf "$root.partial"
  local include
  include=$(IFS=,; echo "${packages[*]}")
  mmdebstrap --variant=apt --components="$components" --include="$include" \
    --aptopt='Acquire::Check-Valid-Until "false"' "$suite" "$root.partial" "deb $mirror $suite ${components//,/ }"
  if [[ $suite == trixie ]]; then
    # mmdebstrap leaves no package lists behind: fetch them for the download, then drop them again.
    chroot "$root.partial" bash -c 'set -e; apt-get update -q; mkdir -p /opt/debs; cd /opt/debs
                                     apt-get download libtorch-cuda-dev; dpkg -x libtorch-cuda-dev_*.deb /opt/libtorch-cuda-dev
                                     apt-get clean; rm -rf /var/lib/apt/lists/*'
  fi
  printf '%s\n' "$recipe" > "$root.partial/.dapo-root-complete"
  mv "$root.partial" "$root"
}

# Runs a command in the root, inside a private mount namespace so that /proc and the bind mounts vanish with it.
# With with_cuda=1, the host's /usr/local/cuda (nvcc) is bound in too; the test leg runs without it.
in_root() {
  local cuda_mount=""
  if [[ ${with_cuda:-0} == 1 ]]; then
    cuda_mount="mkdir -p '$root/usr/local/cuda' && mount --bind /usr/local/cuda '$root/usr/local/cuda'"
  fi
  unshare --mount --propagation private bash -c "
    set -e
    mount -t proc proc '$root/proc'
    mkdir -p '$root/src' '$root/shared'
    mount --bind '$src' '$root/src'
    if [[ -d '$shared' ]]; then mount --bind '$shared' '$root/shared'; fi
    $cuda_mount
    exec chroot '$root' /usr/bin/env HOME=/root DAPO_SHARED_DIR=/shared bash -c 'cd /src && $1'"
}

# What the test legs build with, first in their output.
versions() {
  echo "libtorch2: LibTorch $(chroot "$root" dpkg-query -W -f='${Version}' libtorch-dev), g++ $(chroot "$root" g++ -dumpversion)"
}

make_root
case $mode in
  root) echo "$root" ;;
  shell) in_root "exec bash" ;;
  test)
    versions
    # The sid root has python3-torch (scripts/transformers-packages.txt): its torchrun must be found there (the test
    # then skips, naming the reason, if that torchrun cannot start programs: docs/platforms.md). The Debian 13 root has
    # none (scripts/test-packages.txt is not in it): the test skips there instead of failing.
    torchrun=optional
    [[ $suite == sid ]] && torchrun=required
    in_root "DAPO_BUILD_DIR=$build_dir DAPO_TORCHRUN_TEST=$torchrun bash scripts/test.sh $*" ;;
  library)
    versions
    in_root "DAPO_BUILD_DIR=$build_dir scripts/setup.sh dapo_core_tests dapo_torch_tests &&
             ctest --test-dir $build_dir --output-on-failure -R \"^(core|torch)\$\" $*" ;;
  cuda)
    [[ $suite == trixie ]] || { echo "libtorch2: the CUDA compile check runs in the trixie root" >&2; exit 2; }
    [[ -x /usr/local/cuda/bin/nvcc ]] || { echo "libtorch2: the CUDA check needs nvcc in /usr/local/cuda" >&2; exit 1; }
    with_cuda=1 in_root "bash scripts/cuda-compile-in-root.sh $*" ;;
  python)
    [[ $suite == sid ]] || { echo "libtorch2: transformers is in the sid root: scripts/libtorch2.sh sid python FILE" >&2; exit 2; }
    (($# >= 1)) || { echo "libtorch2: python needs a file to run" >&2; exit 2; }
    in_root "python3 $(printf '%q ' "$@")" ;;
  *) echo "libtorch2: unknown mode '$mode' (test, library, cuda, root, shell or python)" >&2; exit 2 ;;
esac
