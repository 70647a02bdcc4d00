#!/bin/bash
# usage: ab.sh N label=binary ... ; alternates full `ecstore-bench pool` runs
n=$1; shift
out=ab.out; : > $out
for i in $(seq $n); do
  for lb in "$@"; do
    l=${lb%%=*}; b=${lb#*=}
    load=$(cut -d' ' -f1 /proc/loadavg)
    $b pool > run.txt 2>&1
    r1=$(awk '$1=="1" && NF>=8 {print $4, $6, $7}' run.txt | head -1)
    r2=$(awk '$1=="2" && NF>=8 {print $4, $6, $7}' run.txt | head -1)
    u=$(grep "runs, shortest" run.txt | awk '{print $4}')
    echo "$l run$i load=$load t1[pool glibc ratio]=$r1 t2[pool glibc ratio]=$r2 fifo=$u" | tee -a $out
  done
done
echo "$out"
