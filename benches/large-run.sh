#!/usr/bin/env bash
# Camera-size photos through every decode mode, in turn, at batch 256 and 32, with NVIDIA DALI's
# mixed decoder on the same files in the same run when it is importable (../shared/tools/dali-bench
# copied to .gpu/tools says how to bring it). Two sets made by benches/make-large.py from the
# bundled photos: a mix like real photo folders (--mix --grain 3: 2-12 Mpx, baseline 4:2:0 and
# 4:4:4, gray, progressive) and baseline 4:2:0 only, each listed several times (symbolic links in
# folders of their own: 2,048 entries an epoch, like a folder of 2,048 photos, so that an epoch is
# more than one batch). Run on the GPU machine from the repository root (carry .gpu). ROUNDS
# (default 1), MIX (files, default 512), BASELINE (default 256), BATCHES (default "256 32"),
# SETS (default "mix baseline"; "progressive" is the mix's progressive files alone); MAKE_ONLY=1
# makes the sets and their entries and stops.
set -uo pipefail
export PYTHONUNBUFFERED=1
rounds=${ROUNDS:-1}
g=${BIN:-.gpu/bin/bin-gpufeed}
summary() { python3 benches/run-summary.py "$@"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
make() { # DIR FILES EXTRA...: eight parts made side by side
  local dir=$1 n=$2; shift 2
  [ -d "$dir" ] && return
  for part in 0 1 2 3 4 5 6 7; do
    python3 benches/make-large.py .gpu/photos "$dir/$part" $((n / 8)) $((part + 2)) "$@" >/dev/null &
  done
  wait
}
make /tmp/large-mix "${MIX:-512}" --mix --grain 3
make /tmp/large-baseline "${BASELINE:-256}" --grain 3
# The mix's progressive files (a fifth of it) on their own.
if [ ! -d /tmp/large-progressive ]; then
  mkdir -p /tmp/large-progressive
  python3 - <<'PY'
import os
n = 0
for root, _, files in sorted(os.walk('/tmp/large-mix')):
    for f in sorted(files):
        path = os.path.join(root, f)
        with open(path, 'rb') as jpeg:
            if b'\xff\xc2' in jpeg.read(4096):
                n += 1
                os.symlink(path, f'/tmp/large-progressive/{n:04d}.jpg')
PY
fi
entries() { # SET: the set's files listed until 2,048 entries
  local files dir=/tmp/entries-$1
  [ -d "$dir" ] && return
  mkdir -p "$dir"
  files=$(find "/tmp/large-$1" -name '*.jpg' | wc -l)
  for copy in $(seq $((2048 / files))); do cp -rs "/tmp/large-$1" "$dir/$copy"; done
}
if [ -n "${MAKE_ONLY:-}" ]; then
  for set in mix baseline progressive; do entries "$set"; done
  exit 0
fi
dali=""
python3 -c "import nvidia.dali" 2>/dev/null && [ -f .gpu/tools/dali-bench ] && dali=.gpu/tools/dali-bench
for set in ${SETS:-mix baseline}; do
  entries "$set"
  dir=/tmp/entries-$set
  echo "=== $set: $(find "/tmp/large-$set" -name '*.jpg' | wc -l) files ($(du -sh "/tmp/large-$set" | cut -f1)), $(find "$dir" -name '*.jpg' | wc -l) entries"
  for batch in ${BATCHES:-256 32}; do
    for round in $(seq "$rounds"); do
      echo "--- round $round, batch $batch, 3 epochs"
      for mode in "default:" "cpu:--decode cpu" "engines:--decode hybrid --gpu-share 1 --assisted-share 0" \
                  "engines+assisted:--decode hybrid --gpu-share 1" "assisted:--decode hybrid --gpu-share 1 --assisted-share 1"; do
        label=${mode%%:*}; args=${mode#*:}
        $g run "$dir" --json --epochs 3 --batch-size "$batch" --profile $args | summary "$label"
      done
      if [ -n "$dali" ]; then
        echo "DALI mixed decoder: $(python3 "$dali" "$dir" --batch "$batch" --epochs 3 2>/dev/null | tail -1)"
      fi
    done
  done
done
