"""ecstore.vllm.ECStoreConnector with vLLM 0.33's asynchronous hooks:
saves that return at once (pending marks), ensure_cache_available that
prefetches to this host's server and pins, bounded waits, params, stats and
the req_ids of shared items.  Real vLLM modules, a real redis-server and
ecstore-servers started here; a producer killed mid-save runs in its own
process.

Two "hosts" on one machine: server A (the producer's) and server B (the
consumer's local one), both registered in one Redis; the consumer reads
items on A through Redis and copies them into B.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import vllm

from conftest import REPO, start_redis, start_server

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vllm_roles as roles  # noqa: E402

from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole  # noqa: E402
from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory  # noqa: E402
from vllm.distributed.ec_transfer.ec_connector.metrics import ECConnectorLogging, ECConnectorStats  # noqa: E402

import ecstore  # noqa: E402
from ecstore import vllm as ev  # noqa: E402
from ecstore.pending import PendingMarks  # noqa: E402


def bits(t):
    return t.contiguous().view(torch.uint8).reshape(-1)


class Hosts:
    """Redis, server A (holder) and server B (the consumer's host)."""

    def __init__(self):
        self.redis = start_redis()
        self.a = start_server(self.redis.port)
        self.b = start_server(self.redis.port)
        self.url = "redis://127.0.0.1:%d" % self.redis.port

    def extra(self, server, **over):
        cfg = {"servers": "127.0.0.1:%d" % server.port, "redis_url": self.url, "namespace": "pytest",
               "protocol": "tcp", "timeout_ms": 3000, "connect_timeout_ms": 1000, "prefetch_timeout_ms": 4000,
               "pending_ttl_ms": 4000, "reopen_interval_s": 0.2}
        cfg.update(over)
        return cfg

    def stop(self):
        for p in (self.a, self.b, self.redis):
            p.stop()


@pytest.fixture
def hosts():
    h = Hosts()
    yield h
    h.stop()
    vllm.distributed.ec_transfer.ensure_ec_transfer_shutdown()


def stats_of(server, ns="pytest"):
    with ecstore.connect(servers="127.0.0.1:%d" % server.port, namespace=ns) as s:
        return s.stat(0)


def producer(extra):
    return ECConnectorFactory.create_connector(roles.vllm_config("ec_both", extra), ECConnectorRole.WORKER)


def worker(extra, role="ec_consumer"):
    return ECConnectorFactory.create_connector(roles.vllm_config(role, extra), ECConnectorRole.WORKER)


def sched_out(meta, scheduled=(), freed=()):
    out = roles.scheduler_output(meta)
    out.num_scheduled_tokens = {r: 1 for r in scheduled}
    out.free_encoder_mm_hashes = list(freed)
    return out


def wait_ready(sched, req, timeout_s, nct=0):
    """Calls ensure_cache_available as vLLM's scheduler does, once per
    "step" (5 ms), until True or timeout; returns (ready, deferred steps,
    longest call in s)."""
    end = time.monotonic() + timeout_s
    deferred, longest = 0, 0.0
    while True:
        t0 = time.monotonic()
        ok = sched.ensure_cache_available(req, nct)
        longest = max(longest, time.monotonic() - t0)
        if ok or time.monotonic() > end:
            return ok, deferred, longest
        deferred += 1
        time.sleep(0.005)


def load_step(sched, wconn, reqs, cache=None):
    """vLLM's remaining calls of one step for reqs (all ready): has_cache_item
    and update_state_after_alloc per item (a shared item allocated once),
    build_connector_meta, the worker's load, update_connector_output."""
    seen = set()
    for r in reqs:
        for i, f in enumerate(r.mm_features):
            assert sched.has_cache_item(f.identifier)
            if f.identifier not in seen:
                seen.add(f.identifier)
                sched.update_state_after_alloc(r, i)
    meta = sched.build_connector_meta(sched_out(None, [r.request_id for r in reqs]))
    cache = {} if cache is None else cache
    wconn.bind_connector_metadata(meta)
    wconn.start_load_caches(cache)
    out = vllm.v1.outputs.ECConnectorOutput()
    out.finished_sending, out.finished_recving = wconn.get_finished(set())
    out.ec_connector_worker_meta = wconn.build_connector_worker_meta()
    wconn.clear_connector_metadata()
    sched.update_connector_output(out)
    return meta, cache, out


# ---- saves ------------------------------------------------------------------


def test_save_returns_before_stored_and_item_is_visible_at_once(hosts):
    """The server is stopped (SIGSTOP) during the step: save_caches returns
    anyway, and a consumer's has_cache_item is already True (the old code
    answered False until the put landed: a re-encode window)."""
    extra = hosts.extra(hosts.a)
    prod = producer(extra)
    cons = roles.scheduler(roles.vllm_config("ec_consumer", extra))
    specs = ["v-%d:256:1024" % i for i in range(8)]
    try:
        hosts.a.pause()
        t0 = time.monotonic()
        cache = roles.encoder_step(prod, 21, specs)
        step_s = time.monotonic() - t0
        assert step_s < 2.0, "the step waited %.2fs for a stopped server" % step_s
        for s in specs:
            assert cons.has_cache_item(s.split(":")[0]), s  # pending: visible now
        hosts.a.resume()
        assert prod.wait_for_save(10000) == []
        with ecstore.connect(servers=extra["servers"], namespace="pytest") as st:
            for s in specs:  # stored, and the pending marks are gone
                h = s.split(":")[0]
                assert torch.equal(bits(st.get_tensor(h)), bits(cache[h]))
        marks = PendingMarks(hosts.url, "pytest", 1000)
        assert marks.pending([s.split(":")[0] for s in specs]) == [False] * len(specs)
        saved, _ = prod.get_finished(set())
        assert saved == {s.split(":")[0] for s in specs}
    finally:
        hosts.a.resume()
        prod.shutdown()
        cons.shutdown()


def test_pending_marks_of_32_items_take_one_round_trip(hosts):
    marks = PendingMarks(hosts.url, "pytest", 2000)
    keys = ["m-%d" % i for i in range(32)]
    marks.pending(keys)  # connect
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        marks.mark(keys, b"me")
        times.append(time.perf_counter() - t0)
    times.sort()
    print("mark 32 items: median %.3f ms, max %.3f ms" % (times[10] * 1e3, times[-1] * 1e3))
    assert marks.pending(keys) == [True] * 32
    assert times[10] < 0.005  # one pipelined round trip (a loaded 2-core machine: generous)
    marks.unmark(keys)
    assert marks.pending(keys) == [False] * 32


def test_cpu_tensor_reference_keeps_save_valid_after_vllm_drops_it(hosts):
    """vLLM frees an encoder-cache entry right after request_finished; the
    saver holds its own reference, so the bytes saved are the tensor's."""
    extra = hosts.extra(hosts.a)
    prod = producer(extra)
    try:
        hosts.a.pause()
        cache = roles.encoder_step(prod, 5, ["d-1:64:512"])
        want = cache["d-1"].clone()
        cache.clear()  # vLLM drops the entry
        import gc

        gc.collect()
        hosts.a.resume()
        assert prod.wait_for_save(10000) == []
        with ecstore.connect(servers=extra["servers"], namespace="pytest") as st:
            assert torch.equal(bits(st.get_tensor("d-1")), bits(want))
    finally:
        hosts.a.resume()
        prod.shutdown()


# ---- prefetch -----------------------------------------------------------------


def test_request_deferred_until_prefetched_then_loaded_from_local_copy(hosts):
    """A consumer on host B asks for an item whose save on host A has not
    landed: ensure_cache_available defers the request, the prefetch copies
    it into B once stored and pins it, then the load is a view of B's pool."""
    pextra = hosts.extra(hosts.a)
    cextra = hosts.extra(hosts.b, protocol="shm")
    prod = producer(pextra)
    sched = roles.scheduler(roles.vllm_config("ec_consumer", cextra))
    wconn = worker(cextra)
    try:
        hosts.a.pause()
        cache_p = roles.encoder_step(prod, 8, ["p-1:300:1024", "p-2:40:1024:f32"])
        req = roles.request("r1", [("p-1", 300), ("p-2", 40)])
        ok, deferred, _ = wait_ready(sched, req, 0.3)
        assert not ok and deferred > 0  # pending on A: deferred, not encoded
        assert sched.has_cache_item("p-1")
        hosts.a.resume()
        ok, _, longest = wait_ready(sched, req, 8.0)
        assert ok, "not ready after the save landed"
        assert longest < 0.5, "ensure_cache_available held the scheduler %.3fs" % longest
        assert stats_of(hosts.b)["objects"] == 2  # copied to this host
        meta, cache, out = load_step(sched, wconn, [req])
        assert all(s.local and s.desc is not None for s in meta.loads)
        for h in ("p-1", "p-2"):
            assert torch.equal(bits(cache[h]), bits(cache_p[h])), h
        assert out.finished_recving == {"p-1", "p-2"}
        st = wconn.get_ec_connector_stats()
        assert st.data["loads"] == 2 and st.data["load_copies"] == 0 and st.data["load_failed"] == 0
        # zero copy: the tensor's bytes are in the shared pool, not in the load pool
        pool = wconn.worker.host
        assert pool is None or pool.stats()["live_allocs"] == 0
        s = sched.get_ec_connector_stats()
        assert s.data["prefetches"] == 2 and s.data["prefetch_waits"] >= 1 and s.data["prefetch_bytes"] > 0
        # B's server pulled both from A itself: no byte went through this process
        assert s.data["prefetch_pulled"] == 2
        assert sched.take_unavailable_requests() == set()
    finally:
        hosts.a.resume()
        prod.shutdown()
        sched.shutdown()
        wconn.shutdown()


def test_item_removed_from_holder_after_ready_still_loads(hosts):
    pextra = hosts.extra(hosts.a)
    cextra = hosts.extra(hosts.b, protocol="shm")
    assert roles.save_all(roles.vllm_config("ec_both", pextra), 3, ["g-1:128:256"]) == []
    sched = roles.scheduler(roles.vllm_config("ec_consumer", cextra))
    wconn = worker(cextra)
    try:
        req = roles.request("r", [("g-1", 128)])
        assert wait_ready(sched, req, 8.0)[0]
        with ecstore.connect(servers=pextra["servers"], namespace="pytest") as s:
            assert s.remove("g-1") == 0  # gone from its holder after the check
        _, cache, out = load_step(sched, wconn, [req])
        assert torch.equal(bits(cache["g-1"]), bits(roles.embedding(3, "g-1", 128, 256, torch.bfloat16)))
        assert out.ec_connector_worker_meta is None and sched.take_unavailable_requests() == set()
    finally:
        sched.shutdown()
        wconn.shutdown()


def test_ready_item_is_pinned_against_eviction(hosts):
    """Between ready and load, the local server fills up: the pinned item
    stays (FIFO eviction skips referenced objects)."""
    redis = hosts.redis
    small = start_server(redis.port, pool="8M")
    try:
        pextra = hosts.extra(hosts.a)
        cextra = hosts.extra(small, protocol="shm")
        assert roles.save_all(roles.vllm_config("ec_both", pextra), 4, ["e-0:512:1024"]) == []  # 1 MB
        sched = roles.scheduler(roles.vllm_config("ec_consumer", cextra))
        wconn = worker(cextra)
        try:
            req = roles.request("r", [("e-0", 512)])
            assert wait_ready(sched, req, 8.0)[0]
            with ecstore.connect(servers=cextra["servers"], namespace="pytest") as s:
                for i in range(12):  # 12 MB through an 8 MB pool
                    s.put_tensor("fill-%d" % i, torch.zeros(512, 1024, dtype=torch.bfloat16))
                assert s.stat(0)["evictions"] > 0
            _, cache, _ = load_step(sched, wconn, [req])
            assert torch.equal(bits(cache["e-0"]), bits(roles.embedding(4, "e-0", 512, 1024, torch.bfloat16)))
        finally:
            sched.shutdown()
            wconn.shutdown()
    finally:
        small.stop()


def test_pin_outlives_the_server_lease_timeout(hosts, monkeypatch):
    """A request that waits after its item is ready longer than the local
    server's lease timeout keeps the item: the prefetch takes its pin again
    before the lease runs out (here: lease 1 s, refresh after 0.3 s)."""
    import ecstore.vllm_scheduler as vs

    monkeypatch.setattr(vs, "_PIN_REFRESH_S", 0.3)
    small = start_server(hosts.redis.port, "--lease-timeout-ms", "1000", pool="8M")
    try:
        pextra = hosts.extra(hosts.a)
        cextra = hosts.extra(small, protocol="shm")
        assert roles.save_all(roles.vllm_config("ec_both", pextra), 7, ["l-0:512:1024"]) == []  # 1 MB
        sched = roles.scheduler(roles.vllm_config("ec_consumer", cextra))
        wconn = worker(cextra)
        try:
            req = roles.request("r", [("l-0", 512)])
            assert wait_ready(sched, req, 8.0)[0]
            time.sleep(2.5)  # past the lease timeout, twice
            with ecstore.connect(servers=cextra["servers"], namespace="pytest") as s:
                for i in range(12):  # 12 MB through an 8 MB pool
                    s.put_tensor("fill-%d" % i, torch.zeros(512, 1024, dtype=torch.bfloat16))
            _, cache, out = load_step(sched, wconn, [req])
            assert torch.equal(bits(cache["l-0"]), bits(roles.embedding(7, "l-0", 512, 1024, torch.bfloat16)))
            assert sched.take_unavailable_requests() == set()
        finally:
            sched.shutdown()
            wconn.shutdown()
    finally:
        small.stop()


def test_two_consumers_on_one_host_share_one_local_copy(hosts):
    pextra = hosts.extra(hosts.a)
    cextra = hosts.extra(hosts.b, protocol="shm")
    assert roles.save_all(roles.vllm_config("ec_both", pextra), 6, ["s-1:200:512"]) == []
    s1, s2 = (roles.scheduler(roles.vllm_config("ec_consumer", cextra)) for _ in range(2))
    w1, w2 = worker(cextra), worker(cextra)
    try:
        r1, r2 = roles.request("x", [("s-1", 200)]), roles.request("y", [("s-1", 200)])
        assert wait_ready(s1, r1, 8.0)[0] and wait_ready(s2, r2, 8.0)[0]
        _, c1, _ = load_step(s1, w1, [r1])
        _, c2, _ = load_step(s2, w2, [r2])
        want = roles.embedding(6, "s-1", 200, 512, torch.bfloat16)
        assert torch.equal(bits(c1["s-1"]), bits(want)) and torch.equal(bits(c2["s-1"]), bits(want))
        assert stats_of(hosts.b)["objects"] == 1  # one copy on this host for both
    finally:
        for c in (s1, s2, w1, w2):
            c.shutdown()


# ---- bounded waits ------------------------------------------------------------


def test_producer_killed_mid_save_fails_requests_within_deadline(hosts, tmp_path):
    pextra = hosts.extra(hosts.a, pending_ttl_ms=1500)
    cextra = hosts.extra(hosts.b, prefetch_timeout_ms=6000)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "ec_connector" / "python"), HERE, env.get("PYTHONPATH", "")])
    hosts.a.pause()  # the put cannot land
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "vllm_roles.py"), "stall", json.dumps(pextra),
                             str(tmp_path / "model"), "9", "k-1:64:256"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    sched = roles.scheduler(roles.vllm_config("ec_consumer", cextra))
    try:
        line = proc.stdout.readline()
        assert line.strip() == "queued 1", proc.stderr.read()[-3000:] if not line else line
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        hosts.a.resume()
        req = roles.request("r-k", [("k-1", 64)])
        t0 = time.monotonic()
        gone, longest = set(), 0.0
        while not gone and time.monotonic() - t0 < 10.0:
            t1 = time.monotonic()
            ok = sched.ensure_cache_available(req, 0)
            longest = max(longest, time.monotonic() - t1)
            gone = sched.take_unavailable_requests()
            assert not ok or gone, "ready while its save never landed"
            time.sleep(0.01)
        waited = time.monotonic() - t0
        assert gone == {"r-k"}, "request not reported unavailable after %.1fs" % waited
        assert waited < 6.0 + 1.0  # the mark's TTL (1.5 s) ends it, well before the deadline
        assert longest < 0.5
        assert not sched.has_cache_item("k-1")  # the mark is gone: the next request encodes it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        hosts.a.resume()
        sched.shutdown()


def wait_looked_up(sched, n=1, timeout_s=5.0):
    """Waits until the prefetch thread's first look found n items stored or
    being saved (its "prefetches" counter)."""
    seen, end = 0, time.monotonic() + timeout_s
    while seen < n and time.monotonic() < end:
        st = sched.get_ec_connector_stats()
        seen += st.data.get("prefetches", 0) if st is not None else 0
        time.sleep(0.002)
    assert seen >= n, "the first look found %d of %d items" % (seen, n)


def test_redis_frozen_during_prefetch_is_bounded(hosts):
    cextra = hosts.extra(hosts.b, prefetch_timeout_ms=2000, timeout_ms=1000, redis_timeout_ms=300)
    sched = roles.scheduler(roles.vllm_config("ec_consumer", cextra))
    marks = PendingMarks(hosts.url, "pytest", 60000)
    try:
        marks.mark(["f-1"], b"a save that never lands")
        req = roles.request("r-f", [("f-1", 16)])
        assert not sched.ensure_cache_available(req, 0)  # pending: deferred
        wait_looked_up(sched)  # Redis freezes once the prefetch knows the save is pending
        hosts.redis.pause()
        t0 = time.monotonic()
        gone, longest = set(), 0.0
        while not gone and time.monotonic() - t0 < 6.0:
            t1 = time.monotonic()
            ok = sched.ensure_cache_available(req, 0)
            longest = max(longest, time.monotonic() - t1)
            gone = sched.take_unavailable_requests()  # vLLM asks once per step
            assert not ok or gone, "ready while its save never landed"
            time.sleep(0.005)
        waited = time.monotonic() - t0
        assert gone == {"r-f"}
        assert waited < 2.0 + 1.0, "ended after %.1fs" % waited
        assert longest < 0.5, "a hook call took %.2fs with Redis frozen" % longest
    finally:
        hosts.redis.resume()
        marks.close()
        sched.shutdown()


def test_item_on_this_host_loads_with_redis_frozen(hosts):
    """An item already on this host's server, asked for while Redis is
    frozen: the prefetch cannot look up holders or marks, but the local
    server has it, so it is pinned and loads as a view (the old code looked
    it up on the scheduler thread, timed out, and had vLLM encode it
    again)."""
    extra = hosts.extra(hosts.b, protocol="shm", redis_timeout_ms=300, timeout_ms=1000)
    want = roles.embedding(17, "lf-1", 32, 64, torch.bfloat16)
    assert roles.save_all(roles.vllm_config("ec_both", hosts.extra(hosts.b, protocol="shm")), 17,
                          ["lf-1:32:64"]) == []
    sched = roles.scheduler(roles.vllm_config("ec_consumer", extra))
    wconn = worker(extra)
    try:
        # the prefetch has its stores open (and can pull) before Redis freezes
        assert wait_ready(sched, roles.request("warm", [("lf-never", 8)]), 5.0)[0]
        hosts.redis.pause()
        req = roles.request("r", [("lf-1", 32)])
        ok, _, longest = wait_ready(sched, req, 5.0)
        assert ok and longest < 0.2
        _, cache, _ = load_step(sched, wconn, [req])  # has_cache_item True, then the load
        assert torch.equal(bits(cache["lf-1"]), bits(want))
        assert sched.take_unavailable_requests() == set()
    finally:
        hosts.redis.resume()
        sched.shutdown()
        wconn.shutdown()


def test_views_are_zero_copy_pins_of_the_pool(hosts):
    """Store.get_views: the bytes at the view's address are the object's,
    a released view no longer pins it."""
    want = roles.embedding(15, "zv", 64, 128, torch.bfloat16)
    with ecstore.connect(servers="127.0.0.1:%d" % hosts.a.port, namespace="pytest", transport="shm") as s:
        s.put_tensor("zv", want)
        views = s.get_views(["zv", "absent"])
        assert views.statuses[0] == 0 and views.statuses[1] == ecstore.codes.ENOTFOUND
        assert views.descs[0] == (ecstore.tensors.parse_dtype("bfloat16"), (64, 128))
        t = views.tensor(0)
        assert torch.equal(t, bits(want))
        views.release_items([0])
        assert views.statuses[0] != 0 and views.tensor(0) is None
        views.release()  # idempotent


def test_item_absent_everywhere_is_deferred_only_until_its_first_look(hosts):
    """The prefetch thread looks a new item up: its request may wait a step
    or two for that, then is not deferred (vLLM encodes the item)."""
    sched = roles.scheduler(roles.vllm_config("ec_consumer", hosts.extra(hosts.b)))
    try:
        req = roles.request("r", [("never", 8)])
        t0, steps = time.monotonic(), 0
        while not sched.ensure_cache_available(req, 0):
            steps += 1
            assert time.monotonic() - t0 < 3.0, "still deferred after %d steps" % steps
            time.sleep(0.001)
        assert sched.ensure_cache_available(req, 0)  # stays so
        assert not sched.has_cache_item("never")
        assert sched.take_unavailable_requests() == set()  # encoded, not failed
    finally:
        sched.shutdown()


def test_scheduler_hooks_never_wait_for_redis(hosts):
    """New requests reach ensure_cache_available with Redis frozen: each
    call returns at once (the old code looked every new item up on vLLM's
    scheduler thread, up to redis_timeout_ms per call), and each item ends
    absent (vLLM encodes it) within the look's bound."""
    cextra = hosts.extra(hosts.b, timeout_ms=1000, redis_timeout_ms=300)
    sched = roles.scheduler(roles.vllm_config("ec_consumer", cextra))
    try:
        sched.ensure_cache_available(roles.request("warm", [("warm-1", 8)]), 0)  # the stores are open
        hosts.redis.pause()
        reqs = [roles.request("rf-%d" % i, [("frozen-%d" % i, 8)]) for i in range(8)]
        t0, longest, pending = time.monotonic(), 0.0, list(reqs)
        while pending and time.monotonic() - t0 < 3.0:
            for r in list(pending):
                t1 = time.monotonic()
                if sched.ensure_cache_available(r, 0):
                    pending.remove(r)
                longest = max(longest, time.monotonic() - t1)
            time.sleep(0.002)
        assert not pending, "deferred for over 3 s with Redis frozen"
        assert longest < 0.2, "a hook call took %.0f ms with Redis frozen" % (longest * 1e3)
        assert sched.take_unavailable_requests() == set()
    finally:
        hosts.redis.resume()
        sched.shutdown()


# ---- params, req_ids, stats ----------------------------------------------------


def test_shared_item_names_every_waiting_request(hosts):
    """vLLM allocates an image shared by two requests once (the second is a
    duplicate input): the load spec still names both, so a failed load
    fails both.  The old code named only the first."""
    extra = hosts.extra(hosts.a, protocol="shm")
    assert roles.save_all(roles.vllm_config("ec_both", extra), 2, ["sh-1:32:64"]) == []
    sched = roles.scheduler(roles.vllm_config("ec_consumer", extra))
    try:
        a, b = roles.request("a", [("sh-1", 32)]), roles.request("b", [("sh-1", 32)])
        assert wait_ready(sched, a, 8.0)[0] and wait_ready(sched, b, 8.0)[0]
        for r in (a, b):
            assert sched.has_cache_item("sh-1")
        sched.update_state_after_alloc(a, 0)  # b's input is a duplicate: no alloc call
        meta = sched.build_connector_meta(sched_out(None, ["a", "b"]))
        assert [s.req_ids for s in meta.loads] == [["a", "b"]]
    finally:
        sched.shutdown()


def test_stats_are_vllm_ec_connector_stats(hosts):
    extra = hosts.extra(hosts.a, protocol="shm")
    prod = producer(extra)
    try:
        roles.encoder_step(prod, 1, ["st-1:16:64", "st-2:16:64"])
        assert prod.wait_for_save(10000) == []
        st = prod.get_ec_connector_stats()
        assert isinstance(st, ECConnectorStats) and isinstance(st, ev.ECStoreConnectorStats)
        assert st.data["saves"] == 2 and st.data["save_bytes"] == 2 * 16 * 64 * 2
        assert prod.get_ec_connector_stats() is None  # reset by the read
        other = ev.ECStoreConnectorStats(data={"loads": 3, "load_s": [0.001]})
        agg = st.aggregate(other)
        red = agg.reduce()
        assert red["saves"] == 2 and red["loads"] == 3 and red["load_p50_ms"] == 1.0
        # vLLM's own logger builds our class from the data dict
        log = ECConnectorLogging(roles.vllm_config("ec_both", extra).ec_transfer_config)
        log.observe(agg.data)
        assert isinstance(log.transfer_stats_accumulator, ev.ECStoreConnectorStats)
        lines = []
        log.log(lambda fmt, s: lines.append(fmt % s))
        assert lines and "saves=2" in lines[0]
        # and vLLM's Prometheus side (a registry of this test's own)
        import prometheus_client as pc
        from vllm.distributed.ec_transfer.ec_connector.metrics import ECConnectorProm

        reg = pc.CollectorRegistry()

        def in_reg(cls):
            return staticmethod(lambda *a, **kw: cls(*a, registry=reg, **kw))

        class Prom(ECConnectorProm):
            _gauge_cls, _counter_cls, _histogram_cls = in_reg(pc.Gauge), in_reg(pc.Counter), in_reg(pc.Histogram)

        prom = Prom(roles.vllm_config("ec_both", extra), ["engine"], {0: ["0"]})
        prom.observe(agg.data, 0)
        assert reg.get_sample_value("vllm:ec_ecstore_saves_total", {"engine": "0"}) == 2
        assert reg.get_sample_value("vllm:ec_ecstore_load_seconds_count", {"engine": "0"}) == 1
    finally:
        prod.shutdown()


# ---- CUDA (runs where a GPU is present) -----------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU paths run on a GPU machine only")
def test_cuda_host_copy_on_side_stream():
    src = roles.embedding(12, "hc", 650, 2048, torch.bfloat16).cuda()
    ev_ = torch.cuda.Event()
    ev_.record()
    host, done = ev.host_copy(src, ev_)
    done.synchronize()
    assert host.is_pinned() and torch.equal(bits(host), bits(src.cpu()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU paths run on a GPU machine only")
def test_cuda_device_copy_from_a_view_of_the_pool(hosts):
    """The load's copy on its own: a view of the server's shared pool,
    registered with CUDA once, copied asynchronously on a side stream."""
    want = roles.embedding(14, "dc", 650, 2048, torch.bfloat16)
    extra = hosts.extra(hosts.a)
    with ecstore.connect(servers=extra["servers"], namespace="pytest", transport="shm") as s:
        s.put_tensor("dc", want)
        views = s.get_views(["dc"])
        try:
            host = views.tensor(0).view(torch.bfloat16).view(650, 2048)
            stream = torch.cuda.Stream()
            out, done = ev.device_copy(host, torch.device("cuda"), stream)
            done.synchronize()
            assert out.is_cuda and torch.equal(bits(out.cpu()), bits(want))
            assert ev.cuda_register_mapping(views.address(0), views.nbytes[0])  # registered once, then known
        finally:
            views.release()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU paths run on a GPU machine only")
def test_cuda_save_prefetch_and_view_load(hosts):
    pextra = hosts.extra(hosts.a)
    cextra = hosts.extra(hosts.b, protocol="shm", load_device="cuda")
    prod = producer(pextra)
    sched = roles.scheduler(roles.vllm_config("ec_consumer", cextra))
    wconn = worker(cextra)
    try:
        src = {"cu-%d" % i: roles.embedding(11, "cu-%d" % i, 650, 2048, torch.bfloat16).cuda() for i in range(4)}
        for h in src:
            prod.save_caches(src, h)
        assert prod.wait_for_save(20000) == []
        reqs = [roles.request("r%d" % i, [(h, 650)]) for i, h in enumerate(src)]
        for r in reqs:
            assert wait_ready(sched, r, 10.0)[0]
        _, cache, _ = load_step(sched, wconn, reqs)
        torch.cuda.synchronize()
        for h, t in src.items():
            assert cache[h].is_cuda and torch.equal(bits(cache[h]), bits(t))
    finally:
        prod.shutdown()
        sched.shutdown()
        wconn.shutdown()


def test_prefetch_off_still_defers_pending_items_then_loads(hosts):
    """prefetch: false: no local copy, no pin, but a pending item still
    defers its request until stored, and the worker loads from the holder."""
    pextra = hosts.extra(hosts.a)
    cextra = hosts.extra(hosts.b, prefetch=False)
    prod = producer(pextra)
    sched = roles.scheduler(roles.vllm_config("ec_consumer", cextra))
    wconn = worker({k: v for k, v in cextra.items() if k != "servers"})  # holders found through Redis
    try:
        hosts.a.pause()
        cache_p = roles.encoder_step(prod, 13, ["n-1:50:256"])
        req = roles.request("r", [("n-1", 50)])
        assert not wait_ready(sched, req, 0.2)[0]
        hosts.a.resume()
        assert wait_ready(sched, req, 8.0)[0]
        meta, cache, _ = load_step(sched, wconn, [req])
        assert not meta.loads[0].local
        assert torch.equal(bits(cache["n-1"]), bits(cache_p["n-1"]))
        assert stats_of(hosts.b)["objects"] == 0  # nothing copied to this host
    finally:
        hosts.a.resume()
        prod.shutdown()
        sched.shutdown()
        wconn.shutdown()


def test_saves_beyond_queue_depth_are_dropped_not_waited_for(hosts):
    """A store that does not keep up (stopped): past queue_depth waiting
    saves, save_caches drops the new ones at once, and their marks go, so
    consumers encode those items instead of waiting for them."""
    extra = hosts.extra(hosts.a, queue_depth=2, batch_size=1)
    prod = producer(extra)
    cons = roles.scheduler(roles.vllm_config("ec_consumer", extra))
    try:
        hosts.a.pause()
        saver = prod.worker.saver
        t0 = time.monotonic()
        roles.encoder_step(prod, 3, ["qd-0:16:64"])
        assert time.monotonic() - t0 < 2.0
        # qd-0 is taken by the saver thread and stuck on the stopped server
        # before the rest come: on a loaded machine the thread may otherwise
        # take its first job only after a later save found the queue full,
        # and which saves are dropped would be a race.
        deadline = time.monotonic() + 5.0
        while (saver.q or not saver.busy) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert saver.busy and not saver.q
        t0 = time.monotonic()
        roles.encoder_step(prod, 4, ["qd-%d:16:64" % i for i in range(1, 8)])
        assert time.monotonic() - t0 < 2.0
        visible = [cons.has_cache_item("qd-%d" % i) for i in range(8)]
        # one in flight, queue_depth (2) queued, the other five dropped
        assert visible == [True] * 3 + [False] * 5
        hosts.a.resume()
        failures = prod.wait_for_save(10000)
        assert sorted(h for h, _ in failures) == ["qd-%d" % i for i in range(8) if not visible[i]]
    finally:
        hosts.a.resume()
        prod.shutdown()
        cons.shutdown()
