#!/usr/bin/env python3
"""Pair analysis of ecstore-bench net CSVs written by pairs.sh.
usage: ana.py DIR {i12|i13}"""
import csv, glob, os, re, statistics, sys

def q(xs):
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0], xs[0], xs[0], xs[0], xs[0]
    qs = statistics.quantiles(xs, n=4, method='inclusive')
    return xs[0], qs[0], statistics.median(xs), qs[2], xs[-1]

def fmt(xs, pct=False, d=2):
    mn, p25, med, p75, mx = q(xs)
    if pct:
        f = lambda v: f"{(v-1)*100:+.1f}%"
        return f"{f(med)} [{f(p25)}, {f(p75)}] ({f(mn)} .. {f(mx)})"
    return f"{med:.{d}f} [{p25:.{d}f}-{p75:.{d}f}] ({mn:.{d}f}-{mx:.{d}f})"

def load(d):
    runs = {}  # (ver, rep) -> {(op,path,size,batch,conns): row}
    for f in glob.glob(os.path.join(d, '*-*.csv')):
        m = re.match(r'(old|new)-(\d+)\.csv', os.path.basename(f))
        rows = {}
        with open(f) as fh:
            for r in csv.DictReader(fh):
                k = (r['op'], r['path'], int(r['size']), int(r['batch']), int(r['conns']))
                rows[k] = {x: float(r[x]) for x in ('gbps', 'mops', 'p50_us', 'p99_us')}
        runs[(m.group(1), int(m.group(2)))] = rows
    loads = {}
    for line in open(os.path.join(d, 'log')):
        p = line.split()
        la = re.findall(r'\[([\d. ]+)\]', line)
        loads[(p[1], int(p[0]))] = (la[0].split()[0], la[1].split()[0], p[2], p[3], p[4])
    return runs, loads

NC = int(os.environ.get("CONNS", "1"))

def main():
    d, kind = sys.argv[1], sys.argv[2]
    runs, loads = load(d)
    reps = sorted({r for (_, r) in runs})
    print(f"reps: {len(reps)}; runs per rep (time, load 1-min before->after, rc):")
    for r in reps:
        print("  rep %d: " % r + "; ".join(
            f"{v} {loads[(v,r)][2]} load {loads[(v,r)][0]}->{loads[(v,r)][1]} {loads[(v,r)][4]}"
            for v in (('old', 'new') if r % 2 else ('new', 'old')) if (v, r) in loads))
    if kind == 'i12':
        size, b = 65536, 32
        cells = [('put', 'ecstore-tcp', 'put', 'redis'), ('put', 'ecstore-shm', 'put', 'redis'),
                 ('get', 'ecstore-tcp', 'get', 'redis'), ('get', 'ecstore-shm-copy', 'get', 'redis'),
                 ('get', 'ecstore-shm-view', 'get', 'redis')]
        print("\n| op | path | build | objects/s (k) median [p25-p75] (min-max) | vs Redis same run: median [p25-p75] (min-max) |")
        print("|---|---|---|---|---|")
        for op, path, rop, rpath in cells:
            for v in ('old', 'new'):
                ob, ra = [], []
                for r in reps:
                    rows = runs.get((v, r))
                    if not rows: continue
                    e = rows.get((op, path, size, b, NC)); red = rows.get((rop, rpath, size, b, NC))
                    if e is None or red is None: continue
                    ob.append(e['mops'] * 1e3); ra.append(e['mops'] / red['mops'])
                if ob:
                    print(f"| {op} | {path} | {v} | {fmt(ob, d=0)} | {fmt(ra)}x |")
        for op, path in [('put', 'redis'), ('get', 'redis'), ('get', 'raw-tcp'), ('get', 'memcpy')]:
            for v in ('old', 'new'):
                ob = [runs[(v, r)][(op, path, size, b, NC)]['mops'] * 1e3 for r in reps
                      if (v, r) in runs and (op, path, size, b, NC) in runs[(v, r)]]
                if ob:
                    print(f"| {op} | {path} (baseline) | {v} | {fmt(ob, d=0)} | - |")
        print("\nnew/old pair ratios (objects/s), per rep pair; median [p25, p75] (min .. max):")
        for op, path, _, _ in cells + [('put', 'redis', 0, 0), ('get', 'redis', 0, 0)]:
            pr = [runs[('new', r)][(op, path, size, b, NC)]['mops'] / runs[('old', r)][(op, path, size, b, NC)]['mops']
                  for r in reps if ('new', r) in runs and ('old', r) in runs]
            print(f"  {op} {path}: {fmt(pr, pct=True)}   n={len(pr)}")
    else:
        keys = sorted({k for rows in runs.values() for k in rows},
                      key=lambda k: (k[1], k[0], k[2], k[3], k[4]))
        base = {'ecstore-tcp': 'raw-tcp', 'ecstore-shm-copy': 'memcpy', 'ecstore-shm': 'memcpy',
                'ecstore-shm-view': 'memcpy'}
        print("\n| op | path | size | batch | conns | old GB/s med | new GB/s med | new/old pair ratio: median [p25, p75] (min .. max) | n | normalised by the run's own baseline: median [p25, p75] |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for k in keys:
            op, path, size, b, c = k
            pr, nr, o, n = [], [], [], []
            for r in reps:
                if ('new', r) not in runs or ('old', r) not in runs: continue
                a, bb = runs[('old', r)].get(k), runs[('new', r)].get(k)
                if not a or not bb or a['gbps'] <= 0: continue
                o.append(a['gbps']); n.append(bb['gbps'])
                pr.append(bb['gbps'] / a['gbps'])
                bk = (op if path != 'ecstore-shm' else 'get', base.get(path, ''), size, b, c)
                if path in base:
                    ba, bn = runs[('old', r)].get(bk), runs[('new', r)].get(bk)
                    if ba and bn:
                        nr.append((bb['gbps'] / bn['gbps']) / (a['gbps'] / ba['gbps']))
            if not pr: continue
            mn, p25, med, p75, mx = q(pr)
            sz = f"{size >> 20}M" if size >= 1 << 20 else f"{size >> 10}K"
            norm = '-'
            if nr:
                _, n25, nmed, n75, _ = q(nr)
                norm = f"{(nmed-1)*100:+.1f}% [{(n25-1)*100:+.1f}%, {(n75-1)*100:+.1f}%]"
            print(f"| {op} | {path} | {sz} | {b} | {c} | {statistics.median(o):.2f} | {statistics.median(n):.2f} | "
                  f"{fmt(pr, pct=True)} | {len(pr)} | {norm} |")

main()
