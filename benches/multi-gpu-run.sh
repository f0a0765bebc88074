#!/usr/bin/env bash
# Many processes on one machine of several GPUs (e.g. two H200s, 32 cores): processes started
# the torchrun way (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), each on its own GPU
# (`--shard env`) with its share of the cores, over one corpus as a folder and as WebDataset tar
# shards, with CPU and with hybrid decoding:
#   1. every image exactly once across the ranks (the uneven split; checked from the ids each
#      rank saves, at a small output size so the files stay small);
#   2. aggregate images/s of WORLD processes at once (all images over the slowest rank's time,
#      from its first batch, and from the processes' start to the last one's exit)
#      against WORLD times one process alone with its share of the cores (the same threads, its
#      shard of the files), and against one process alone with every core, in turn;
#   3. one process on GPU 0 with a quarter of the cores against all of them (CPU and hybrid).
# Run from the repository root with .gpu/ built (../shared/tools/gpu-bundle). WORLD (default:
# the number of GPUs), N (corpus size, default 8192), ROUNDS (default 2), EPOCHS (default 3),
# SOURCES (default "folder shards"), BIN (the build, default .gpu/bin/bin-gpufeed), PIN=1 (each
# rank, and rank 0 alone, pinned with taskset to its own share of the cores), DECODES (default
# "cpu hybrid"), SCALING=0 (skip
# step 3), MACHINE=0 (skip step 0).
#   0. the machine's own scaling, for reference: Pillow's decode and resize
#      (.gpu/tools/pil-baseline) in one process pinned to each core, its rate a core with a
#      rank's share of the cores busy against all of them (work on every core runs slower than
#      on a quarter of them, gpufeed or not).
set -uo pipefail
export PYTHONUNBUFFERED=1
g=${BIN:-.gpu/bin/bin-gpufeed}
world=${WORLD:-$(nvidia-smi -L 2>/dev/null | wc -l)}
if [ "$world" -lt 1 ]; then echo "no GPU found (set WORLD to choose the number of ranks)"; exit 1; fi
n=${N:-8192}
rounds=${ROUNDS:-2}
epochs=${EPOCHS:-3}
cores=$(nproc)
per=$((cores / world))
step() { echo; echo "=== $*"; }
# Pillow's images/s a core with one process on each of the first $1 cores, over the corpus's
# first class folder (read into memory first).
pillow_per_core() {
  local busy=$1 dir
  dir=$(find /tmp/mg-folder -mindepth 1 -maxdepth 1 -type d | sort | head -1)
  for i in $(seq 0 $((busy - 1))); do
    taskset -c "$i" python3 .gpu/tools/pil-baseline "$dir" >/tmp/mg-pil.$i 2>&1 &
  done
  wait
  cat /tmp/mg-pil.* | sed -n 's/^pillow_img_per_s_per_core=//p' |
    awk -v n="$busy" '{s += $1} END {if (NR == n) printf "%.1f", s / NR; else print "failed"}'
  rm -f /tmp/mg-pil.*
}

# Runs "$@" as rank $1 would: on its own cores with PIN=1.
as_rank() {
  local r=$1; shift
  if [ -n "${PIN:-}" ]; then taskset -c $((r * per))-$((r * per + per - 1)) "$@"; else "$@"; fi
}
step "device: $world GPUs, $cores cores ($per a process)"
nvidia-smi --query-gpu=index,name --format=csv,noheader

[ -d /tmp/mg-folder ] || python3 .gpu/tools/make-corpus /tmp/mg-folder "$n" 0 >/dev/null
if [ ! -d /tmp/mg-shards ]; then
  # WebDataset shards of the same files: key.jpg + key.cls (the class folder's index), 8 shards.
  python3 - <<'PY'
import os, tarfile, io
root, out = "/tmp/mg-folder", "/tmp/mg-shards"
os.makedirs(out)
classes = sorted(os.listdir(root))
files = [(c, f) for c in classes for f in sorted(os.listdir(os.path.join(root, c)))]
shards = [tarfile.open(os.path.join(out, f"part-{i:03d}.tar"), "w") for i in range(8)]
for i, (c, f) in enumerate(files):
    tar = shards[i % 8]
    key = f"{c}_{os.path.splitext(f)[0]}"
    tar.add(os.path.join(root, c, f), arcname=f"{key}.jpg")
    label = str(classes.index(c)).encode()
    info = tarfile.TarInfo(f"{key}.cls")
    info.size = len(label)
    tar.addfile(info, io.BytesIO(label))
for tar in shards:
    tar.close()
PY
fi

# Seconds since the epoch, to the nanosecond.
now() { date +%s.%N; }

# WORLD ranks at once, each `gpufeed run ... --shard env` with its variables; prints the ranks'
# JSON lines to $1, and to $1.wall the seconds from their start to the last one's exit.
ranks() {
  local log=$1; shift
  : >"$log"
  local start
  start=$(now)
  for r in $(seq 0 $((world - 1))); do
    RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r LOCAL_WORLD_SIZE=$world as_rank "$r" "$g" run "$@" --shard env \
      --threads "$per" --json >>"$log.$r" 2>&1 &
  done
  wait
  python3 -c "print($(now) - $start)" >"$log.wall"
  for r in $(seq 0 $((world - 1))); do tail -1 "$log.$r" >>"$log"; rm -f "$log.$r"; done
}

rate() { tail -1 | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["images_per_s"]))'; }

if [ "${MACHINE:-1}" != 0 ]; then
  step "the machine's own scaling: Pillow, one process pinned to each core"
  quarter=$(pillow_per_core "$per")
  every=$(pillow_per_core "$cores")
  echo "$per cores busy: $quarter img/s a core; all $cores: $every img/s a core" \
    "($(python3 -c "print(f'{$every / $quarter:.2f}')" 2>/dev/null || echo '?'))"
fi

[ "${SCALING:-1}" = 0 ] ||
  step "one process on GPU 0: a quarter of the cores ($((cores / 4)) threads) against all $cores, in turn"
[ "${SCALING:-1}" = 0 ] || for decode in cpu hybrid; do
  for round in $(seq "$rounds"); do
    quarter=$("$g" run /tmp/mg-folder --decode $decode --epochs "$epochs" --threads $((cores / 4)) --json | rate)
    all=$("$g" run /tmp/mg-folder --decode $decode --epochs "$epochs" --threads "$cores" --json | rate)
    echo "--decode $decode, round $round: $((cores / 4)) threads $quarter img/s, $cores threads $all img/s" \
      "($(python3 -c "print(f'{$all / max($quarter, 1):.2f}')")x)"
  done
done

for source in ${SOURCES:-folder shards}; do
  dir=/tmp/mg-$source
  extra=""; [ $source = shards ] && extra="--webdataset"
  step "$source: every image exactly once across $world ranks (uneven split)"
  rm -f /tmp/mg-r*.npy /tmp/mg-r*.paths.txt
  pids=()
  for r in $(seq 0 $((world - 1))); do
    RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r "$g" run "$dir" $extra --shard env \
      --shard-balance uneven --crop 8 --resize 8 --save /tmp/mg-r$r.npy --json >/dev/null &
    pids+=($!)
  done
  failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
  seen=$(cat /tmp/mg-r*.paths.txt 2>/dev/null | wc -l)
  repeated=$(cat /tmp/mg-r*.paths.txt 2>/dev/null | sort | uniq -d | wc -l)
  if [ "$failed" = 0 ] && [ "$seen" = "$n" ] && [ "$repeated" = 0 ]; then
    echo "every id exactly once: $seen of $n"
  else
    echo "FAILED: $failed ranks failed, $seen ids of $n seen, $repeated seen more than once"
  fi
  for decode in ${DECODES:-cpu hybrid}; do
    step "$source, --decode $decode: one process alone vs $world at once, in turn"
    for round in $(seq "$rounds"); do
      one=$("$g" run "$dir" $extra --decode $decode --epochs "$epochs" --json | rate)
      # Rank 0 alone, with its share of the cores and its shard: what each rank would do alone.
      start=$(now)
      alone=$(RANK=0 WORLD_SIZE=$world LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 as_rank 0 "$g" run "$dir" $extra --decode $decode \
        --epochs "$epochs" --shard env --shard-balance uneven --threads "$per" --json | tee /tmp/mg-alone.json | rate)
      alone_wall=$(python3 -c "print($(now) - $start)")
      ranks /tmp/mg.log "$dir" $extra --decode $decode --epochs "$epochs" --shard-balance uneven
      python3 - "$one" "$round" "$world" "$alone" "$alone_wall" <<'PY'
import json, sys
rows = [json.loads(l) for l in open("/tmp/mg.log") if l.startswith("{")]
rows = [r for r in rows if "error" not in r]
world = int(sys.argv[3])
if len(rows) != world:
    print(f"round {sys.argv[2]}: FAILED: {world - len(rows)} of {world} ranks gave no summary")
    sys.exit(0)
images = sum(r["images"] for r in rows)
seconds = max(r["seconds"] for r in rows)
one, alone = float(sys.argv[1]), float(sys.argv[4])
together = images / seconds
print(f"round {sys.argv[2]}: {len(rows)} processes {together:.0f} img/s together ({images} images, "
      f"the slowest rank {seconds:.2f} s); one rank alone {alone:.0f} img/s, so "
      f"{together / (world * alone):.2f} of {world} x alone; one process with every core {one:.0f} "
      f"img/s ({together / one:.2f}x)")
# The same from process start to exit, setup (the GPU lane's opening) included.
wall = float(open("/tmp/mg.log.wall").read())
alone_wall = float(sys.argv[5])
alone_images = json.loads(open("/tmp/mg-alone.json").read().strip().splitlines()[-1])["images"]
print(f"    start to exit: {world} processes {wall:.2f} s ({images / wall:.0f} img/s), rank 0 "
      f"alone {alone_wall:.2f} s ({alone_images / alone_wall:.0f} img/s): "
      f"{(images / wall) / (world * alone_images / alone_wall):.2f} of {world} x alone")
PY
    done
  done
done
