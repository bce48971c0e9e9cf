#!/bin/bash
# Section 35's alternating runs: BEFORE and AFTER are commands that run a Python script with
# one build each (here: main at dbd5aee, through a wrapper that puts its tree first on
# sys.path, and this change's editable install). OUT is where the results go.
#   BEFORE="python run_old.py" AFTER=python OUT=set3 STEADY=1 bash alternate.sh
set -eu
cd "$(git rev-parse --show-toplevel)"
mkdir -p "$OUT"
for i in 1 2 3 4 5 6; do
  for b in old new; do
    if [ $b = old ]; then R=$BEFORE; else R=$AFTER; fi
    $R bench/capacity_bench.py submit --root /dev/shm --repeat 3 --budget 1GiB \
      --blocks-per-job 16 --jobs 1000 > "$OUT/s16-$b-$i.txt" 2>&1
    $R bench/capacity_bench.py submit --root /dev/shm --repeat 3 > "$OUT/s64-$b-$i.txt" 2>&1
    if [ "${STEADY:-0}" = 1 ]; then  # set 3 only
      $R bench/capacity_bench.py submit --root /dev/shm --repeat 3 --inflight 8 \
        > "$OUT/s8-$b-$i.txt" 2>&1
    fi
  done
done
if [ "${STEADY:-0}" = 1 ]; then
  for i in 1 2; do
    for b in old new; do
      if [ $b = old ]; then R=$BEFORE; else R=$AFTER; fi
      $R bench/capacity_bench.py steady --root /dev/shm --budget 512MiB --total 512MiB \
        --repeat 3 > "$OUT/steady-$b-$i.txt" 2>&1
    done
  done
fi
