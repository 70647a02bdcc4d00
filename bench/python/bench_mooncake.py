#!/usr/bin/env python3
"""Mooncake Store next to ecstore, through the same Mooncake API, one run.

What runs (all on loopback, started here, in temp dirs, on free ports):

- Mooncake (the pip wheel pinned in ec_connector/python/requirements-test.txt):
  ``mooncake_master`` with its HTTP metadata server, one *store process*
  (a MooncakeDistributedStore that mounts a --segment of memory and holds
  every object), and the measuring client in another process with no
  segment of its own, protocol tcp, its buffers registered.  So every put
  and get crosses a TCP socket, as ecstore's do.  Measured twice: with the
  wheel's default TCP transport and with ``MC_TCP_ENABLE_CONNECTION_POOL=1``
  (its pooled TCP connections), since that setting moves its figures.
- ecstore: redis-server + ecstore-server (--pool-size), the measuring
  client is ``ecstore.mooncake.MooncakeDistributedStore`` (the same calls),
  protocol tcp, then protocol shm.

For each object size and batch: ``batch_put_from`` of a batch of fresh keys
from a registered buffer, then ``batch_get_into`` of the same keys into
another registered buffer (checked against the source on the first
repetition), then the keys are removed (Mooncake: force=True, past its read
leases; the master keeps its default 10 s lease, since a batch read that
outlives its lease fails with LEASE_EXPIRED).  --reps repetitions; each cell
reports the median GB/s and the spread (min-max), and ecstore's medians as
ratios against the better of the two Mooncake medians.  Backends alternate per repetition, so a
noisy neighbour hits all of them alike.

  scripts/pyenv.sh  # once
  $(scripts/pyenv.sh)/bin/python bench/python/bench_mooncake.py [--reps 5] [--sizes 64K,1M,4M,16M]
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "ec_connector" / "python"))
sys.path.insert(0, str(REPO / "tests" / "python"))
from conftest import free_port, wait_port  # noqa: E402 - the tests' process helpers
NS = "bench-mc"


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KMG" else s) * mult


def human(n):
    return "%d MiB" % (n >> 20) if n >= 1 << 20 else "%d KiB" % (n >> 10)


# ---- the measuring worker (a child process per backend) --------------------------


def worker(spec):
    """Runs every cell for one backend; prints one JSON line per repetition:
    {"size", "batch", "rep", "put", "get"} in GB/s."""
    import numpy as np

    if spec["kind"] == "mooncake":
        from mooncake.store import MooncakeDistributedStore
    else:
        from ecstore.mooncake import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    rc = s.setup(*spec["args"], **spec.get("kwargs", {}))
    if rc != 0:
        sys.exit("%s: setup returned %d" % (spec["name"], rc))
    maxb = max(spec["sizes"]) * max(spec["batches"])
    # a random 1 MiB + 13 pattern, tiled: cheap to make, and no two objects alike
    src = np.resize(np.random.default_rng(1).integers(0, 255, (1 << 20) + 13, dtype=np.uint8), maxb)
    dst = np.ones(maxb, np.uint8)  # touched: page faults are not what is measured
    for a in (src, dst):
        if s.register_buffer(a.ctypes.data, a.nbytes) != 0:
            sys.exit("%s: register_buffer failed" % spec["name"])
    cell = spec["cell"]
    size, batch, rep = cell
    keys = ["%s-%d-%d-%d-%d" % (spec["name"], size, batch, rep, i) for i in range(batch)]
    ptrs_s = [src.ctypes.data + i * size for i in range(batch)]
    ptrs_d = [dst.ctypes.data + i * size for i in range(batch)]
    sizes = [size] * batch
    # one untimed round trip first: connections and lazy setup out of the way
    warm = [k + "-w" for k in keys[:1]]
    s.batch_put_from(warm, ptrs_s[:1], sizes[:1])
    s.batch_get_into(warm, ptrs_d[:1], sizes[:1])
    s.batch_remove(warm, True)
    t0 = time.perf_counter()
    st = s.batch_put_from(keys, ptrs_s, sizes)
    t1 = time.perf_counter()
    if st != [0] * batch:
        sys.exit("%s: batch_put_from %s" % (spec["name"], sorted(set(st))))
    t2 = time.perf_counter()
    got = s.batch_get_into(keys, ptrs_d, sizes)
    t3 = time.perf_counter()
    if got != sizes:
        sys.exit("%s: batch_get_into %s" % (spec["name"], sorted(set(got))))
    if rep == 0 and not np.array_equal(src[: size * batch], dst[: size * batch]):
        sys.exit("%s: bytes differ after a get" % spec["name"])
    s.batch_remove(keys, True)
    total = size * batch
    print(json.dumps({"size": size, "batch": batch, "rep": rep, "put": total / (t1 - t0) / 1e9,
                      "get": total / (t3 - t2) / 1e9}))
    s.close()


# ---- orchestration --------------------------------------------------------------------


class Procs:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ecs-bench-mc-")
        self.procs = []

    def start(self, argv, name, port, env=None):
        log = open(os.path.join(self.dir, name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, env=env)
        self.procs.append(p)
        if port:
            wait_port(p, port, log.name, timeout=30.0)
        return p

    def stop_all(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


STORE_PROC = """
import sys, time, mooncake.store as ms
s = ms.MooncakeDistributedStore()
rc = s.setup(*%r)
print("store process setup", rc, flush=True)
if rc != 0:
    sys.exit(1)
while True:
    time.sleep(3600)
"""


def mooncake_binary():
    import mooncake

    for cand in (pathlib.Path(sys.executable).parent / "mooncake_master",
                 pathlib.Path(mooncake.__file__).parent / "mooncake_master"):
        if cand.exists():
            return str(cand)
    sys.exit("no mooncake_master next to %s" % sys.executable)


def start_mooncake(procs, segment, env):
    rpc, http, metrics = free_port(), free_port(), free_port()
    procs.start([mooncake_binary(), "--rpc_port=%d" % rpc, "--rpc_address=127.0.0.1",
                 "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
                 "--http_metadata_server_port=%d" % http, "--metrics_port=%d" % metrics,
                 "--enable_metric_reporting=false"], "mooncake-master", rpc, env)
    wait_port(procs.procs[-1], http, os.path.join(procs.dir, "mooncake-master.log"), timeout=30.0)
    meta = "http://127.0.0.1:%d/metadata" % http
    master = "127.0.0.1:%d" % rpc
    store_args = ("127.0.0.1", meta, segment, 16 << 20, "tcp", "", master)
    p = procs.start([sys.executable, "-c", STORE_PROC % (store_args,)], "mooncake-store", None, env)
    time.sleep(3)  # setup, mount, publish
    if p.poll() is not None:
        sys.exit("the Mooncake store process exited: %s" % open(os.path.join(procs.dir, "mooncake-store.log")).read())
    # the measuring client mounts no segment: every object goes to the store process
    return ("127.0.0.1", meta, 0, 16 << 20, "tcp", "", master)


def start_ecstore(procs, build, pool):
    rport, sport = free_port(), free_port()
    redis = shutil.which("redis-server") or "/usr/bin/redis-server"
    procs.start([redis, "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                "redis", rport)
    procs.start([str(build / "bin" / "ecstore-server"), "--listen", "127.0.0.1:%d" % sport, "--redis",
                 "127.0.0.1:%d" % rport, "--pool-size", pool, "--ns", NS, "--log-level", "warn"], "ecstore", sport)
    return rport, sport


def run_cell(spec, env):
    out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], env=env, capture_output=True,
                         text=True, timeout=600)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        sys.exit("%s failed (%s):\n%s\n%s" % (spec["name"], out.returncode, out.stdout[-2000:], out.stderr[-3000:]))
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="64K,1M,4M,16M")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--build", default=str(REPO / "build"), help="the build tree (bin/, lib/)")
    ap.add_argument("--segment", default="1G", help="the Mooncake store process's segment")
    ap.add_argument("--pool", default="1G", help="ecstore-server's --pool-size")
    ap.add_argument("--no-pool-variant", action="store_true", help="skip MC_TCP_ENABLE_CONNECTION_POOL=1")
    ap.add_argument("--out", help="also write the table (markdown) here")
    a = ap.parse_args()
    if a.worker:
        return worker(json.loads(a.worker))
    sizes = [parse_size(x) for x in a.sizes.split(",")]
    batches = [int(x) for x in a.batches.split(",")]
    build = pathlib.Path(a.build).resolve()
    base_env = dict(os.environ)
    base_env["ECSTORE_LIB"] = str(build / "lib" / "libecstore.so")
    base_env["PYTHONPATH"] = str(REPO / "ec_connector" / "python") + os.pathsep + base_env.get("PYTHONPATH", "")
    base_env["GLOG_minloglevel"] = "2"
    procs = Procs()
    results = {}
    try:
        rport, sport = start_ecstore(procs, build, a.pool)
        backends = []
        mc_env = dict(base_env)
        mc_args = start_mooncake(procs, parse_size(a.segment), mc_env)
        backends.append(("mooncake", "mooncake", mc_args, {}, mc_env))
        if not a.no_pool_variant:
            pool_env = dict(base_env, MC_TCP_ENABLE_CONNECTION_POOL="1")
            pool_args = start_mooncake(procs, parse_size(a.segment), pool_env)
            backends.append(("mooncake-pool", "mooncake", pool_args, {}, pool_env))
        for proto in ("tcp", "shm"):
            args = ("127.0.0.1", "redis://127.0.0.1:%d" % rport, 0, 0, proto, "", "127.0.0.1:%d" % sport)
            backends.append(("ecstore-" + proto, "ecstore", args, {"tenant_id": NS}, base_env))
        for size in sizes:
            for batch in batches:
                for rep in range(a.reps):
                    for name, kind, args, kwargs, env in backends:
                        spec = {"name": name, "kind": kind, "args": args, "kwargs": kwargs, "sizes": [size],
                                "batches": [batch], "cell": [size, batch, rep]}
                        r = run_cell(spec, env)
                        results.setdefault((name, size, batch), []).append(r)
                print("done %s x %d" % (human(size), batch), file=sys.stderr, flush=True)
    finally:
        procs.stop_all()
    table = render(results, sizes, batches, [b[0] for b in backends], a.reps)
    print(table)
    if a.out:
        with open(a.out, "w") as f:
            f.write(table)


def render(results, sizes, batches, names, reps):
    def med(name, size, batch, op):
        return statistics.median(r[op] for r in results[(name, size, batch)])

    def spread(name, size, batch, op):
        v = [r[op] for r in results[(name, size, batch)]]
        return "%.2f–%.2f" % (min(v), max(v))

    out = []
    mcs = [n for n in names if n.startswith("mooncake")]
    for op in ("get", "put"):
        out.append("\n%s (`batch_%s`), GB/s: median of %d (min–max); × = ecstore's median / the better "
                   "Mooncake median of the cell\n" % (op, "get_into" if op == "get" else "put_from", reps))
        hdr = ["size × batch"]
        for n in names:
            hdr.append(n)
            if not n.startswith("mooncake"):
                hdr.append("×")
        out.append("| " + " | ".join(hdr) + " |")
        out.append("|" + "---|" * len(hdr))
        for size in sizes:
            for batch in batches:
                base = max(med(n, size, batch, op) for n in mcs)
                row = ["%s × %d" % (human(size), batch)]
                for n in names:
                    row.append("%.2f (%s)" % (med(n, size, batch, op), spread(n, size, batch, op)))
                    if not n.startswith("mooncake"):
                        row.append("%.2f" % (med(n, size, batch, op) / base))
                out.append("| " + " | ".join(row) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
