import csv, glob, os, re, statistics, sys
d = sys.argv[1]
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ana.py')).read().split('\ndef load')[0])
data = {}
for f in glob.glob(os.path.join(d, '*-*.csv')):
    m = re.match(r'(redis|none)-(\d+)\.csv', os.path.basename(f))
    rows = {(r['op'], r['path']): float(r['mops']) * 1e3 for r in csv.DictReader(open(f))}
    data[(m.group(1), int(m.group(2)))] = rows
reps = sorted({r for (_, r) in data})
print(f"{len(reps)} pairs")
print("| server | path | put objects/s (k): median [p25-p75] (min-max) | vs Redis SET same run |")
print("|---|---|---|---|")
for v in ('redis', 'none'):
    for op, path in (('put', 'ecstore-tcp'), ('put', 'ecstore-shm'), ('put', 'redis'), ('get', 'ecstore-tcp'), ('get', 'redis')):
        xs = [data[(v, r)][(op, path)] for r in reps if (v, r) in data]
        rs = [data[(v, r)][(op, path)] / data[(v, r)][(op, 'redis')] for r in reps if (v, r) in data]
        print(f"| {v} | {op} {path} | {fmt(xs, d=1)} | {fmt(rs)}x |")
for op, path in (('put', 'ecstore-tcp'), ('put', 'ecstore-shm')):
    pr = [data[('none', r)][(op, path)] / data[('redis', r)][(op, path)] for r in reps if ('none', r) in data and ('redis', r) in data]
    print(f"none/redis pair ratio {op} {path}: {fmt(pr, pct=True)}")
