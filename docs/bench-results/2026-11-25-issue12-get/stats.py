import statistics as st, sys
rows=[l.split() for l in open(sys.argv[1])]
def parse(r):
    return dict(path=r[0], load=float(r[1][5:]), ecs=float(r[7]), p50=float(r[8]), p99=float(r[9]), raw=float(r[11]), rds=float(r[14]), ratio=float(r[15][:-1]))
d=[parse(r) for r in rows]
old=[x for x in d if x['path']=='/tmp/h2-old/bin']; new=[x for x in d if x['path']!='/tmp/h2-old/bin']
for name,s in (('old',old),('new',new)):
    for k in ['ratio','ecs','rds','raw','p50','p99']:
        v=sorted(x[k] for x in s)
        q=st.quantiles(v,n=4)
        print(name, k, 'n=%d median=%.2f p25=%.2f p75=%.2f min=%.2f max=%.2f'%(len(v),st.median(v),q[0],q[2],v[0],v[-1]), ' all:', ' '.join('%g'%x for x in v))
    print(name,'load', min(x['load'] for x in s), max(x['load'] for x in s), ' >=3x:', sum(1 for x in s if x['ratio']>=3.0), 'of', len(s))
pr=sorted(n['ecs']/o['ecs'] for o,n in zip(old,new)); print('pair new/old ecs GB/s', ' '.join('%.2f'%x for x in pr), 'median %.2f'%st.median(pr))
