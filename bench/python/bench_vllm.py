#!/usr/bin/env python3
"""An encoder step on one vLLM instance, its items used on another: what each
EC connector costs the two instances' steps, and how soon the items are
there.  ecstore.vllm.ECStoreConnector (tcp, shm) against vLLM's own
ECExampleConnector (safetensors files), all driven through vLLM 0.33's own
classes and hooks, connectors alternated repetition by repetition.

Per repetition and connector, a producer instance (ec_producer: its
worker, through the model runner's EC mixin) runs one encoder step of
--batch new items (new mm_hashes, new random bytes), and a consumer
instance (ec_consumer: its scheduler and worker) gets requests for them:

- save hold: the producer's step in the connector (the mixin's
  start_save_caches and every save_caches);
- visible:   from the producer's step start until the consumer's
  has_cache_item is True for every item (polled);
- re-encodes: items for which has_cache_item was False when the producer's
  step returned (a consumer asking then would encode them again);
- prefetch:  from the producer's step end until ensure_cache_available is
  True for every request (asked once per 1 ms "step", as vLLM's scheduler
  does; the example connector has no prefetch: 0);
- load hold: the longest consumer step spent in the connector's worker
  calls (start_load_caches and the rest of the mixin), over the steps the
  requests waited and the step that scheduled them (vLLM keeps stepping
  while requests wait; ECMooncakeConnector loads during those steps);
- load+use:  load, then every loaded byte read once (copied, as the model
  runner's gather copies embeddings; the example's lazily mapped files are
  read here);
- end-to-end: from the producer's step start until the consumer's tensors
  are used (visible + prefetch + load + use, as one clock).

ecstore-shm: every data path over shm, and the consumer's worker hands
vLLM views of its local pool; ecstore-tcp: every data path over tcp,
views off (zero_copy false: the worker's load copies).  Every loaded
tensor is compared with the saved one.  With --servers 2
(the default) the producer saves into server A and the consumer's local
server is B, both in one Redis: ecstore's prefetch copies each item A -> B,
the copy a second host would make (over loopback here).  --servers 1: one
server for both.

vLLM's ECMooncakeConnector ("mooncake": push mode over the pip Mooncake's
TransferEngine, protocol tcp, CPU buffers) runs with what vLLM's EPD proxy
would arrange: the consumer worker's control service is started
(start_worker_services), and each request carries ec_transfer_params
naming the consumer and a transfer id per item.  Its "prefetch" is the
wait for the push; its load hands out views of the consumer's buffer.

--link RATE (root; e.g. 10gbit) adds "ecstore-link": the producer's
server A runs in a network namespace, a second host joined to this one by a
veth pair rate-limited with tc (tbf, both directions), so the link and not
the CPU bounds the transfer.  The consumer (this host) has server B and shm
views; its prefetch has B pull each item from A across the link.  The
producer's instance runs in this process too, so its put crosses the link
as well (on a real encoder host it would be local); the put goes one way
and the pull the other, each direction limited on its own and the two
overlapping, so the cell's floor is one crossing, printed as "link floor"
(bytes / rate).  The other
connectors have no cross-host mode here (Mooncake's push and its listener
live in this one process; the example connector's files would need a
shared filesystem), so the cell is measured against the floor.

  $(scripts/pyenv.sh)/bin/python bench/python/bench_vllm.py [--build build] \\
      [--reps 40] [--batches 8,32] [--tokens 1100] [--hidden 3584] [--link 10gbit]
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

COLUMNS = ("save hold", "visible", "prefetch", "load hold", "load+use", "end-to-end")


def use_cpu_platform():
    """vLLM's CPU platform when no accelerator platform was detected (the
    example connector loads onto current_platform.device_type)."""
    import vllm.platforms as vp

    if vp.current_platform.device_type:
        return vp.current_platform.device_type
    from vllm.platforms.cpu import CpuPlatform

    vp._current_platform = CpuPlatform()
    return "cpu (selected by this script)"


class Link:
    """A second host: a network namespace joined to this one by a veth pair
    whose two ends are rate-limited with tc (tbf)."""

    def __init__(self, rate):
        pid = os.getpid()
        self.ns = "ecsbv%d" % pid
        self.dev = "ecsbv%da" % (pid % 10 ** 7)
        peer = "ecsbv%db" % (pid % 10 ** 7)
        net = 10 + pid % 200
        self.here, self.there = "10.213.%d.1" % net, "10.213.%d.2" % net
        self.rate = rate
        self.up = False
        cmds = [["ip", "netns", "add", self.ns],
                ["ip", "link", "add", self.dev, "type", "veth", "peer", "name", peer],
                ["ip", "link", "set", peer, "netns", self.ns],
                ["ip", "addr", "add", self.here + "/24", "dev", self.dev],
                ["ip", "link", "set", self.dev, "up"],
                ["ip", "-n", self.ns, "addr", "add", self.there + "/24", "dev", peer],
                ["ip", "-n", self.ns, "link", "set", peer, "up"],
                ["ip", "-n", self.ns, "link", "set", "lo", "up"],
                ["tc", "qdisc", "add", "dev", self.dev, "root", "tbf", "rate", rate, "burst", "4mb",
                 "latency", "50ms"],
                ["ip", "netns", "exec", self.ns, "tc", "qdisc", "add", "dev", peer, "root", "tbf", "rate", rate,
                 "burst", "4mb", "latency", "50ms"]]
        self.up = True
        for c in cmds:
            r = subprocess.run(c, capture_output=True, text=True)
            if r.returncode:
                self.close()
                sys.exit("--link: %s failed: %s" % (" ".join(c), r.stderr.strip()))

    def bits_per_s(self):
        units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12, "bit": 1.0}
        for u, f in units.items():
            if self.rate.endswith(u):
                return float(self.rate[:-len(u)]) * f
        return float(self.rate)

    def close(self):
        if self.up:
            subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
            subprocess.run(["ip", "link", "del", self.dev], capture_output=True)
            self.up = False


class NsServer:
    """An ecstore-server in the link's namespace."""

    def __init__(self, link, binary, redis_port, pool, extra, log):
        self.port = 7700
        self.log = log
        with open(log, "w") as f:
            self.proc = subprocess.Popen(["ip", "netns", "exec", link.ns, str(binary), "--listen",
                                          "%s:%d" % (link.there, self.port), "--unprotected", "--redis",
                                          "%s:%d" % (link.here, redis_port), "--pool-size", pool, "--ns", "bench",
                                          "--log-level", "warn"] + list(extra), stdout=f, stderr=subprocess.STDOUT)
        end = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                sys.exit("--link: the server in %s exited: %s" % (link.ns, open(log).read()))
            try:
                import socket

                with socket.create_connection((link.there, self.port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > end:
                    sys.exit("--link: the server in %s does not answer" % link.ns)
                time.sleep(0.05)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100.0 * (len(xs) - 1))))]


class Instance:
    """One vLLM instance's two connector sides (scheduler, worker)."""

    def __init__(self, connector, module, role, extra, model_dir, **tc_kw):
        from vllm.config import DeviceConfig, ECTransferConfig, ModelConfig, VllmConfig
        from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
        from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory

        widths = tc_kw.pop("mm_encoder_output_widths", None)
        tc = ECTransferConfig(ec_connector=connector, ec_connector_module_path=module, ec_role=role,
                              ec_connector_extra_config=extra, **tc_kw)
        if widths:
            tc.mm_encoder_output_widths = widths
        self.cfg = VllmConfig(ec_transfer_config=tc, device_config=DeviceConfig(device="cpu"),
                              model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True))
        self.sched = ECConnectorFactory.create_connector(self.cfg, ECConnectorRole.SCHEDULER)
        self.worker = ECConnectorFactory.create_connector(self.cfg, ECConnectorRole.WORKER)

    def activate(self):
        """This instance's worker becomes the process's EC agent, the one
        vLLM's mixin calls (instances take turns in this process)."""
        from vllm.distributed.ec_transfer import ec_transfer_state

        ec_transfer_state._EC_CONNECTOR_AGENT = self.worker

    def close(self):
        self.sched.shutdown()
        self.worker.shutdown()


def sched_out(meta, req_ids=()):
    from vllm.v1.core.sched.output import SchedulerOutput

    out = SchedulerOutput.make_empty()
    out.ec_connector_metadata = meta
    out.num_scheduled_tokens = {r: 1 for r in req_ids}
    return out


class Pair:
    """A producer and a consumer instance of one connector."""

    params = None  # ec_transfer_params a proxy would give each request (Mooncake)

    def __init__(self, name, connector, module, pextra, cextra, model_dir, ptc=None, ctc=None):
        self.name = name
        self.prod = Instance(connector, module, "ec_producer", pextra, model_dir, **(ptc or {}))
        self.cons = Instance(connector, module, "ec_consumer", cextra, model_dir, **(ctc or {}))
        if connector == "ECMooncakeConnector":
            # What vLLM's EPD proxy arranges: the consumer listens for pushes,
            # and each request names the consumer and a transfer id per item.
            self.cons.worker.start_worker_services()
            self.params = "tcp://%s:%d" % (ctc["ec_ip"], ctc["ec_port"])

    def close(self):
        self.prod.close()
        self.cons.close()

    def rep(self, tensors, tokens, dst):
        """(save hold, visible, prefetch, load hold, load+use, end-to-end)
        seconds and the re-encode count, for one batch."""
        import torch
        import vllm_roles as roles
        from vllm.v1.worker.ec_connector_model_runner_mixin import ECConnectorModelRunnerMixin as Mixin

        keys = list(tensors)
        reqs = [roles.request("r-%s" % h, [(h, tokens)]) for h in keys]
        if self.params is not None:
            for r, h in zip(reqs, keys):
                r.ec_transfer_params = {"consumer_zmq": self.params,
                                        "ec_items": [{"mm_hash": h, "transfer_id": "t-" + h}]}
        # the producer's scheduler: the step encodes these items
        ps = self.prod.sched
        for r in reqs:
            ps.ensure_cache_available(r, 0)
            ps.has_cache_item(r.mm_features[0].identifier)
            ps.update_state_after_alloc(r, 0)
        pmeta = ps.build_connector_meta(sched_out(None, [r.request_id for r in reqs]))
        # the producer's worker: one encoder step
        self.prod.activate()
        cache = {}
        t0 = time.perf_counter()
        with Mixin.maybe_get_ec_connector_output(sched_out(pmeta), cache):
            for h in keys:
                cache[h] = tensors[h]
                Mixin.maybe_save_ec_to_connector(cache, h)
        t1 = time.perf_counter()
        cs = self.cons.sched
        reencode = sum(1 for h in keys if not cs.has_cache_item(h))
        # visible: has_cache_item true for all (polled)
        left = set(h for h in keys if not cs.has_cache_item(h))
        while left:
            left = {h for h in left if not cs.has_cache_item(h)}
            if left:
                time.sleep(0.0002)
            if time.perf_counter() - t1 > 30:
                sys.exit("%s: not visible after 30 s" % self.name)
        t_vis = time.perf_counter()
        # prefetch: once per 1 ms engine step, ensure_cache_available for the
        # waiting requests, then the step's metadata and worker call (vLLM
        # keeps stepping; a connector may load during these steps)
        ccache = {}
        holds = []

        def step(meta):
            self.cons.activate()
            s0 = time.perf_counter()
            with Mixin.maybe_get_ec_connector_output(sched_out(meta), ccache) as out:
                pass
            holds.append(time.perf_counter() - s0)
            cs.update_connector_output(out)

        pending = list(reqs)
        while pending:
            pending = [r for r in pending if not cs.ensure_cache_available(r, 0)]
            if pending:
                step(cs.build_connector_meta(sched_out(None)))
                time.sleep(0.001)
            if time.perf_counter() - t1 > 30:
                sys.exit("%s: not ready after 30 s" % self.name)
        t_ready = time.perf_counter()
        if hasattr(cs, "take_unavailable_requests") and cs.take_unavailable_requests():
            sys.exit("%s: requests unavailable" % self.name)
        for r in reqs:
            if not cs.has_cache_item(r.mm_features[0].identifier):
                sys.exit("%s: %s not found after its save" % (self.name, r.mm_features[0].identifier))
            cs.update_state_after_alloc(r, 0)
        cmeta = cs.build_connector_meta(sched_out(None, [r.request_id for r in reqs]))
        t4 = time.perf_counter()
        step(cmeta)
        t5 = time.perf_counter()
        for d, h in zip(dst, keys):
            d.copy_(ccache[h])
        t6 = time.perf_counter()
        for h, t in tensors.items():
            got = ccache.get(h)
            if got is None or not torch.equal(got.view(torch.uint8), t.view(torch.uint8)):
                sys.exit("%s: %s loaded wrong or not at all" % (self.name, h))
        for r in reqs:
            cs.request_finished(r)
            ps.request_finished(r)
        result = (t1 - t0, t_vis - t0, max(0.0, t_ready - t1), max(holds), t6 - t4, (t_ready - t0) + (t6 - t4))
        # the next step frees the items from the consumer's encoder cache
        # (Mooncake's pushes then leave its buffer)
        ccache.clear()
        fr = sched_out(None)
        fr.free_encoder_mm_hashes = list(keys)
        step(cs.build_connector_meta(fr))
        del ccache, cache
        # load hold: the longest consumer step in the connector's worker calls
        # (a connector that loads while the request waits holds that step);
        # end-to-end: t_vis <= t_ready
        return result, reencode


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=str(REPO / "build"), help="CMake build dir (bin/, lib/)")
    ap.add_argument("--reps", type=int, default=40, help="repetitions per cell")
    ap.add_argument("--warmup", type=int, default=2, help="uncounted repetitions per cell first")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--tokens", type=int, default=1100, help="tokens per item (a Qwen2.5-VL image: 1000-1300)")
    ap.add_argument("--hidden", type=int, default=3584, help="width of one token's embedding (bf16)")
    ap.add_argument("--servers", type=int, choices=(1, 2), default=2,
                    help="2: producer and consumer have their own server (prefetch copies); 1: one shared")
    ap.add_argument("--pool", default="2G", help="each ecstore-server's pool")
    ap.add_argument("--server-args", default="", help="more ecstore-server arguments, e.g. '--hugepages try'")
    ap.add_argument("--storage", default=None, help="directory of the example connector's files "
                    "(default: a temp dir under $TMPDIR)")
    ap.add_argument("--connectors", default="ecstore-shm,ecstore-tcp,example,mooncake")
    ap.add_argument("--link", default=None, metavar="RATE",
                    help="add ecstore-link: the producer's server on a second host (network namespace) behind "
                         "a veth link rate-limited to RATE with tc, e.g. 10gbit (needs root)")
    args = ap.parse_args()
    if args.link and os.geteuid() != 0:
        sys.exit("--link needs root (network namespaces and tc)")
    build = pathlib.Path(args.build).resolve()
    os.environ.setdefault("ECSTORE_LIB", str(build / "lib" / "libecstore.so"))
    os.environ.setdefault("ECS_BIN_DIR", str(build / "bin"))
    import torch
    from conftest import start_redis, start_server  # the tests' process fixtures

    device = use_cpu_platform()
    tmp = tempfile.mkdtemp(prefix="ecs-bench-vllm-")
    procs, pairs = [], {}
    link = None
    try:
        import vllm_roles as roles

        model_dir = os.path.join(tmp, "model")
        roles.vllm_config("ec_consumer", {}, model_dir)  # writes the tiny model's config.json
        # ... with the benchmark's width, which connectors that size buffers
        # from the model (Mooncake) must see
        import json

        cfg = dict(roles.TINY_VL, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                   vision_config=dict(roles.TINY_VL["vision_config"], out_hidden_size=args.hidden))
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(cfg, f)
        if args.link:
            link = Link(args.link)
            from conftest import Proc, free_port as _fp, redis_path

            rp = _fp()
            redis = Proc([redis_path(), "--port", str(rp), "--bind", "127.0.0.1", link.here, "--save", "",
                          "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no"], "redis", rp)
        else:
            redis = start_redis()
        procs.append(redis)
        import shlex

        sargs = shlex.split(args.server_args)
        a = start_server(redis.port, *sargs, ns="bench", pool=args.pool)
        procs.append(a)
        b = a if args.servers == 1 else start_server(redis.port, *sargs, ns="bench", pool=args.pool)
        if b is not a:
            procs.append(b)
        storage = args.storage or os.path.join(tmp, "example")
        os.makedirs(storage, exist_ok=True)
        url = "redis://127.0.0.1:%d" % redis.port

        def ecs(server, proto):
            return {"servers": "127.0.0.1:%d" % server.port, "redis_url": url, "namespace": "bench",
                    "staging_bytes": "512M", "protocol": proto, "zero_copy": proto == "shm",
                    "load_pool_bytes": "1G"}

        specs = {
            "ecstore-shm": ("ECStoreConnector", "ecstore.vllm", ecs(a, "shm"), ecs(b, "shm")),
            "ecstore-tcp": ("ECStoreConnector", "ecstore.vllm", ecs(a, "tcp"), ecs(b, "tcp")),
            "example": ("ECExampleConnector", None, {"shared_storage_path": storage},
                        {"shared_storage_path": storage}),
        }
        from conftest import free_port

        bufsize = float(max(int(x) for x in args.batches.split(",")) * args.tokens * args.hidden * 2 * 3)
        mc = {"ec_ip": "127.0.0.1", "ec_buffer_device": "cpu", "ec_buffer_size": bufsize}
        specs["mooncake"] = ("ECMooncakeConnector", None, {"mooncake_protocol": "tcp"},
                             {"mooncake_protocol": "tcp"},
                             # vLLM measures the encoder's output width at an encoder's start
                             dict(mc, ec_port=free_port(), mm_encoder_output_widths={"image": args.hidden}),
                             dict(mc, ec_port=free_port()))
        if link is not None:
            far = NsServer(link, build / "bin" / "ecstore-server", redis.port, args.pool, sargs,
                           os.path.join(tmp, "server-link.log"))
            procs.append(far)
            lcfg = ecs(b, "shm")
            specs["ecstore-link"] = ("ECStoreConnector", "ecstore.vllm",
                                     dict(ecs(b, "tcp"), servers="%s:%d" % (link.there, far.port), zero_copy=False),
                                     lcfg)
        names = args.connectors.split(",")
        if link is not None and "ecstore-link" not in names:
            names.append("ecstore-link")
        for n in names:
            if n not in specs:
                sys.exit("unknown connector %r (known: %s)" % (n, ", ".join(specs)))
        batches = [int(x) for x in args.batches.split(",")]
        fs = subprocess.run(["stat", "-f", "-c", "%T", storage], capture_output=True, text=True).stdout.strip()
        load = os.getloadavg()
        print("# vLLM %s, torch %s, platform %s; %d x %d bf16 (%.2f MB) per item; %d reps (+%d warm-up); "
              "%d server(s); example files on %s (%s); load average %.2f %.2f %.2f at start"
              % (__import__("vllm").__version__, torch.__version__, device, args.tokens, args.hidden,
                 args.tokens * args.hidden * 2 / 1e6, args.reps, args.warmup, args.servers, storage, fs, *load),
              flush=True)
        pairs = {}
        for n in names:
            c, m, pe, ce, *tc = specs[n]
            pairs[n] = Pair(n, c, m, pe, ce, model_dir, *tc)
        results = {}
        seq = 0
        for bsz in batches:
            samples = {n: [] for n in names}
            reenc = {n: 0 for n in names}
            dst = [torch.ones(args.tokens, args.hidden, dtype=torch.bfloat16) for _ in range(bsz)]
            memcpy = []
            for r in range(-args.warmup, args.reps):
                for n in names:  # connectors take turns, repetition by repetition
                    seq += 1
                    tensors = {}
                    for i in range(bsz):
                        raw = torch.randint(0, 256, (args.tokens * args.hidden * 2,), dtype=torch.uint8)
                        tensors["%s-%d-%d" % (n, seq, i)] = raw.view(torch.bfloat16).reshape(args.tokens, args.hidden)
                    sample, re = pairs[n].rep(tensors, args.tokens, dst)
                    if r >= 0:
                        samples[n].append(sample)
                        reenc[n] += re
                    if n == names[0] and r >= 0:  # a memcpy of the same bytes, same run
                        t0 = time.perf_counter()
                        for d, t in zip(dst, tensors.values()):
                            d.copy_(t)
                        memcpy.append(time.perf_counter() - t0)
            for n in names:
                cols = list(zip(*samples[n]))
                results[(n, bsz)] = ([(statistics.median(c) * 1e3, pct(c, 90) * 1e3) for c in cols], reenc[n])
            results[("memcpy", bsz)] = statistics.median(memcpy) * 1e3
        print("| connector | batch | " + " | ".join("%s p50 / p90" % c for c in COLUMNS) + " | re-encodes |")
        print("|---|---|" + "---|" * len(COLUMNS) + "---|")
        for bsz in batches:
            for n in names:
                cells, re = results[(n, bsz)]
                print("| %s | %d | %s | %d |" % (n, bsz, " | ".join("%.2f / %.2f" % c for c in cells), re))
        print("(ms per step of --batch items; memcpy of the same bytes, same run: %s; load average %.2f %.2f %.2f "
              "at the end)" % (", ".join("batch %d %.2f ms" % (bb, results[("memcpy", bb)]) for bb in batches),
                               *os.getloadavg()))
        if link is not None:
            item = args.tokens * args.hidden * 2
            print("(ecstore-link: tc tbf %s each way; link floor, one crossing of the batch's bytes: %s)"
                  % (args.link, ", ".join("batch %d %.2f ms" % (bb, bb * item * 8 / link.bits_per_s() * 1e3)
                                          for bb in batches)))
    finally:
        for p in pairs.values():
            p.close()
        for p in reversed(procs):
            p.stop()
        if link is not None:
            link.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
