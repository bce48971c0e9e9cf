#!/bin/bash
# The side-by-side runs of docs/PERFORMANCE.md section 15 (issues 20 and 23): one `kvtier
# bench` per file system x threads x primary layout x peer environment, one after another.
# Usage: bench/side_by_side.sh TAG OUTDIR [PEER ...] (PEER: vllm, lmcache; default both);
# FSES ("ext4:/tmp tmpfs:/dev/shm"), THREADS ("4 16"), LAYOUTS ("scattered thp") and TOTAL
# (768M) narrow the set, EXTRA adds options to every run (e.g. "--io-timeout-s 0"); a run
# whose JSON is already in OUTDIR is not run again.
# Environments: VLLM_NATIVE_VENV (default .venv-vllm-native: vLLM 0.33 on vllm.fs_io_C,
# CUDA-build torch without a GPU; .ci/vllm-native-env.sh builds it) and LMCACHE_VENV (default
# .venv-lmcache: LMCache 0.5.6; .ci/lmcache-env.sh), each with this checkout's kvtier installed.
# The hugetlb load ceilings need huge pages: as root, sysctl vm.nr_overcommit_hugepages=128.
set -u
tag=$1; out=$2; shift 2
peers=("$@"); [ ${#peers[@]} -eq 0 ] && peers=(vllm lmcache)
mkdir -p "$out"
for fs in ${FSES:-ext4:/tmp tmpfs:/dev/shm}; do
  for threads in ${THREADS:-4 16}; do
    for primary in ${LAYOUTS:-scattered thp}; do
      for peer in "${peers[@]}"; do
        venv=${VLLM_NATIVE_VENV:-.venv-vllm-native}
        [ "$peer" = lmcache ] && venv=${LMCACHE_VENV:-.venv-lmcache}
        name="$tag-${fs%%:*}-t$threads-$primary-$peer"
        [ -e "$out/$name.json" ] && continue
        echo "$(date -u +%H:%M:%S) $name load $(cut -d' ' -f1-3 /proc/loadavg)"
        "$venv/bin/python" -m kvtier bench --root "${fs#*:}" --peer "$peer" \
          --sizes 256K,2M --total "${TOTAL:-768M}" --repeat 3 --blocks-per-job 16 \
          --read-threads "$threads" --write-threads "$threads" --primary "$primary" \
          --ceilings huge ${EXTRA:-} --json "$out/$name.json" --quiet > "$out/$name.txt" 2>&1
        rc=$?
        echo "$(date -u +%H:%M:%S) $name rc=$rc load $(cut -d' ' -f1-3 /proc/loadavg)"
      done
    done
  done
done
