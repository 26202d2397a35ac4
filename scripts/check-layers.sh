#!/usr/bin/env bash
# Checks the driver's layers (examples/qwen_gsm8k, docs/driver.md): each folder includes only itself and the folders
# below it, by the list of allowed dependencies here, and the folders of the LibTorch-free library (qwen_no_torch)
# include no LibTorch header. Lists every include that crosses upwards or sideways, every LibTorch include there, and
# every folder the list does not know, as file:line; exits 1 if there is any.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../examples/qwen_gsm8k"
# folder: the folders it may include (besides itself). Bottom to top:
#   common <- text, data, model, dist, report, logging; model <- engine; all of them <- train <- demo <- cli <- main.cpp
declare -A allowed=(
  [common]=""
  [text]="common"
  [data]="common"
  [model]="common"
  [engine]="common model"
  [dist]="common"
  [report]="common"
  [logging]="common"
  [train]="common text data model engine dist report logging"
  [demo]="common text data model engine dist report logging train"
  [cli]="common text data model engine dist report logging train demo"
  [main.cpp]="common text data model engine dist report logging train demo cli"
)
# Folders that know no LibTorch (<torch/...>, <ATen/...>, <c10/...>): the fuzz targets and the text tests link them
# without it.
no_torch="common text data report logging"
bad=0
while IFS= read -r file; do
  folder=${file%%/*}
  if [[ -z ${allowed[$folder]+set} ]]; then
    echo "check-layers: examples/qwen_gsm8k/$file: folder '$folder' is not in scripts/check-layers.sh's list" >&2
    bad=1
    continue
  fi
  while IFS=: read -r line target; do
    [[ $target == "$folder" || " ${allowed[$folder]} " == *" $target "* ]] && continue
    echo "check-layers: examples/qwen_gsm8k/$file:$line: $folder includes $target/" \
         "(allowed: ${allowed[$folder]:-none})" >&2
    bad=1
  done < <(grep -noE '^#include "qwen_gsm8k/[a-z_]+/' "$file" | sed -E 's#:\#include "qwen_gsm8k/#:#; s#/$##')
  if [[ " $no_torch " == *" $folder "* ]]; then
    while IFS= read -r hit; do
      echo "check-layers: examples/qwen_gsm8k/$file:${hit%%:*}: $folder/ knows no LibTorch, but includes ${hit#*:}" >&2
      bad=1
    done < <(grep -noE '^#include <(torch|ATen|c10)/[^>]*>' "$file" | sed -E 's#:\#include #:#')
  fi
done < <(find . -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' | sed 's#^\./##' | sort)
if ((bad)); then
  echo "check-layers: includes against the layers (docs/driver.md); move the code down or the include up" >&2
  exit 1
fi
echo "check-layers: $(find . -name '*.cpp' -o -name '*.hpp' | wc -l) files follow the layers"
