"""The CUDA part of scripts/device-check.sh (docs/device.md), run against an
ecstore-server the shell script started with --cuda-register.

    python device_cuda.py --server H:P --ns NS --json FILE [--device cuda|cpu] [--quick]

1. Host-to-device GB/s, one run, the same destination and sizes for all:
   from a block of ecstore's pinned pool (``ecs_pool`` with cuda_register,
   what ecstore.pinned.HostPool makes), from a client's shm view of the
   server's pool (as mapped, then after cudaHostRegister of the view), from
   pageable memory and from a torch pinned tensor.  Each copy is read back
   and compared: wrong bytes are counted, never assumed away.
2. The Python connector's CUDA save and load, bit for bit: ecstore.vllm's
   ECStoreConnector saves CUDA tensors (its side stream and event, where it
   has them) and loads them back onto the GPU (its asynchronous H2D from
   pinned memory, where it has it).  Through vLLM's own base class when
   vLLM imports; otherwise through a stand-in of the few members of vLLM's
   ECConnectorBase the connector uses (the connector's code is the same),
   and the report says which.

With --device cpu (no GPU: the dry run) every step runs with CPU tensors
so that the plumbing is checked; its figures are memcpy, not H2D, and are
labelled so.  Prints one JSON object and writes it to --json.  Exit 0 when
every check that ran found the right bytes, 1 otherwise.
"""

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
import traceback
import types

import torch

import ecstore
import ecstore.pinned
from ecstore import _lib
from ecstore.errors import err_name

MiB = 1 << 20


def host_tensor(addr, nbytes):
    """A uint8 torch tensor over nbytes of host memory at addr (no copy; the
    caller keeps the memory alive)."""
    return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(addr), dtype=torch.uint8)


class Timer:
    """Wall time of copies into dst: CUDA events on a GPU, perf_counter on CPU."""

    def __init__(self, dev):
        self.cuda = dev.type == "cuda"

    def time(self, fn):
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def wrong_bytes(dst, src):
    """Bytes of dst (any device) that differ from src (host)."""
    return int((dst.cpu() != src).sum().item())


def h2d(args, dev, store, report):
    """Section 1: H2D from four kinds of host memory, rounds alternating."""
    size, count = args.size_mib * MiB, args.count
    lib = _lib.lib()
    out = {"size_bytes": size, "objects": count, "rounds": args.rounds,
           "what": "host-to-device copy" if dev.type == "cuda" else "host-to-host copy (no GPU: plumbing only)"}
    ref = [torch.randint(0, 256, (size,), dtype=torch.uint8) for _ in range(count)]
    dst = torch.empty(size, dtype=torch.uint8, device=dev)
    srcs = {}
    keep = []

    # (a) ecstore's pinned pool in this process (HostPool's C pool)
    pool = ecstore.pinned.HostPool(size * count + 16 * MiB, cuda_register=dev.type == "cuda", name="ecs-devcheck")
    out["pool_cuda_registered"] = int(pool.stats().get("cuda_registered", 0))
    blocks = []
    for i in range(count):
        off = ctypes.c_uint64()
        rc = lib.ecs_pool_alloc(ctypes.c_void_p(pool._ptr), size, ctypes.byref(off))
        if rc:
            raise RuntimeError("pool alloc of %d bytes: %s" % (size, err_name(rc)))
        t = host_tensor(lib.ecs_pool_ptr(ctypes.c_void_p(pool._ptr), off.value), size)
        t.copy_(ref[i])
        blocks.append(t)
    srcs["pinned pool"] = blocks

    # (b) the server's pool through this client's shm views
    keys = ["devcheck-h2d-%d-%d" % (os.getpid(), i) for i in range(count)]
    for k, r in zip(keys, ref):
        st = store.put_from(k, r.data_ptr(), size)
        if st:
            raise RuntimeError("put of %s: %s" % (k, err_name(st)))
    out["client_transport"] = store.transport()
    h = store._handle()
    # the binding's own prototypes (_lib.View): resetting them here with
    # another View class broke every later get_views in this process
    karr = (_lib.Key * count)()
    kb = [k.encode() for k in keys]
    for i, k in enumerate(kb):
        karr[i].data, karr[i].len = k, len(k)
    views = (_lib.View * count)()
    rc = lib.ecs_get_view_batch(h.ptr, karr, views, count)
    if rc or any(views[i].status for i in range(count)):
        out["shm_view"] = "not available: ecs_get_view_batch rc=%d statuses=%s" % (
            rc, [views[i].status for i in range(count)])
    else:
        srcs["shm view"] = [host_tensor(views[i].data, size) for i in range(count)]

    # (c) pageable memory, (d) torch pinned tensors
    srcs["pageable"] = [r.clone() for r in ref]
    if dev.type == "cuda":
        srcs["torch pinned"] = [r.pin_memory() for r in ref]
    else:
        srcs["torch pinned"] = [r.clone() for r in ref]  # no pinning without CUDA: the plumbing only

    timer = Timer(dev)
    samples = {k: [] for k in srcs}

    def one_round(name):
        def run():
            for s in srcs[name]:
                dst.copy_(s, non_blocking=True)
        return timer.time(run)

    names = list(srcs)
    for name in names:  # warm-up
        one_round(name)
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            samples[name].append(size * count / one_round(name) / 1e9)

    # the view again after cudaHostRegister of its pages in this process
    reg_note = None
    if "shm view" in srcs and dev.type == "cuda":
        cudart = torch.cuda.cudart()
        ok, t0 = [], time.perf_counter()
        for i in range(count):
            e = None
            for flags in (0, 8):  # 8: cudaHostRegisterReadOnly, for a read-only mapping
                e = cudart.cudaHostRegister(views[i].data, size, flags)
                if int(e) == 0:
                    ok.append(i)
                    break
        reg_s = time.perf_counter() - t0
        if len(ok) == count:
            samples["shm view, registered"] = []
            srcs["shm view, registered"] = srcs["shm view"]
            one_round("shm view, registered")
            for r in range(args.rounds):
                samples["shm view, registered"].append(size * count / one_round("shm view, registered") / 1e9)
            reg_note = "cudaHostRegister of %d views: %.1f ms" % (count, reg_s * 1e3)
        else:
            reg_note = "cudaHostRegister of a view failed (cudaError %s)" % int(e)
        for i in ok:
            cudart.cudaHostUnregister(views[i].data)
    out["view_register"] = reg_note

    # every source's bytes, once more, checked on the way back
    wrong = {}
    for name, ss in srcs.items():
        w = 0
        for i, s in enumerate(ss):
            dst.copy_(s, non_blocking=True)
            w += wrong_bytes(dst, ref[i])
        wrong[name] = w
    base = statistics.median(samples["torch pinned"])
    out["gbps"] = {k: {"median": statistics.median(v), "min": min(v), "max": max(v),
                       "vs_torch_pinned": statistics.median(v) / base if base else 0.0}
                   for k, v in samples.items()}
    out["wrong_bytes"] = wrong
    if "shm view" in srcs:
        lib.ecs_view_release(h.ptr, views, count)
    del srcs, blocks, keep
    report["h2d"] = out
    return sum(wrong.values()) == 0


# ---- section 2: the connector -------------------------------------------------


def standin_vllm():
    """Modules under vllm's names with the members ecstore.vllm uses of
    vLLM's base class and logger, for a machine without vLLM.  The members
    are vLLM's contract as docs/vllm.md states it; the connector's own code
    is what runs."""
    import enum
    import logging

    base = types.ModuleType("vllm.distributed.ec_transfer.ec_connector.base")

    class ECConnectorRole(enum.Enum):
        SCHEDULER = 0
        WORKER = 1

    class ECConnectorMetadata:  # noqa: D401 - a marker base, as in vLLM
        pass

    class ECConnectorWorkerMetadata:
        def aggregate(self, other):
            return self

    class ECConnectorBase:
        def __init__(self, vllm_config, role):
            self._connector_metadata = None
            self._vllm_config = vllm_config
            self._role = role
            tc = vllm_config.ec_transfer_config
            self._is_producer = tc.ec_role in ("ec_producer", "ec_both")
            self._is_consumer = tc.ec_role in ("ec_consumer", "ec_both")

        @property
        def role(self):
            return self._role

        @property
        def is_producer(self):
            return self._is_producer

        @property
        def is_consumer(self):
            return self._is_consumer

        def bind_connector_metadata(self, meta):
            self._connector_metadata = meta

        def clear_connector_metadata(self):
            self._connector_metadata = None

        def _get_connector_metadata(self):
            return self._connector_metadata

    for name, obj in (("ECConnectorRole", ECConnectorRole), ("ECConnectorMetadata", ECConnectorMetadata),
                      ("ECConnectorWorkerMetadata", ECConnectorWorkerMetadata),
                      ("ECConnectorBase", ECConnectorBase)):
        setattr(base, name, obj)
    from dataclasses import dataclass, field

    metrics = types.ModuleType("vllm.distributed.ec_transfer.ec_connector.metrics")

    @dataclass
    class ECConnectorStats:
        data: dict = field(default_factory=dict)

    class ECConnectorPromMetrics:
        def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
            self._labelnames = labelnames
            self.per_engine_labelvalues = per_engine_labelvalues

    metrics.ECConnectorStats = ECConnectorStats
    metrics.ECConnectorPromMetrics = ECConnectorPromMetrics
    logger = types.ModuleType("vllm.logger")
    logger.init_logger = logging.getLogger
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(device_type="cuda" if torch.cuda.is_available() else "cpu")
    top = types.ModuleType("vllm")
    top._ecs_standin = True  # a second connector run must not take it for vLLM
    mods = {"vllm": top, "vllm.distributed": types.ModuleType("vllm.distributed"),
            "vllm.distributed.ec_transfer": types.ModuleType("vllm.distributed.ec_transfer"),
            "vllm.distributed.ec_transfer.ec_connector": types.ModuleType("vllm.distributed.ec_transfer.ec_connector"),
            base.__name__: base, metrics.__name__: metrics, logger.__name__: logger, platforms.__name__: platforms}
    sys.modules.update(mods)


def connector_config(extra, real, dev):
    if real:
        from vllm.config import DeviceConfig, ECTransferConfig, VllmConfig

        tc = ECTransferConfig(ec_connector="ECStoreConnector", ec_connector_module_path="ecstore.vllm",
                              ec_role="ec_both", ec_connector_extra_config=dict(extra))
        return VllmConfig(ec_transfer_config=tc, device_config=DeviceConfig(device=dev.type))
    tc = types.SimpleNamespace(ec_connector="ECStoreConnector", ec_connector_module_path="ecstore.vllm",
                               ec_role="ec_both", ec_connector_extra_config=dict(extra),
                               is_ec_producer=True, is_ec_consumer=True)
    return types.SimpleNamespace(ec_transfer_config=tc, model_config=None)


def load_step(conn, ev, specs, src, dev):
    """One load step of the worker connector for specs: (returned s, on the
    device s, missing hashes, items on dev, wrong bytes of the loaded ones)."""
    conn.bind_connector_metadata(ev.ECStoreConnectorMetadata(loads=specs))
    cache = {}
    t0 = time.perf_counter()
    conn.start_load_caches(cache)
    t_ret = time.perf_counter() - t0
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t_done = time.perf_counter() - t0
    missing, on_dev, wrong = [], 0, 0
    for h, t in src.items():
        got = cache.get(h)
        if got is None:
            missing.append(h)
            continue
        on_dev += got.device.type == dev.type
        a = got.contiguous().view(torch.uint8).reshape(-1).cpu()
        b = t.contiguous().view(torch.uint8).reshape(-1).cpu()
        wrong += int((a != b).sum().item()) if a.numel() == b.numel() else max(a.numel(), b.numel())
    return t_ret, t_done, missing, on_dev, wrong


def connector(args, dev, report, protocol="tcp"):
    out = {"protocol": protocol}
    report["connector" if protocol == "tcp" else "connector_" + protocol] = out
    real = False
    if not args.standin and not getattr(sys.modules.get("vllm"), "_ecs_standin", False):
        try:
            import vllm  # noqa: F401

            real = True
            out["vllm"] = getattr(vllm, "__version__", "?")
        except Exception as e:  # noqa: BLE001 - any failure to import means: not there
            out["vllm"] = "not importable (%s: %s)" % (type(e).__name__, str(e).splitlines()[0][:120] if str(e) else "")
    if not real:
        standin_vllm()
    try:
        import ecstore.vllm as ev
    except Exception as e:  # noqa: BLE001
        # the connector is in the bundle: failing to import it is a failure
        # (the stand-in lacks a member it uses, or the package is broken)
        out["result"] = "failed: import ecstore.vllm: %s: %s" % (type(e).__name__, e)
        return False
    out["path"] = ("ecstore.vllm.ECStoreConnector on vLLM's ECConnectorBase" if real else
                   "ecstore.vllm.ECStoreConnector on a stand-in of vLLM's ECConnectorBase (vLLM not in the bundle)")
    cls = getattr(ev, "ECStoreConnector", None)
    need = ["save_caches", "wait_for_save", "start_load_caches", "bind_connector_metadata", "shutdown"]
    missing = [m for m in need if cls is None or not hasattr(cls, m)]
    if missing or not hasattr(ev, "ECStoreConnectorMetadata") or not hasattr(ev, "ECStoreLoadSpec"):
        out["result"] = "not available: ecstore.vllm lacks %s" % (missing or "its metadata classes")
        return True
    # what the connector has of the CUDA paths (names as in ecstore/vllm_worker.py)
    worker_cls = getattr(ev, "WorkerSide", None)
    out["features"] = {
        "save: copy on a side stream + event (host_copy)": callable(getattr(ev, "host_copy", None)),
        "load: async H2D + event (device_copy)": callable(getattr(ev, "device_copy", None)),
        "load: shm views registered with CUDA (cuda_register_mapping)": callable(getattr(ev, "cuda_register_mapping", None)),
        "load: pinned pool for copies (WorkerSide._host_pool)": hasattr(worker_cls, "_host_pool"),
    }
    extra = {"servers": args.server, "namespace": args.ns, "protocol": protocol, "timeout_ms": 20000,
             "load_device": dev.type, "load_pool_bytes": "%dM" % max(64, args.items * args.tokens * args.width * 2 // MiB * 2)}
    extra["redis_url"] = "redis://" + args.redis
    try:
        cfg = connector_config(extra, real, dev)
        conn = cls(cfg, ev.ECConnectorRole.WORKER)
    except Exception as e:  # noqa: BLE001
        out["result"] = "failed: cannot build the connector: %s: %s" % (type(e).__name__, e)
        return False
    ok = True
    try:
        g = torch.Generator().manual_seed(22)
        src = {}
        for i in range(args.items):
            raw = torch.randint(0, 256, (args.tokens * args.width * 2,), dtype=torch.uint8, generator=g)
            src["devcheck-%d-%d" % (os.getpid(), i)] = raw.view(torch.bfloat16).reshape(args.tokens, args.width).to(dev)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for h in src:
            conn.save_caches(src, h)
        t_queued = time.perf_counter() - t0
        fails = conn.wait_for_save()
        t_saved = time.perf_counter() - t0
        out["save"] = {"items": len(src), "bytes": sum(t.numel() * 2 for t in src.values()),
                       "queue_ms": t_queued * 1e3, "stored_ms": t_saved * 1e3, "failures": [str(f) for f in fails]}
        # Two loads of the same items: the first pays one-time costs (the
        # load pool's or the shm mapping's cudaHostRegister), the second is
        # what every later step sees.  Over shm the specs say "local", as
        # the prefetch would: loads are views of the server's pool, copied
        # to the GPU from there.
        pool = None
        good = True
        for rnd in ("load", "load_again"):
            specs = [ev.ECStoreLoadSpec(h, args.tokens, ["r%d" % i], local=(protocol == "shm"))
                     for i, h in enumerate(src)]
            t_ret, t_done, missing, on_dev, wrong = load_step(conn, ev, specs, src, dev)
            missing_items = len(missing)
            pool = getattr(getattr(conn, "worker", None), "host", None)
            out[rnd] = {"returned_ms": t_ret * 1e3, "on_device_ms": t_done * 1e3, "missing": missing_items,
                        "on_%s" % dev.type: on_dev, "wrong_bytes": wrong}
            good = good and missing_items == 0 and wrong == 0 and on_dev == len(src)
        out["load"]["load_pool_cuda_registered"] = (int(pool.stats().get("cuda_registered", 0))
                                                    if pool is not None else "no pool (views)")
        side = getattr(conn, "worker", None)
        if protocol == "tcp" and hasattr(side, "_stage_fetch"):
            # Staging (ecstore/vllm_stage.py): what a worker's stage thread
            # does when its scheduler asks (the copy into the pinned load
            # pool), then the load step hands the staged tensors over (an
            # asynchronous copy to the GPU from pinned memory).
            from ecstore import tensors as _tt

            specs = [(h, t.numel() * 2, _tt.parse_dtype("bfloat16"), tuple(t.shape)) for h, t in src.items()]
            t0 = time.perf_counter()
            staged, failed = side._stage_fetch(specs)
            t_stage = time.perf_counter() - t0
            specs = [ev.ECStoreLoadSpec(h, args.tokens, ["s%d" % i]) for i, h in enumerate(src)]
            t_ret, t_done, missing, on_dev, wrong = load_step(conn, ev, specs, src, dev)
            wrong += sum(src[h].numel() * 2 for h in missing)  # a missing item: all its bytes wrong
            out["load_staged"] = {"staged": len(staged), "failed": len(failed), "stage_ms": t_stage * 1e3,
                                  "returned_ms": t_ret * 1e3, "on_device_ms": t_done * 1e3,
                                  "on_%s" % dev.type: on_dev, "wrong_bytes": wrong}
            good = good and not failed and len(staged) == len(src) and wrong == 0 and on_dev == len(src)
        try:  # the connector's own counters: load_copies says whether loads were views or copies
            st = conn.get_ec_connector_stats()
            out["stats"] = {k: v for k, v in st.reduce().items() if v} if st is not None else None
        except Exception as e:  # noqa: BLE001
            out["stats"] = "unavailable: %s" % e
        ok = not fails and good
        out["result"] = "ok: %d items saved and loaded, bit-identical" % len(src) if ok else "FAILED"
    except Exception as e:  # noqa: BLE001
        out["result"] = "failed: %s: %s" % (type(e).__name__, e)
        out["traceback"] = traceback.format_exc().splitlines()[-8:]
        ok = False
    finally:
        try:
            conn.shutdown()
        except Exception:  # noqa: BLE001
            pass
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", required=True, help="ecstore-server H:P (started with --cuda-register)")
    ap.add_argument("--redis", required=True, help="its Redis H:P (the connector needs one)")
    ap.add_argument("--ns", default="devcheck")
    ap.add_argument("--json", required=True)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--size-mib", type=int, default=16)
    ap.add_argument("--count", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--items", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=650)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--protocols", default="tcp,shm",
                    help="the connector's transports to save and load through (tcp: loads copied into its pinned "
                         "pool; shm: loads are views of the server's pool, registered with CUDA)")
    ap.add_argument("--standin", action="store_true", help="use the stand-in base even where vLLM imports")
    ap.add_argument("--quick", action="store_true", help="small sizes (the dry run)")
    args = ap.parse_args()
    if args.quick:
        args.size_mib, args.count, args.rounds, args.items, args.tokens, args.width = 4, 2, 3, 3, 65, 256
    if not (1 <= args.size_mib <= 256 and 1 <= args.count <= 64 and 1 <= args.rounds <= 50 and 1 <= args.items <= 64):
        ap.error("a size or count out of range")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("device_cuda: torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    dev = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    try:
        import numpy

        np_version = numpy.__version__
    except ImportError:
        np_version = "absent (HostPool.tensor, the connector's load pool, needs it)"
    report = {"numpy": np_version, "torch": torch.__version__, "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
              "cuda": torch.version.cuda}
    ok = True
    store = None
    try:
        store = ecstore.Store(servers=args.server, namespace=args.ns, transport="shm", timeout_ms=20000)
        ok &= h2d(args, dev, store, report)
    except Exception as e:  # noqa: BLE001 - reported, and the connector check still runs
        report["h2d"] = {"result": "failed: %s: %s" % (type(e).__name__, e)}
        ok = False
    finally:
        if store is not None:
            store.close()
    for proto in args.protocols.split(","):
        ok &= connector(args, dev, report, proto)
    report["ok"] = bool(ok)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(json.dumps(report, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
