# Plots of `ecstore-bench compare` from its CSV files (scripts/bench-compare.sh
# runs it):  gnuplot -e "dir='OUT'; img='IMGDIR'" bench/plot.gp
#   IMGDIR/throughput-get.png, throughput-put.png   GB/s against object size, per path
#   IMGDIR/scaling-conns.png                        get GB/s against connections
#   IMGDIR/scaling-pool.png                         latency and eviction cost against pool size
#   IMGDIR/scaling-objects.png                      latency against stored objects
# Rows are picked with awk (a gnuplot filter returning NaN would break the lines).
if (!exists("dir")) dir = "bench-compare"
if (!exists("img")) img = dir
machine = system(sprintf("sed -n '1s/^# ecstore-bench compare; machine: //p' '%s/compare.txt'", dir))

set terminal pngcairo size 1500,600 font "sans,11" noenhanced
set datafile separator ","
set grid
set key outside right top
set logscale xy 2
set xlabel "object size"
set xtics ("64K" 64, "256K" 256, "1M" 1024, "4M" 4096, "16M" 16384)
set xrange [48:22000]
set ylabel "GB/s (median; 1e9 payload bytes/s)"
set format y "%g"

csv = dir . "/compare.csv"
# op, batch, path -> "size_KiB gbps min max" lines
rows(op, b, p) = sprintf("< awk -F, '$1==\"%s\" && $3==%d && $4==1 && $5==\"%s\" {print $2/1024 \",\" $6}' '%s'", op, b, p, csv)

gets = "raw-tcp ecstore-tcp ecstore-rdma redis memcached memcpy ecstore-shm-copy file-tmpfs file-disk"
puts = "raw-tcp ecstore-tcp ecstore-rdma redis memcached memcpy ecstore-shm file-tmpfs file-disk file-disk-fsync"
# the same colour for a path in every plot; dashed for baselines and peers
colour(p) = p eq "raw-tcp" ? "black" : p eq "memcpy" ? "gray40" : p eq "ecstore-tcp" ? "#d62728" : \
            p eq "ecstore-shm-copy" || p eq "ecstore-shm" ? "#ff7f0e" : p eq "ecstore-rdma" ? "#8c564b" : \
            p eq "redis" ? "#1f77b4" : p eq "memcached" ? "#17becf" : p eq "file-tmpfs" ? "#2ca02c" : \
            p eq "file-disk" ? "#9467bd" : "#e377c2"
dash(p) = (p eq "raw-tcp" || p eq "memcpy") ? 2 : (p[1:7] eq "ecstore") ? 1 : 3
has(op, p) = int(system(sprintf("awk -F, '$1==\"%s\" && $5==\"%s\"' '%s' | wc -l", op, p, csv))) > 0
batches = system(sprintf("awk -F, 'NR>1 && $4==1 {print $3}' '%s' | sort -nu | tr '\\n' ' '", csv))
nb = words(batches)

do for [op in "get put"] {
  all = op eq "get" ? gets : puts
  paths = ""
  do for [p in all] { if (has(op, p)) { paths = paths . " " . p } }
  set output sprintf("%s/throughput-%s.png", img, op)
  set multiplot layout 1,nb margins 0.05,0.84,0.12,0.88 spacing 0.05,0.1 title sprintf("ecstore-bench compare: %s throughput by object size, 1 connection -- %s", op, machine)
  do for [b in batches] {
    set title sprintf("batches of %s", b)
    # one key for the panels, right of them (room kept by the layout's margins)
    if (b eq word(batches, nb)) { set key at screen 0.85, 0.86 left top vertical Left reverse } else { unset key }
    if (b eq word(batches, 1)) { set ylabel "GB/s (median; 1e9 payload bytes/s)" } else { unset ylabel }
    plot for [p in paths] rows(op, int(b), p) \
         using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt dash(p) lc rgb colour(p) title p
  }
  unset multiplot
}

# connections
set xrange [*:*]
set terminal pngcairo size 1000,600 font "sans,11" noenhanced
set output img . "/scaling-conns.png"
set title "get GB/s against client connections (1 MiB objects, batches of 8)\n" . machine
set key below horizontal
set logscale x 2
set xtics auto
unset logscale y
set yrange [0:*]
set xlabel "client connections"
set ylabel "GB/s (median)"
cc = dir . "/scaling-conns.csv"
crow(p) = sprintf("< awk -F, '$2==\"%s\" {print $1 \",\" $5}' '%s'", p, cc)
plot for [p in "raw-tcp ecstore-tcp redis ecstore-shm-copy memcpy"] crow(p) using 1:2 with linespoints lw 2 pt 7 \
     dt dash(p) lc rgb colour(p) title p

# pool size
set output img . "/scaling-pool.png"
set title "latency and eviction cost against pool size (tcp, single-object calls)\n" . machine
set xlabel "pool size (GiB)"
set ylabel "latency p50 (us)"
set y2label "eviction cost (us per evicted object)"
set logscale y 2
set yrange [*:*]
set y2range [0:*]
set ytics nomirror
set y2tics
pc = dir . "/scaling-pool.csv"
plot pc using 1:3 every ::1 with linespoints lw 2 pt 7 title "get 64K p50", \
     pc using 1:8 every ::1 with linespoints lw 2 pt 5 title "put 64K (evicting) p50", \
     pc using 1:5 every ::1 with linespoints lw 2 pt 9 title "put 4M (room) p50", \
     pc using 1:6 every ::1 with linespoints lw 2 pt 11 title "put 4M (evicting) p50", \
     pc using 1:11 every ::1 axes x1y2 with linespoints lw 2 dt 2 pt 13 title "eviction, us/object (right)"

# object count
unset y2label
unset y2tics
set ytics mirror
set output img . "/scaling-objects.png"
set title "latency against stored objects (4 KiB objects, tcp, single-object calls)\n" . machine
set logscale x 10
set xrange [500:2e6]
set xlabel "stored objects"
set ylabel "latency (us)"
oc = dir . "/scaling-objects.csv"
plot oc using 1:2 every ::1 with linespoints lw 2 pt 7 lc rgb "#d62728" title "get p50", \
     oc using 1:3 every ::1 with linespoints lw 2 pt 7 dt 2 lc rgb "#d62728" title "get p99", \
     oc using 1:4 every ::1 with linespoints lw 2 pt 5 lc rgb "#1f77b4" title "put p50", \
     oc using 1:5 every ::1 with linespoints lw 2 pt 5 dt 2 lc rgb "#1f77b4" title "put p99"
