#!/usr/bin/env python3
# The eviction-delete script (data/del-script-v1.lua, the server's, from store/redis/meta.c) against
# cut-down variants, on 60,000 records of the server's shape in a fresh redis-server:
# Redis CPU per deleted key from INFO commandstats.  Run from this folder.
import re
import subprocess, time, socket, sys, os
def fp():
    s=socket.socket(); s.bind(("127.0.0.1",0)); p=s.getsockname()[1]; s.close(); return p
port=fp()
p=subprocess.Popen(["redis-server","--port",str(port),"--save","","--appendonly","no","--dir","/tmp"],stdout=subprocess.DEVNULL)
time.sleep(0.4)

class R:
    def __init__(self, port):
        self.s=socket.create_connection(("127.0.0.1",port)); self.f=self.s.makefile('rb')
    def enc(self,*a):
        out=[b"*%d\r\n"%len(a)]
        for x in a:
            x=x if isinstance(x,bytes) else str(x).encode()
            out.append(b"$%d\r\n%s\r\n"%(len(x),x))
        return b"".join(out)
    def rd(self):
        l=self.f.readline()
        t=l[:1]; v=l[1:-2]
        if t==b'+': return v.decode()
        if t==b'-': raise Exception(v.decode())
        if t==b':': return int(v)
        if t==b'$':
            n=int(v)
            if n<0: return None
            d=self.f.read(n+2)[:-2]; return d.decode()
        if t==b'*':
            n=int(v); return [self.rd() for _ in range(n)]
    def cmd(self,*a):
        self.s.sendall(self.enc(*a)); return self.rd()
    def pipe(self,cmds):
        self.s.sendall(b"".join(self.enc(*c) for c in cmds)); return [self.rd() for _ in cmds]
r=R(port)

V1 = open('data/del-script-v1.lua').read()
V3 = """local n, me = 0, 'h:' .. ARGV[1]
for _, k in ipairs(KEYS) do
  local had = redis.pcall('HDEL', k, me)
  if type(had) == 'number' then
    local s = redis.call('HSCAN', k, 0, 'MATCH', 'h:*', 'COUNT', 1000)
    local other = #s[2] > 0
    if not other and s[1] ~= '0' then other = true end
    if not other and (had == 1 or redis.call('HGET', k, 'node') == ARGV[1]) then
      n = n + redis.call('DEL', k)
    end
  end
end
return n
"""
def fill(N):
    cmds=[]
    for i in range(N):
        k=f"ecs:{{test}}:obj:pl-{i}-abcdefgh"
        cmds.append(("HSET",k,"node","n1","epoch","12345","off",str(i*65536),"len","65536","raw_len","65536","dtype","2","shape","65536","csum","0123456789abcdef","codec","0","t","1732512345678","h:n1","12345"))
        if len(cmds)==1000: r.pipe(cmds); cmds=[]
    if cmds: r.pipe(cmds)
N=60000
V0 = """local n, me = 0, 'h:' .. ARGV[1]
for _, k in ipairs(KEYS) do
  n = n + redis.call('DEL', k)
end
return n
"""
V4 = """local n, me = 0, 'h:' .. ARGV[1]
for _, k in ipairs(KEYS) do
  local had = redis.pcall('HDEL', k, me)
  if type(had) == 'number' then
      n = n + redis.call('DEL', k)
  end
end
return n
"""
for name,src in (("v0-del-only",V0),("v4-hdel+del",V4),("v1",V1)):
    r.cmd('FLUSHALL'); fill(N)
    sha=r.cmd('SCRIPT','LOAD',src)
    r.cmd('CONFIG','RESETSTAT')
    keys=[f"ecs:{{test}}:obj:pl-{i}-abcdefgh" for i in range(N)]
    t0=time.time()
    tot=0
    for c in range(0,N,34):
        tot+=r.cmd('EVALSHA', sha, len(keys[c:c+34]), *keys[c:c+34], "n1")
    dt=time.time()-t0
    info=r.cmd('INFO','commandstats')
    m=re.search(r'cmdstat_evalsha:calls=(\d+),usec=(\d+)',info)
    print(name, "deleted", tot, "usec/key %.2f"%(int(m.group(2))/N), "wall %.2fs"%dt)
p.terminate()
