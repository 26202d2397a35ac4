#!/usr/bin/env bash
# Checks that every C++ and CUDA source file is formatted with the repository's .clang-format (clang-format 14, the
# Debian 12 package). Lists the files that are not and exits 1; `scripts/check-format.sh --fix` formats them in place.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v clang-format > /dev/null; then
  if [[ $(id -u) -eq 0 ]]; then
    flock /run/lock/dapo-apt apt-get update > /dev/null  # one apt at a time, as scripts/setup.sh
    DEBIAN_FRONTEND=noninteractive flock /run/lock/dapo-apt apt-get install -y clang-format > /dev/null
  else
    echo "check-format: clang-format is missing; sudo apt-get install -y clang-format" >&2
    exit 1
  fi
fi
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh')
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
unformatted=()
for file in "${files[@]}"; do
  clang-format --dry-run --Werror "$file" > /dev/null 2>&1 || unformatted+=("$file")
done
if ((${#unformatted[@]})); then
  echo "check-format: ${#unformatted[@]} file(s) differ from .clang-format ($(clang-format --version)):" >&2
  printf '  %s\n' "${unformatted[@]}" >&2
  echo "check-format: run scripts/check-format.sh --fix" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
