#!/usr/bin/env python3
"""Where the consumer's load step goes: bench_vllm.py (ecstore-shm only),
with timers around the pieces of the step that hands vLLM views, or with
cProfile over those steps.

A load step is a worker step whose metadata names items to load.  Per
load step it records the whole connector part of the step (from
bind_connector_metadata's start to clear_connector_metadata's end) and the
pieces inside it; it prints each piece's median and its share of the
median step.  The timers cost a little themselves (about a microsecond a
call; wrap_view is called once per item): read shares, not absolutes.

  $(scripts/pyenv.sh)/bin/python bench/python/prof_vllm_load.py \\
      [--profile] -- --batches 32 --tokens 64 --reps 15
(arguments after -- go to bench_vllm.py; --connectors is ecstore-shm.)
"""

import cProfile
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    argv = sys.argv[1:]
    profile = "--profile" in argv
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    sys.argv = [sys.argv[0], "--connectors", "ecstore-shm"] + rest
    import bench_vllm  # noqa: F401 - sets sys.path for the ecstore package

    from ecstore import store as store_mod
    from ecstore import tensors as tensors_mod
    from ecstore import vllm as vllm_mod
    from ecstore import vllm_worker as worker_mod

    steps = []  # {piece: seconds} of each load step
    cur = {"rec": None}
    prof = cProfile.Profile() if profile else None

    def timed(owner, name, piece=None):
        fn = getattr(owner, name)
        piece = piece or name

        def wrapper(*a, **kw):
            rec = cur["rec"]
            if rec is None:
                return fn(*a, **kw)
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                rec[piece] = rec.get(piece, 0.0) + time.perf_counter() - t0

        setattr(owner, name, wrapper)

    Conn = vllm_mod.ECStoreConnector
    bind, clear = Conn.bind_connector_metadata, Conn.clear_connector_metadata

    def bind_wrapper(self, meta):
        if self.worker is not None and getattr(meta, "loads", None):
            cur["rec"] = {"_t0": time.perf_counter()}
            if prof is not None:
                prof.enable()
        return bind(self, meta)

    def clear_wrapper(self):
        out = clear(self)
        rec = cur["rec"]
        if rec is not None:
            if prof is not None:
                prof.disable()
            rec["step"] = time.perf_counter() - rec.pop("_t0")
            steps.append(rec)
            cur["rec"] = None
        return out

    if not profile:
        for n in ("start_load_caches", "get_finished", "build_connector_worker_meta"):
            timed(Conn, n)
        W = worker_mod.WorkerSide
        for n in ("_housekeeping", "_load_views", "_local", "_device"):
            timed(W, n)
        timed(store_mod.Store, "get_views")
        timed(store_mod, "_keys", "get_views: _keys")
        timed(store_mod.Views, "__init__", "get_views: Views()")
        if hasattr(tensors_mod, "DLBox"):
            timed(tensors_mod.DLBox, "tensors", "DLBox.tensors")
            timed(W, "_release_dead")
        else:
            timed(tensors_mod, "wrap_view")
        timed(worker_mod, "device_copy")
    Conn.bind_connector_metadata, Conn.clear_connector_metadata = bind_wrapper, clear_wrapper
    t_start = os.getloadavg()
    bench_vllm.main()
    print("# load average %.2f %.2f %.2f at start, %.2f %.2f %.2f at end; %d load steps"
          % (*t_start, *os.getloadavg(), len(steps)))
    if not steps:
        return
    if prof is not None:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        return
    med_step = statistics.median(s["step"] for s in steps)
    pieces = sorted({k for s in steps for k in s}, key=lambda k: -statistics.median(s.get(k, 0.0) for s in steps))
    print("| piece | median ms | share of the step |")
    print("|---|---|---|")
    for k in pieces:
        m = statistics.median(s.get(k, 0.0) for s in steps)
        print("| %s | %.3f | %.0f%% |" % (k, m * 1e3, 100 * m / med_step))


if __name__ == "__main__":
    main()
