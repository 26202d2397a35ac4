#!/usr/bin/env bash
# Prepares device-carry/ (git-ignored) for scripts/device-check.sh on a GPU machine that has no apt and no network:
# the Debian 12 packages of the build dependencies that PyTorch's LibTorch does not bring (scripts/device-packages.txt;
# downloaded with `apt-get download` from the archive of this machine's apt sources, unpacked there with dpkg -x into a
# prefix), and a copy of ../shared, the tests' reference data (carried, never committed). Then prints what to send:
# the command, the folder to carry and the time limit.
#   bash scripts/device-prepare.sh            download (once) and check the size
#   bash scripts/device-prepare.sh --unpack   also unpack into build-device/prefix and check it (what CI runs)
set -euo pipefail
cd "$(dirname "$0")/.."

carry=device-carry
# The packages to carry (scripts/device-packages.txt says which and why).
mapfile -t packages < <(grep -v '^#' scripts/device-packages.txt | grep -v '^$')
shared=${DAPO_SHARED_DIR:-../shared}

mkdir -p "$carry/debs"
missing=()
for package in "${packages[@]}"; do
  compgen -G "$carry/debs/${package}_*.deb" >/dev/null || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "device-prepare: downloading ${missing[*]}"
  if ! (cd "$carry/debs" && apt-get download -q "${missing[@]}"); then
    echo "device-prepare: apt-get download failed; updating the package lists and trying again"
    flock /run/lock/dapo-apt apt-get update -q  # one apt at a time, as scripts/setup.sh
    (cd "$carry/debs" && apt-get download -q "${missing[@]}")
  fi
fi
for package in "${packages[@]}"; do
  count=$(compgen -G "$carry/debs/${package}_*.deb" | wc -l)
  if [[ $count != 1 ]]; then
    echo "device-prepare: expected one $package .deb in $carry/debs, found $count (delete the folder and rerun)" >&2
    exit 1
  fi
done

if [[ ! -d $shared/fixtures ]]; then
  echo "device-prepare: no reference data at $shared (set DAPO_SHARED_DIR): the device's tests would skip" >&2
  exit 1
fi
rm -rf "$carry/shared"
mkdir -p "$carry/shared"
cp -r "$shared/fixtures" "$shared/data" "$carry/shared/"

if [[ ${1:-} == --unpack ]]; then
  bash scripts/device-check.sh --unpack-only
fi

# What travels: the working tree (tracked files, untracked files git does not ignore) plus the carried folder.
tree_bytes=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 -r stat -c %s -- 2>/dev/null |
  awk '{s += $1} END {print s + 0}')
carry_bytes=$(du -sb "$carry" | cut -f1)
limit=$((64 * 1024 * 1024))
total=$((tree_bytes + carry_bytes))
awk -v t="$tree_bytes" -v c="$carry_bytes" -v name="$carry" 'BEGIN {
  printf "device-prepare: working tree %.1f MiB + %s %.1f MiB = %.1f MiB (limit 64 MiB)\n", t / 1048576, name,
         c / 1048576, (t + c) / 1048576 }'
if ((total > limit)); then
  echo "device-prepare: too large to travel" >&2
  exit 1
fi
cat <<EOF

Send (device tool, run), first the headline call, then, if the time allows, the rest on the same warm machine:
  command:   bash scripts/device-check.sh headline        command:   bash scripts/device-check.sh rest
  carry:     ["$carry"]                                   carry:     ["$carry"]
  timeout_s: 450                                          timeout_s: 480 (or --budget SECONDS for less)
Each brings back in \$OUT what landed, stage by stage: report.md (the table for docs/benchmarks.md), results.json,
profile.md (headline), log.txt. A call stopped at its limit still brings back every stage that finished before it.
EOF
