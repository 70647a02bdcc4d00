#!/usr/bin/env python3
"""vLLM's ECExampleConnector (safetensors files) vs ecstore.vllm.ECStoreConnector
(tcp and shm), saving and loading the same embeddings, in one run.

Both connectors are driven the same way, through vLLM's own classes: an
ec_both instance's worker saves through the model runner's EC mixin
(``maybe_save_ec_to_connector``), then its scheduler checks each item
(``has_cache_item``), allocates it (``update_state_after_alloc``), builds the
step's metadata, and the worker loads it (the mixin's
``maybe_get_ec_connector_output`` -> ``start_load_caches``) into an empty
encoder_cache.  Every repetition uses new mm_hashes and new random bytes,
and the loaded tensors are compared with the saved ones.

Per connector and batch (items per step), over --reps repetitions:
- save:  the time the model runner spends in save_caches for the batch
         (ecstore queues the put and returns; the example writes the files);
- saved: until the batch is stored (ecstore: wait_for_save; the example:
         the same as save);
- check: the scheduler's has_cache_item calls for the batch;
- load:  the worker's start_load_caches for the batch (the data path);
- load+use: load, then every loaded byte read once (copied into a buffer,
         as the model runner's gather copies embeddings): the example's
         safetensors load maps the file lazily, so on a CPU its bytes are
         read only here.
p50 and p99 in ms, and the example's p50 over ecstore's for load and for
load+use (the ratios).  --warmup repetitions per connector come first and
are not counted (first-use costs: connections, pool mappings).

The example connector picks its load device from vLLM's platform, which a
CUDA build of vLLM cannot detect on a machine without a GPU; this script
then selects vLLM's CPU platform (both connectors load to the CPU).

  $(scripts/pyenv.sh)/bin/python bench/python/bench_vllm.py [--build build] [--reps 40]
"""

import argparse
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "ec_connector" / "python"))
sys.path.insert(0, str(REPO / "tests" / "python"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


def use_cpu_platform():
    """vLLM's CPU platform when no accelerator platform was detected (the
    example connector loads onto current_platform.device_type)."""
    import vllm.platforms as vp

    if vp.current_platform.device_type:
        return vp.current_platform.device_type
    from vllm.platforms.cpu import CpuPlatform

    vp._current_platform = CpuPlatform()
    return "cpu (selected by this script)"


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100.0 * (len(xs) - 1))))]


class Run:
    """One connector under test: an ec_both VllmConfig and its two sides."""

    def __init__(self, name, connector, module, extra, model_dir):
        import vllm_roles as roles
        from vllm.config import DeviceConfig, ECTransferConfig, ModelConfig, VllmConfig
        from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
        from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory

        self.name = name
        tc = ECTransferConfig(ec_connector=connector, ec_connector_module_path=module, ec_role="ec_both",
                              ec_connector_extra_config=extra)
        self.cfg = VllmConfig(ec_transfer_config=tc, device_config=DeviceConfig(device="cpu"),
                              model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True))
        self.roles = roles
        self.sched = roles.scheduler(self.cfg)
        self.worker = ECConnectorFactory.create_connector(self.cfg, ECConnectorRole.WORKER)

    def close(self):
        self.sched.shutdown()
        self.worker.shutdown()

    def activate(self):
        """Makes this run's worker the process's EC agent, the one vLLM's
        mixin calls (ensure_ec_transfer_initialized keeps the first one
        made; the connectors take turns here)."""
        from vllm.distributed.ec_transfer import ec_transfer_state

        ec_transfer_state._EC_CONNECTOR_AGENT = self.worker

    def rep(self, tensors, tokens, dst):
        """(save, saved, check, load, load+use) seconds for one batch; dst:
        one prefaulted buffer per item that "use" copies the loaded tensor
        into, as the model runner's gather copies embeddings into the
        input embeddings (this is where lazily mapped file pages fault in)."""
        import torch
        from vllm.v1.worker.ec_connector_model_runner_mixin import ECConnectorModelRunnerMixin as Mixin

        roles = self.roles
        self.activate()
        t0 = time.perf_counter()
        for h in tensors:
            Mixin.maybe_save_ec_to_connector(tensors, h)
        t1 = time.perf_counter()
        if hasattr(self.worker, "wait_for_save"):
            failures = self.worker.wait_for_save()
            if failures:
                sys.exit("%s: saves failed: %s" % (self.name, failures))
        t2 = time.perf_counter()
        reqs = [roles.request("r-%s" % h, [(h, tokens)]) for h in tensors]
        for r in reqs:
            if not self.sched.has_cache_item(r.mm_features[0].identifier):
                sys.exit("%s: %s not found after its save" % (self.name, r.mm_features[0].identifier))
        t3 = time.perf_counter()
        for r in reqs:
            self.sched.update_state_after_alloc(r, 0)
        meta = self.sched.build_connector_meta(roles.scheduler_output(None))
        cache = {}
        out = roles.scheduler_output(meta)
        t4 = time.perf_counter()
        with Mixin.maybe_get_ec_connector_output(out, cache):
            pass
        t5 = time.perf_counter()
        for d, h in zip(dst, tensors):
            d.copy_(cache[h])
        t6 = time.perf_counter()
        for h, t in tensors.items():
            got = cache.get(h)
            if got is None or not torch.equal(got.view(torch.uint8), t.view(torch.uint8)):
                sys.exit("%s: %s loaded wrong or not at all" % (self.name, h))
        return t1 - t0, t2 - t0, t3 - t2, t5 - t4, t6 - t4


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=str(REPO / "build"), help="CMake build dir (bin/, lib/)")
    ap.add_argument("--reps", type=int, default=40, help="repetitions per cell")
    ap.add_argument("--warmup", type=int, default=2, help="uncounted repetitions per cell first")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--tokens", type=int, default=650)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--storage", default=None, help="directory of the example connector's files "
                    "(default: a temp dir under $TMPDIR)")
    ap.add_argument("--connectors", default="example,ecstore-tcp,ecstore-shm")
    args = ap.parse_args()
    build = pathlib.Path(args.build).resolve()
    os.environ.setdefault("ECSTORE_LIB", str(build / "lib" / "libecstore.so"))
    os.environ.setdefault("ECS_BIN_DIR", str(build / "bin"))
    import torch
    from conftest import start_redis, start_server  # the tests' process fixtures

    device = use_cpu_platform()
    tmp = tempfile.mkdtemp(prefix="ecs-bench-vllm-")
    procs = []
    try:
        import vllm_roles as roles

        model_dir = os.path.join(tmp, "model")
        roles.vllm_config("ec_consumer", {}, model_dir)  # writes the tiny model's config.json
        procs.append(start_redis())
        procs.append(start_server(procs[0].port, ns="bench", pool="1G"))
        rport, sport = procs[0].port, procs[1].port
        storage = args.storage or os.path.join(tmp, "example")
        os.makedirs(storage, exist_ok=True)
        common = {"servers": "127.0.0.1:%d" % sport, "redis_url": "redis://127.0.0.1:%d" % rport,
                  "namespace": "bench", "staging_bytes": "256M"}
        specs = {
            "example": ("ECExampleConnector", None, {"shared_storage_path": storage}),
            "ecstore-tcp": ("ECStoreConnector", "ecstore.vllm", dict(common, protocol="tcp")),
            "ecstore-shm": ("ECStoreConnector", "ecstore.vllm", dict(common, protocol="shm")),
        }
        names = args.connectors.split(",")
        batches = [int(b) for b in args.batches.split(",")]
        fs = subprocess.run(["stat", "-f", "-c", "%T", storage], capture_output=True, text=True).stdout.strip()
        print("# vLLM %s, torch %s, platform %s; %d x %d bf16 (%.2f MB) per item; %d reps; example files on %s (%s)"
              % (__import__("vllm").__version__, torch.__version__, device, args.tokens, args.hidden,
                 args.tokens * args.hidden * 2 / 1e6, args.reps, storage, fs), flush=True)
        results = {}
        runs = {n: Run(n, *specs[n], model_dir) for n in names}
        seq = 0
        for b in batches:
            samples = {n: [] for n in names}
            dst = [torch.ones(args.tokens, args.hidden, dtype=torch.bfloat16) for _ in range(b)]
            for r in range(-args.warmup, args.reps):
                # Connectors take turns, repetition by repetition, so that
                # other load on this machine hits all of them alike.
                for n in names:
                    seq += 1
                    tensors = {}
                    for i in range(b):
                        raw = torch.randint(0, 256, (args.tokens * args.hidden * 2,), dtype=torch.uint8)
                        tensors["%s-%d-%d" % (n, seq, i)] = raw.view(torch.bfloat16).reshape(args.tokens,
                                                                                             args.hidden)
                    sample = runs[n].rep(tensors, args.tokens, dst)
                    if r >= 0:
                        samples[n].append(sample)
            for n in names:
                cols = list(zip(*samples[n]))
                results[(n, b)] = [(statistics.median(c) * 1e3, pct(c, 99) * 1e3) for c in cols]
        for run in runs.values():
            run.close()
        print("| connector | batch | save p50 / p99 | saved p50 / p99 | check p50 / p99 | load p50 / p99 |"
              " load+use p50 / p99 | example / this: load | load+use |")
        print("|---|---|---|---|---|---|---|---|---|")
        for b in batches:
            for n in names:
                cells = " | ".join("%.2f / %.2f" % c for c in results[(n, b)])
                ratio = " | "
                if "example" in names:
                    ex, me = results[("example", b)], results[(n, b)]
                    ratio = "%.2fx | %.2fx" % (ex[3][0] / me[3][0], ex[4][0] / me[4][0])
                print("| %s | %d | %s | %s |" % (n, b, cells, ratio))
        print("(ms; save: time in save_caches; saved: until stored; check: has_cache_item of the batch;"
              " load: start_load_caches of the batch; load+use: load, then each byte read once)")
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
