import sys, statistics, math
import os
sys.argv = [sys.argv[0], sys.argv[1], 'x']
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ana.py')).read().split('\ndef main')[0])
runs, loads = load(sys.argv[1])
reps = sorted({r for (_, r) in runs})
keys = sorted({k for rows in runs.values() for k in rows})
for base in ('raw-tcp', 'memcpy'):
    sds, iqrs = [], []
    for k in keys:
        if k[1] != base: continue
        lr = [math.log(runs[('new', r)][k]['gbps'] / runs[('old', r)][k]['gbps']) for r in reps]
        sds.append(statistics.stdev(lr))
        _, a, _, b, _ = q([math.exp(x) for x in lr]); iqrs.append((b - a) * 100)
    s = statistics.median(sds)
    n = (1.96 * 1.2533 * s / 0.015) ** 2
    print(f"{base}: per-cell sd of log pair ratio: median {s:.3f} (range {min(sds):.3f}-{max(sds):.3f}); IQR width median {statistics.median(iqrs):.0f} pts (range {min(iqrs):.0f}-{max(iqrs):.0f}); pairs for a +-1.5% 95% CI on the median: ~{n:.0f}")
