#!/bin/bash
# Two kvtier builds, alone or beside one peer (docs/PERFORMANCE.md sections 16 and 18):
# `kvtier bench` (with --peer in the peer's environment), alternating the build under test
# ("after", the one installed there) with an earlier one ("before", installed with
# `pip install --target BEFORE ...`), each run with kvtier and the peer side by side on the
# same blocks. PEER=none: kvtier alone, with enough latency samples for its p95 figures.
# Usage: bench/side_by_side_builds.sh PY BEFORE OUTDIR; ROOT (/dev/shm), PEER (vllm), THREADS
# ("4 16"), ROUNDS ("1 2 3 4"), SIZES (256K,2M), TOTAL (512M), PRIMARY (scattered),
# LATENCY_SAMPLES (12; 450 without a peer) and LOOP_SECONDS (0.3; 1 without a peer) narrow the
# set.
# Summary: python bench/side_by_side_builds.py OUTDIR
set -u
py=$1; before=$2; out=$3
mkdir -p "$out"
peer=(--peer "${PEER:-vllm}"); samples=12; loop=0.3
if [ "${PEER:-vllm}" = none ]; then peer=(); samples=450; loop=1; fi
for round in ${ROUNDS:-1 2 3 4}; do
  order="before after"; [ $((round % 2)) -eq 0 ] && order="after before"
  for t in ${THREADS:-4 16}; do
    for who in $order; do
      pp=""; [ "$who" = before ] && pp=$before
      name=$who-t$t-r$round
      echo "$(date -u +%T) $name start load $(cut -d' ' -f1-3 /proc/loadavg)"
      PYTHONPATH=$pp "$py" -m kvtier bench --root "${ROOT:-/dev/shm}" "${peer[@]}" \
        --sizes "${SIZES:-256K,2M}" --total "${TOTAL:-512M}" --repeat 3 --blocks-per-job 16 \
        --read-threads "$t" --write-threads "$t" --primary "${PRIMARY:-scattered}" --no-fio \
        --latency-samples "${LATENCY_SAMPLES:-$samples}" --loop-seconds "${LOOP_SECONDS:-$loop}" \
        --json "$out/$name.json" --quiet \
        > "$out/$name.txt" 2>&1
      echo "$(date -u +%T) $name rc=$? load $(cut -d' ' -f1-3 /proc/loadavg)"
    done
  done
done
