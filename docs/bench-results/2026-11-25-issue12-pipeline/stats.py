import re,sys,statistics as st
def q(v,p):
    v=sorted(v); k=(len(v)-1)*p; f=int(k); c=min(f+1,len(v)-1); return v[f]+(v[c]-v[f])*(k-f)
def summ(v): return "%.2f [%.2f-%.2f] (%.2f-%.2f)"%(st.median(v),q(v,.25),q(v,.75),min(v),max(v))
for fn in sys.argv[1:]:
    rows={}
    for line in open(fn):
        m=re.match(r'(?:\d+ )?(\w+) (?:\d+ )?.*?load=\[?([\d.]+)\]?.*put\s+64K\s+32\s+1 \|\s+([\d.]+)\s+(\d+)\s+(\d+) \|.*\|\s+([\d.]+)\s+([\d.]+)x',line)
        if not m: continue
        w=m.group(1); rows.setdefault(w,[]).append((float(m.group(2)),float(m.group(3)),float(m.group(7)),float(m.group(6)),int(m.group(4))))
    print(fn)
    for w,r in rows.items():
        print("  %-5s n=%d  put GB/s %s | vs Redis SET %s | Redis SET GB/s %s | p50 us %s | load %.2f-%.2f"%(w,len(r),summ([x[1] for x in r]),summ([x[2] for x in r]),summ([x[3] for x in r]),summ([x[4] for x in r]),min(x[0] for x in r),max(x[0] for x in r)))
