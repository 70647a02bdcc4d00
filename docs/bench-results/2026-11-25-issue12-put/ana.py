import csv,glob,statistics as S,re,sys
rows={}
for f in sorted(glob.glob('*.csv')):
    v,i=re.match(r'(\w+)-(\d+)\.csv',f).groups()
    d={(r['op'],r['path']):float(r['mops'])*1000 for r in csv.DictReader(open(f))}
    rows.setdefault(v,[]).append((int(i),d))
def q(x):
    x=sorted(x); n=len(x)
    if not n: return "-"
    return "%.2f [%.2f-%.2f] (%.2f-%.2f)"%(S.median(x),x[n//4],x[(3*n-1)//4],x[0],x[-1])
for v in sys.argv[1:]:
    L=[d for _,d in rows.get(v,[]) if ('put','ecstore-tcp') in d and ('put','redis') in d]
    put=[d[('put','ecstore-tcp')] for d in L]; rset=[d[('put','redis')] for d in L]
    get=[d[('get','ecstore-tcp')] for d in L]; rget=[d[('get','redis')] for d in L]
    print("| %s | %d | %s | %s | %s | %s |"%(v,len(L),q(put),q([a/b for a,b in zip(put,rset)]),q(get),q([a/b for a,b in zip(get,rget)])))
