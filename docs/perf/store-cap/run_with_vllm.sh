#!/bin/bash
# Store cap while loading 2 against 1, with vLLM native beside (its flood store rate too).
# As run (from a scratch directory holding capbench.py; rounds 1-2 of kvtier alone with ROUNDS
# unset, 3-6 with ROUNDS="3 4 5 6"). The runs used kwargs.setdefault in capbench.py, which
# worked while the fs tier did not pass the option itself; the committed capbench.py assigns it.
cd /work/exp
for round in ${ROUNDS:-1 2}; do
  for fs in ext4:/tmp tmpfs:/dev/shm; do
    for t in 4 16; do
      for cap in 2 1; do
        [ $((round % 2)) = 0 ] && cap=$((3 - cap))
        name="r$round-${fs%%:*}-t$t-cap$cap"
        echo "$(date -u +%H:%M:%S) $name load $(cut -d' ' -f1-3 /proc/loadavg)"
        CAP=$cap /work/vnat/bin/python capbench.py --root "${fs#*:}" --peer vllm --sizes 256K,2M --total 512M \
          --repeat 3 --blocks-per-job 16 --read-threads $t --write-threads $t --no-fio --quiet \
          --json capv/$name.json > capv/$name.txt 2>&1
      done
    done
  done
done
echo done
