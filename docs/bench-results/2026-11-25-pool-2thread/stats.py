import re,sys,statistics as st
rows=[]
for f in sys.argv[1:]:
    for line in open(f):
        m=re.match(r'(\w+) run(\d+) load=([\d.]+) t1\[pool glibc ratio\]=([\d.]+) ([\d.]+) ([\d.]+)x t2\[pool glibc ratio\]=([\d.]+) ([\d.]+) ([\d.]+)x fifo=([\d.]+)%',line)
        if m: rows.append((f,m.group(1),float(m.group(3)),*map(float,m.groups()[3:9]),float(m.group(10))))
def summ(v): v=sorted(v); return "median %.2f, range %.2f-%.2f" % (st.median(v), v[0], v[-1])
for f in sys.argv[1:]+['all']:
    for who in ('old','new'):
        R=[r for r in rows if r[1]==who and (f=='all' or r[0]==f)]
        if not R: continue
        print(f, who, "n=%d load %.2f-%.2f" % (len(R), min(r[2] for r in R), max(r[2] for r in R)))
        print("   1t pool Mop/s", summ([r[3] for r in R]), "| glibc", summ([r[4] for r in R]), "| ratio", summ([r[5] for r in R]))
        print("   2t pool Mop/s", summ([r[6] for r in R]), "| glibc", summ([r[7] for r in R]), "| ratio", summ([r[8] for r in R]))
        print("   fifo util", sorted(set(r[9] for r in R)))
