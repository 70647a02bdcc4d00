import sys, statistics
import os
sys.argv = [sys.argv[0], sys.argv[1], 'x']
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ana.py')).read().split('\ndef main')[0])
runs, loads = load(sys.argv[1])
reps = sorted({r for (_, r) in runs})
def pr(k):
    out = []
    for r in reps:
        a, b = runs.get(('old', r), {}).get(k), runs.get(('new', r), {}).get(k)
        if a and b and a['gbps'] > 0: out.append(b['gbps'] / a['gbps'])
    return out
def med(k, v):
    return statistics.median([runs[(v, r)][k]['gbps'] for r in reps if (v, r) in runs and k in runs[(v, r)]])
def pc(x): return f"{(x-1)*100:+.0f}%"
print("| path | op | size | batch | old GB/s | new GB/s | new/old: median [p25, p75] (min .. max) | baseline in the same runs (should be 1.00): median [p25, p75] |")
print("|---|---|---|---|---|---|---|---|")
for path, op, bpath in [('ecstore-tcp', 'get', 'raw-tcp'), ('ecstore-tcp', 'put', None), ('ecstore-shm-copy', 'get', 'memcpy'),
                         ('ecstore-shm', 'put', 'memcpy'), ('ecstore-shm-view', 'get', 'memcpy')]:
    for size in (1 << 20, 4 << 20, 16 << 20):
        for b in (1, 8):
            k = (op, path, size, b, 1)
            x = pr(k)
            if not x: continue
            mn, p25, m, p75, mx = q(x)
            ctl = '-'
            if bpath:
                c = pr(('get', bpath, size, b, 1))
                _, c25, cm, c75, _ = q(c)
                ctl = f"{bpath} {pc(cm)} [{pc(c25)}, {pc(c75)}]"
            print(f"| {path} | {op} | {size>>20}M | {b} | {med(k,'old'):.2f} | {med(k,'new'):.2f} | **{pc(m)}** [{pc(p25)}, {pc(p75)}] ({pc(mn)} .. {pc(mx)}) | {ctl} |")
