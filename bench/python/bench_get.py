#!/usr/bin/python3
"""Python batch_get_into throughput vs the C client and vs redis-py, one run.

For every (size, batch) cell, on one ecstore-server and one redis-server
that this script starts (or that --server/--redis name):

- C:        ``ecstore-bench net --server ... --conns 1 --no-redis --reps 1``
            for the one cell (its "ecstore-tcp" get row), reading objects
            under keys bench-<size>-0-<i>, 0x3c bytes;
- Python:   ``Store.batch_get_into`` of the very same keys, sizes and bytes
            (re-put after each C run, which removes them), into preallocated
            numpy buffers, 1 connection, the same timing rule: repeat calls
            for --seconds, GB/s = bytes / elapsed; C and Python repetitions
            alternate (this machine may be shared) and each reports the
            median of --reps;
- redis-py: GET of the same blobs from Redis, pipelined per batch (as the
            C bench's Redis baseline), 1 connection, same timing rule.

Prints GB/s (medians) and the ratios Python/C (the median of the paired
per-repetition ratios; target >= 95% for large objects) and Python/redis-py.  Both ecstore clients use the TCP transport (the C bench's
TCP table) and verify checksums (the default of both).

  /usr/bin/python3 bench/python/bench_get.py                 # build/ of this tree
  /usr/bin/python3 bench/python/bench_get.py --build build-py --sizes 1M,4M,16M
"""

import argparse
import csv
import os
import pathlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "ec_connector" / "python"))

NS = "test"  # the namespace ecstore-bench net uses with --server
SETTLE_S = 0.3  # quiet time before each timed repetition, C and Python alike


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KMG" else s) * mult


def human(n):
    return "%dM" % (n >> 20) if n >= 1 << 20 and n % (1 << 20) == 0 else "%dK" % (n >> 10)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(proc, port, what):
    end = time.monotonic() + 10
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit("%s exited with %s" % (what, proc.returncode))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    sys.exit("%s not listening on %d" % (what, port))


def start(argv, port, what, tmp):
    log = open(os.path.join(tmp, what + ".log"), "w")
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    wait_port(p, port, what)
    return p


def stop(p):
    if p and p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def timed(fn, nbytes, seconds):
    """GB/s (1e9 bytes) of fn() repeated for seconds, as ecstore-bench times
    a repetition: no warm-up call (its destination pages are touched
    beforehand, as ecstore-bench memsets its buffers)."""
    n = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while True:
        fn()
        n += 1
        t = time.perf_counter()
        if t >= end:
            break
    return n * nbytes / (t - t0) / 1e9


# Python transport -> (ecstore-bench --paths value, its CSV path of a get
# into caller buffers).  "auto" is for an ecstore-bench without --paths,
# whose one table used the client's default transport.
PATHS = {"tcp": ("tcp", "ecstore-tcp"), "shm": ("shm", "ecstore-shm-copy"), "auto": (None, "ecstore-tcp")}


def c_bench_argv(bench, server, transport, size, batch, seconds, out_csv):
    argv = [bench, "net", "--server", server, "--no-redis", "--conns", "1", "--reps", "1",
            "--seconds", str(seconds), "--sizes", human(size), "--batches", str(batch), "--csv", out_csv]
    if PATHS[transport][0]:
        argv += ["--paths", PATHS[transport][0]]
    return argv


def run_c_bench(argv, transport, size, batch):
    """One repetition of ecstore-bench net's cell: its get GB/s."""
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("ecstore-bench failed (%d):\n%s%s" % (r.returncode, r.stdout, r.stderr))
    want = ("get", PATHS[transport][1], "1", size, batch)
    with open(argv[argv.index("--csv") + 1]) as f:
        for row in csv.DictReader(f):
            if (row["op"], row["path"], row["conns"], int(row["size"]), int(row["batch"])) == want:
                return float(row["gbps"])
    sys.exit("ecstore-bench printed no %s row" % (want,))


def measure_cell(store, rc, bench, server, transport, size, b, args, tmp):
    """(C, Python, redis-py) GB/s medians for one cell."""
    import numpy as np

    src = np.full(size, 0x3C, dtype=np.uint8)
    keys = ["bench-%d-0-%d" % (size, i) for i in range(b)]
    dst = [np.empty(size, dtype=np.uint8) for _ in range(b)]
    for d in dst:
        d.fill(0)  # fault the pages in before timing, as ecstore-bench's memset
    ptrs = [d.ctypes.data for d in dst]
    szs = [size] * b

    def py_get():
        r = store.batch_get_into(keys, ptrs, szs)
        if r[0] != size:
            raise RuntimeError("get: %s" % r)

    # C and Python alternate, repetition by repetition, so that load from
    # other processes on this machine hits both alike.
    argv = c_bench_argv(bench, server, transport, size, b, args.seconds, os.path.join(tmp, "c.csv"))
    c_runs, py_runs = [], []
    for _ in range(args.reps):
        time.sleep(SETTLE_S)
        c_runs.append(run_c_bench(argv, transport, size, b))
        # the C run removed its objects: put the same bytes back under the same keys
        st = store.batch_put_from(keys, [src.ctypes.data] * b, szs)
        if any(st):
            sys.exit("put failed: %s" % st)
        # ecstore-bench's put cells filled the pool: let the server's
        # background eviction and Redis writes finish before timing
        time.sleep(SETTLE_S)
        py_runs.append(timed(py_get, size * b, args.seconds))
    assert all((d == 0x3C).all() for d in dst)
    store.batch_remove(keys)

    blob = src.tobytes()  # redis-py takes bytes
    with rc.pipeline(transaction=False) as p:
        for k in keys:
            p.set(k, blob)
        p.execute()
    pipe = rc.pipeline(transaction=False)

    def rpy_get():
        for k in keys:
            pipe.get(k)
        out = pipe.execute()
        if len(out[0]) != size:
            raise RuntimeError("redis get")

    rpy = statistics.median(timed(rpy_get, size * b, args.seconds) for _ in range(args.reps))
    rc.delete(*keys)
    # Py/C: the median of the paired ratios (each Python repetition against
    # the C one just before it), steadier than a ratio of medians when other
    # processes load the machine.
    ratio = statistics.median(p / c for p, c in zip(py_runs, c_runs))
    return statistics.median(c_runs), statistics.median(py_runs), ratio, rpy


def main():
    # SIGTERM (a timeout, kill) must still stop the servers below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=str(REPO / "build"), help="CMake build dir (bin/, lib/)")
    ap.add_argument("--sizes", default="64K,1M,4M,16M")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--transports", default=None,
                    help="tcp,shm (default: both when ecstore-bench has --paths, else auto)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--pool-size", default="1G")
    args = ap.parse_args()
    build = pathlib.Path(args.build).resolve()
    os.environ.setdefault("ECSTORE_LIB", str(build / "lib" / "libecstore.so"))
    import redis

    import ecstore

    bench = str(build / "bin" / "ecstore-bench")
    has_paths = "--paths" in subprocess.run([bench, "net", "--help"], capture_output=True, text=True).stdout
    transports = (args.transports or ("tcp,shm" if has_paths else "auto")).split(",")
    if not has_paths and transports != ["auto"]:
        sys.exit("this ecstore-bench has no --paths: only --transports auto compares like with like")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    tmp = tempfile.mkdtemp(prefix="ecs-bench-py-")
    rp = sp = None
    try:
        rport, sport = free_port(), free_port()
        rp = start([shutil.which("redis-server") or "/usr/bin/redis-server", "--port", str(rport), "--bind",
                    "127.0.0.1", "--save", "", "--appendonly", "no"], rport, "redis", tmp)
        sp = start([str(build / "bin" / "ecstore-server"), "--listen", "127.0.0.1:%d" % sport, "--redis",
                    "127.0.0.1:%d" % rport, "--ns", NS, "--pool-size", args.pool_size, "--log-level", "warn"],
                   sport, "ecstore-server", tmp)
        server = "127.0.0.1:%d" % sport
        rc = redis.Redis(host="127.0.0.1", port=rport)
        print("# GET into caller buffers, 1 connection, GB/s (1e9 B/s), median of %d x %.1fs; %s"
              % (args.reps, args.seconds, ecstore.lib_path()))
        print("# C: " + " ".join(c_bench_argv(bench, server, transports[0], sizes[0], batches[0], args.seconds,
                                              "c.csv")) + "  (one per cell and repetition)")
        print("%-5s %6s %5s | %8s %8s %7s | %9s %8s" % ("path", "size", "batch", "C", "Python", "Py/C",
                                                       "redis-py", "Py/rpy"))
        for transport in transports:
            with ecstore.connect(servers=server, namespace=NS, transport=transport, timeout_ms=60000) as store:
                used = store.transport() or transport
                for size in sizes:
                    for b in batches:
                        c, py, ratio, rpy = measure_cell(store, rc, bench, server, transport, size, b, args, tmp)
                        print("%-5s %6s %5d | %8.2f %8.2f %6.0f%% | %9.2f %7.2fx" % (
                            used, human(size), b, c, py, 100 * ratio, rpy, py / rpy), flush=True)
    finally:
        stop(sp)
        stop(rp)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
