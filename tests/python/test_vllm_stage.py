"""Staging (ecstore.vllm_stage): a consumer whose loads copy (tcp, no shm
views) has its workers copy each ready item into pinned memory while vLLM
defers the request, so the load step only hands tensors over.  Real vLLM
modules, a real redis-server and ecstore-servers; the scheduler and the
worker share one VllmConfig (one vLLM instance), as in vLLM."""

import os
import socket
import threading
import time

import pytest
import torch

import vllm_roles as roles
from test_vllm_async import bits, hosts, load_step, stats_of, wait_ready, worker  # noqa: F401 - hosts is a fixture

from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory


def instance(extra):
    """(scheduler connector, worker connector) of one vLLM instance."""
    cfg = roles.vllm_config("ec_consumer", extra)
    sched = ECConnectorFactory.create_connector(cfg, ECConnectorRole.SCHEDULER)
    wconn = ECConnectorFactory.create_connector(cfg, ECConnectorRole.WORKER)
    assert wconn.worker.stager.connected.wait(5.0), "the worker never reached its scheduler's stage channel"
    wait_for(lambda: sched.scheduler.hub.ranks())
    assert sched.scheduler.hub.ranks() == {0}
    return sched, wconn


def wait_for(cond, timeout_s=5.0):
    """Polls cond every 10 ms until it is true or timeout_s passed."""
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)


def hold_stage(wconn, then_copy=False):
    """The worker's stage copy waits until the returned event is set (a
    stuck or a late worker), then fails its items, or (then_copy) makes
    them."""
    gate = threading.Event()
    real = wconn.worker.stager.fetch
    fail = lambda specs: ([], [h for h, *_ in specs])  # noqa: E731
    wconn.worker.stager.fetch = lambda specs: (gate.wait(10), (real if then_copy else fail)(specs))[1]
    return gate


def saved(hosts, seed, specs):
    assert roles.save_all(roles.vllm_config("ec_both", hosts.extra(hosts.a)), seed, specs) == []


@pytest.mark.parametrize("where", ["tcp-local", "no-local-server"])
def test_staged_items_load_with_the_store_stopped(hosts, where):
    """Once ensure_cache_available says ready, the bytes are in the worker:
    both servers stopped (SIGSTOP), the load step still hands over every
    item, right, at once.  Without staging the step copies from the store
    (here: waits out its deadline and fails the requests).  tcp-local: a
    local server read over tcp (zero_copy off); no-local-server: items read
    from their holder, zero_copy left on (nothing to view)."""
    specs = ["s-%d:64:512" % i for i in range(6)]
    saved(hosts, 5, specs)
    if where == "tcp-local":
        extra = hosts.extra(hosts.b, zero_copy=False)
    else:
        extra = hosts.extra(hosts.a, local_server="")
    sched, wconn = instance(extra)
    try:
        reqs = [roles.request("r-%d" % i, [(s.split(":")[0], 64)]) for i, s in enumerate(specs)]
        for r in reqs:
            assert wait_ready(sched, r, 8.0)[0]
        assert set(wconn.worker.staged) == {s.split(":")[0] for s in specs}
        hosts.a.pause()
        hosts.b.pause()
        t0 = time.monotonic()
        _, cache, out = load_step(sched, wconn, reqs)
        took = time.monotonic() - t0
        hosts.a.resume()
        hosts.b.resume()
        assert took < 1.0, "the load step waited %.2fs for the stopped store" % took
        for s in specs:
            h = s.split(":")[0]
            assert torch.equal(bits(cache[h]), bits(roles.embedding(5, h, 64, 512, torch.bfloat16)))
        assert out.ec_connector_worker_meta is None and sched.take_unavailable_requests() == set()
        st = wconn.get_ec_connector_stats().data
        assert st["load_staged"] == len(specs) and st["loads"] == len(specs)
        assert wconn.worker.staged == {} and wconn.worker.staged_bytes == 0
    finally:
        hosts.a.resume()
        hosts.b.resume()
        sched.shutdown()
        wconn.shutdown()


def test_a_stuck_stage_ends_at_its_timeout_and_the_load_copies(hosts):
    """A worker that never answers (its copy stuck): the item is ready
    after stage_timeout_ms anyway, and the load copies it in the step."""
    saved(hosts, 6, ["t-1:64:512"])
    sched, wconn = instance(hosts.extra(hosts.b, zero_copy=False, stage_timeout_ms=400))
    stuck = hold_stage(wconn)
    try:
        req = roles.request("r", [("t-1", 64)])
        t0 = time.monotonic()
        ok, deferred, _ = wait_ready(sched, req, 8.0)
        took = time.monotonic() - t0
        assert ok and 0.35 < took < 3.9, took  # before the 4 s prefetch deadline
        _, cache, _ = load_step(sched, wconn, [req])
        assert torch.equal(bits(cache["t-1"]), bits(roles.embedding(6, "t-1", 64, 512, torch.bfloat16)))
        st = wconn.get_ec_connector_stats().data
        assert st.get("load_staged", 0) == 0 and st["loads"] == 1
        assert sched.get_ec_connector_stats().data["stage_timeouts"] == 1
    finally:
        stuck.set()
        sched.shutdown()
        wconn.shutdown()


def test_staged_items_vllm_never_loads_are_dropped(hosts):
    saved(hosts, 7, ["d-1:64:512"])
    sched, wconn = instance(hosts.extra(hosts.b, zero_copy=False, stage_ttl_s=0.3))
    try:
        assert wait_ready(sched, roles.request("r", [("d-1", 64)]), 8.0)[0]
        assert "d-1" in wconn.worker.staged and wconn.worker.staged_bytes == 64 * 512 * 2
        time.sleep(0.4)
        wconn.start_load_caches({})  # a step: housekeeping
        assert wconn.worker.staged == {} and wconn.worker.staged_bytes == 0
    finally:
        sched.shutdown()
        wconn.shutdown()


def test_stage_channel_survives_garbage_and_refuses_other_users(hosts):
    """The channel is a local socket: a process of this user sending
    garbage is cut off, one of another user is refused at once; the real
    worker keeps staging."""
    sched, wconn = instance(hosts.extra(hosts.b, zero_copy=False))
    hub = sched.scheduler.hub
    name = "\0" + hub_name(sched)
    try:
        junk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        junk.settimeout(3.0)
        junk.connect(name)
        junk.sendall(b'{"rank": 9}\n' + b"x" * 100 + b"\n")
        assert junk.recv(10) == b""  # closed by the hub
        junk.close()
        junk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        junk.settimeout(3.0)
        junk.connect(name)
        try:
            junk.sendall(b"{" * (2 << 20))  # a line that never ends
            assert junk.recv(10) == b""
        except (BrokenPipeError, ConnectionResetError):
            pass  # cut off while sending
        junk.close()
        if os.geteuid() == 0:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # another user: the hub must not take its rank
                code = 1
                try:
                    os.setgid(65534)
                    os.setuid(65534)
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.settimeout(3.0)
                    s.connect(name)
                    s.sendall(b'{"rank": 8}\n')
                    code = 0 if s.recv(10) == b"" else 2
                except (BrokenPipeError, ConnectionResetError):
                    code = 0  # closed by the hub while sending
                except Exception:  # noqa: BLE001
                    code = 3
                os.write(w, bytes([code]))
                os._exit(0)
            os.close(w)
            got = os.read(r, 1)
            os.waitpid(pid, 0)
            os.close(r)
            assert got == b"\x00", got
        assert hub.ranks() == {0}
        saved(hosts, 8, ["g-1:64:512"])
        assert wait_ready(sched, roles.request("r", [("g-1", 64)]), 8.0)[0]
        assert "g-1" in wconn.worker.staged
    finally:
        sched.shutdown()
        wconn.shutdown()


def test_a_worker_that_stops_reading_never_holds_vllms_scheduler(hosts):
    """A peer of the stage channel that said its rank and then reads
    nothing: once its socket buffer is full, each message to it waits (1 s)
    before the hub cuts it off.  That wait is the prefetch thread's:
    build_connector_meta, on vLLM's scheduler thread, stays quick (the old
    code sent the drop messages from it, and one step took over a second),
    and the real worker is still told."""
    sched, wconn = instance(hosts.extra(hosts.b, zero_copy=False))
    hub = sched.scheduler.hub
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        mute.settimeout(3.0)
        mute.connect("\0" + hub_name(sched))
        mute.sendall(b'{"rank": 1}\n')
        wait_for(lambda: hub.ranks() == {0, 1})
        assert hub.ranks() == {0, 1}
        longest = 0.0
        for step in range(40):  # ~40 KB of drops a step: the mute peer's buffer fills
            with sched.scheduler.lock:
                sched.scheduler.stage_drops.extend("d-%d-%04d-%s" % (step, i, "x" * 48) for i in range(600))
            t0 = time.monotonic()
            sched.build_connector_meta(roles.scheduler_output(None))
            longest = max(longest, time.monotonic() - t0)
            time.sleep(0.005)
        wait_for(lambda: hub.ranks() == {0}, 10.0)
        assert hub.ranks() == {0}, "the mute peer was never cut off"
        assert longest < 0.2, "a step took %.2f s" % longest
        saved(hosts, 16, ["m-1:64:512"])
        assert wait_ready(sched, roles.request("r", [("m-1", 64)]), 8.0)[0]
        assert "m-1" in wconn.worker.staged
    finally:
        mute.close()
        sched.shutdown()
        wconn.shutdown()


def hub_name(sched):
    from ecstore.vllm_stage import channel_name

    s = sched.scheduler
    return channel_name(s.cfg, s.py)


def test_loads_through_views_are_not_staged(hosts):
    """shm views (zero_copy, the default) need no staging: nothing is
    asked of the workers, and the load is a view."""
    saved(hosts, 9, ["v-1:64:512"])
    extra = hosts.extra(hosts.b, protocol="shm")
    sched, wconn = instance(extra)
    try:
        req = roles.request("r", [("v-1", 64)])
        assert wait_ready(sched, req, 8.0)[0]
        assert wconn.worker.staged == {}
        _, cache, _ = load_step(sched, wconn, [req])
        assert torch.equal(bits(cache["v-1"]), bits(roles.embedding(9, "v-1", 64, 512, torch.bfloat16)))
        assert wconn.get_ec_connector_stats().data.get("load_staged", 0) == 0
    finally:
        sched.shutdown()
        wconn.shutdown()


def test_stage_off(hosts):
    """stage=false: no channel, loads copy in the step as before."""
    saved(hosts, 10, ["o-1:64:512"])
    extra = hosts.extra(hosts.b, zero_copy=False, stage=False)
    cfg = roles.vllm_config("ec_consumer", extra)
    sched = ECConnectorFactory.create_connector(cfg, ECConnectorRole.SCHEDULER)
    wconn = ECConnectorFactory.create_connector(cfg, ECConnectorRole.WORKER)
    try:
        assert sched.scheduler.hub is None and wconn.worker.stager is None
        req = roles.request("r", [("o-1", 64)])
        assert wait_ready(sched, req, 8.0)[0]
        _, cache, _ = load_step(sched, wconn, [req])
        assert torch.equal(bits(cache["o-1"]), bits(roles.embedding(10, "o-1", 64, 512, torch.bfloat16)))
    finally:
        sched.shutdown()
        wconn.shutdown()


def test_a_finished_request_drops_what_was_staged_for_it(hosts):
    """vLLM finishes (aborts) a request whose item was staged but never
    loaded: the next step tells the workers, which let go of the copy."""
    saved(hosts, 11, ["f-1:64:512"])
    sched, wconn = instance(hosts.extra(hosts.b, zero_copy=False))
    try:
        req = roles.request("r", [("f-1", 64)])
        assert wait_ready(sched, req, 8.0)[0]
        assert "f-1" in wconn.worker.staged
        sched.request_finished(req)
        sched.build_connector_meta(roles.scheduler_output(None))
        wait_for(lambda: "f-1" not in wconn.worker.staged)
        assert wconn.worker.staged == {} and wconn.worker.staged_bytes == 0
    finally:
        sched.shutdown()
        wconn.shutdown()


def test_one_rank_without_views_stages_straight_from_the_holder(hosts):
    """zero_copy off and one rank: the worker reads each item from its
    holder (A) itself, one copy; nothing is pulled into the local server
    (B), which would only add a copy the worker then reads again."""
    specs = ["h-%d:64:512" % i for i in range(4)]
    saved(hosts, 12, specs)
    sched, wconn = instance(hosts.extra(hosts.b, zero_copy=False))
    try:
        reqs = [roles.request("r-%d" % i, [(s.split(":")[0], 64)]) for i, s in enumerate(specs)]
        for r in reqs:
            assert wait_ready(sched, r, 8.0)[0]
        assert set(wconn.worker.staged) == {s.split(":")[0] for s in specs}
        _, cache, out = load_step(sched, wconn, reqs)
        for s in specs:
            h = s.split(":")[0]
            assert torch.equal(bits(cache[h]), bits(roles.embedding(12, h, 64, 512, torch.bfloat16)))
        assert stats_of(hosts.b)["objects"] == 0  # nothing copied to this host's server
        assert sched.get_ec_connector_stats().data.get("prefetch_pulled", 0) == 0
        assert wconn.get_ec_connector_stats().data["load_staged"] == len(specs)
    finally:
        sched.shutdown()
        wconn.shutdown()


def test_direct_stage_lands_in_the_load_pool_and_keeps_to_its_cap(hosts):
    """Read straight from the holders, items land in the worker's load pool
    (faulted in up front; the old code read them into fresh memory, a page
    fault per 4 KiB); a request whose row count is off (a wrong size
    guess) still stages the right bytes; what does not fit load_pool_bytes
    is never allocated, fails its stage and loads in the step from its
    holder."""
    item = 64 * 512 * 2
    specs = ["g-0:64:512", "g-1:64:512", "g-2:80:512", "g-3:64:512"]  # g-2 has 80 rows
    saved(hosts, 15, specs)
    sched, wconn = instance(hosts.extra(hosts.b, zero_copy=False, load_pool_bytes=4 * item))
    try:
        reqs = [roles.request("r-%d" % i, [(s.split(":")[0], 64)]) for i, s in enumerate(specs)]  # all say 64
        for r in reqs:
            sched.ensure_cache_available(r, 0)
        for r in reqs:
            assert wait_ready(sched, r, 8.0)[0]
        w = wconn.worker
        staged = dict(w.staged)
        in_pool = w.host.stats()["bytes_in_use"] if w.host is not None else 0
        assert sum(t.numel() * t.element_size() for t, _ in staged.values()) <= 4 * item
        assert len(staged) == 3 and in_pool >= 3 * item, (sorted(staged), in_pool)
        assert w.row is not None and w.row[1] == (512,)  # learnt from the items
        _, cache, _ = load_step(sched, wconn, reqs)
        for s in specs:
            h, rows = s.split(":")[0], int(s.split(":")[1])
            assert torch.equal(bits(cache[h]), bits(roles.embedding(15, h, rows, 512, torch.bfloat16)))
        st = wconn.get_ec_connector_stats().data
        assert st["load_staged"] == 3
        assert sched.take_unavailable_requests() == set()
    finally:
        sched.shutdown()
        wconn.shutdown()


def test_an_item_still_staging_at_its_prefetch_deadline_does_not_fail(hosts):
    """The prefetch deadline is for bringing an item here; once here, the
    stage has its own bound (stage_timeout_ms): an item staging past the
    prefetch deadline is ready at its stage timeout, not failed."""
    saved(hosts, 13, ["p-1:64:512"])
    sched, wconn = instance(hosts.extra(hosts.b, zero_copy=False, prefetch_timeout_ms=500, stage_timeout_ms=1500))
    stuck = hold_stage(wconn)
    try:
        req = roles.request("r", [("p-1", 64)])
        assert wait_ready(sched, req, 4.0)[0]
        assert sched.take_unavailable_requests() == set()
    finally:
        stuck.set()
        sched.shutdown()
        wconn.shutdown()


def test_a_copy_staged_after_its_load_is_dropped(hosts):
    """A worker that stages an item only after the stage timeout, when
    vLLM already loaded it by copy: the load's end tells the workers to let
    go, so the late copy does not hold the staging room for stage_ttl_s."""
    saved(hosts, 14, ["l-1:64:512"])
    sched, wconn = instance(hosts.extra(hosts.b, zero_copy=False, stage_timeout_ms=300))
    late = hold_stage(wconn, then_copy=True)
    try:
        req = roles.request("r", [("l-1", 64)])
        assert wait_ready(sched, req, 8.0)[0]  # at the stage timeout
        _, cache, _ = load_step(sched, wconn, [req])  # a copy in the step
        assert "l-1" in cache
        late.set()  # now the worker stages it
        wait_for(lambda: "l-1" in wconn.worker.staged)
        sched.build_connector_meta(roles.scheduler_output(None))  # the next step
        wait_for(lambda: "l-1" not in wconn.worker.staged)
        assert wconn.worker.staged == {} and wconn.worker.staged_bytes == 0
    finally:
        late.set()
        sched.shutdown()
        wconn.shutdown()


def test_deeply_nested_json_does_not_kill_the_hub(hosts):
    """A same-user peer sending a deeply nested JSON line (RecursionError,
    not ValueError) is cut off; the hub still reads the real worker's
    answers, so an item is ready as soon as it is staged, not at the stage
    timeout."""
    sched, wconn = instance(hosts.extra(hosts.b, zero_copy=False, stage_timeout_ms=5000))
    try:
        junk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        junk.settimeout(3.0)
        junk.connect("\0" + hub_name(sched))
        try:
            junk.sendall(b"[" * 200000 + b"]" * 200000 + b"\n")
            assert junk.recv(10) == b""
        except (BrokenPipeError, ConnectionResetError):
            pass
        junk.close()
        saved(hosts, 15, ["n-1:64:512"])
        t0 = time.monotonic()
        assert wait_ready(sched, roles.request("r", [("n-1", 64)]), 8.0)[0]
        assert time.monotonic() - t0 < 4.0, "ready only at the stage timeout: the hub stopped reading"
        assert "n-1" in wconn.worker.staged
    finally:
        sched.shutdown()
        wconn.shutdown()


def test_stage_messages_are_checked_before_anything_is_allocated(hosts):
    """A shape that does not match its size allocates nothing and fails;
    a hash named twice in one message is staged and counted once."""
    saved(hosts, 16, ["c-1:64:512"])
    sched, wconn = instance(hosts.extra(hosts.a, zero_copy=False))  # its servers: the item's holder
    w = wconn.worker
    try:
        from ecstore import tensors as _tt

        bf16 = _tt.parse_dtype("bfloat16")
        staged, failed = w._stage_fetch([("c-huge", 64, bf16, (1 << 32, 1 << 32))])
        assert staged == [] and failed == ["c-huge"]
        spec = ("c-1", 64 * 512 * 2, bf16, (64, 512))
        staged, failed = w._stage_fetch([spec, spec])
        assert staged == ["c-1"] and failed == []
        assert w.staged_bytes == 64 * 512 * 2
    finally:
        sched.shutdown()
        wconn.shutdown()
