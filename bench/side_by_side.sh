#!/bin/bash
# The side-by-side runs of docs/PERFORMANCE.md section 15 (issues 20 and 23): one `kvtier
# bench` per file system x threads x primary layout x peer environment, one after another.
# Usage: bench/side_by_side.sh TAG OUTDIR [PEER ...] (PEER: vllm, lmcache; default both).
# Environments: /work/venvs/vnative (vLLM 0.33 on vllm.fs_io_C, CUDA-build torch without a
# GPU) and /work/venvs/lmcache (LMCache 0.5.6), each with this checkout's kvtier installed.
# The hugetlb load ceilings need huge pages: as root, sysctl vm.nr_overcommit_hugepages=128.
set -u
tag=$1; out=$2; shift 2
peers=("$@"); [ ${#peers[@]} -eq 0 ] && peers=(vllm lmcache)
mkdir -p "$out"
for fs in ext4:/tmp tmpfs:/dev/shm; do
  for threads in 4 16; do
    for primary in scattered thp; do
      for peer in "${peers[@]}"; do
        venv=/work/venvs/vnative; [ "$peer" = lmcache ] && venv=/work/venvs/lmcache
        name="$tag-${fs%%:*}-t$threads-$primary-$peer"
        echo "$(date -u +%H:%M:%S) $name load $(cut -d' ' -f1-3 /proc/loadavg)"
        "$venv/bin/python" -m kvtier bench --root "${fs#*:}" --peer "$peer" \
          --sizes 256K,2M --total 768M --repeat 3 --blocks-per-job 16 \
          --read-threads "$threads" --write-threads "$threads" --primary "$primary" \
          --ceilings huge --json "$out/$name.json" --quiet > "$out/$name.txt" 2>&1
        echo "$(date -u +%H:%M:%S) $name rc=$? load $(cut -d' ' -f1-3 /proc/loadavg)"
      done
    done
  done
done
