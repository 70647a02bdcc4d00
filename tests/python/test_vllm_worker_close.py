"""The worker side of ecstore.vllm.ECStoreConnector: the status of saves
through the C connector's backends (redis, disk) when their wait ends
early, and what shutdown() releases.  Real vLLM modules, a real
redis-server and ecstore-servers started here.

- A save the C connector's wait did not see end is a failure, not a save
  (it used to count as saved when the wait's deadline passed).
- shutdown() frees the pinned load pool once its last tensor dies (the
  worker used to keep it), refuses later saves without keeping their
  tensors (they used to sit in a queue no thread read), and swaps the views
  vLLM still holds for copies before it closes the Store (whose closing
  lets the server reuse the bytes under them).
"""

import gc
import sys
import os
import weakref

import pytest
import torch
import vllm

from conftest import start_server

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vllm_roles as roles  # noqa: E402
from test_vllm_async import Hosts, bits, load_step, producer, wait_ready, worker  # noqa: E402

import ecstore  # noqa: E402
from ecstore import codes  # noqa: E402
from ecstore.vllm_worker import _mapping_of  # noqa: E402


@pytest.fixture
def hosts():
    h = Hosts()
    yield h
    h.stop()
    vllm.distributed.ec_transfer.ensure_ec_transfer_shutdown()


def mapped(name):
    """Whether a mapping of this process is named name (a memfd's name)."""
    with open("/proc/self/maps") as f:
        return any(name in line for line in f)


def test_saves_past_the_wait_deadline_on_the_redis_backend_fail(hosts):
    """backend redis, Redis stopped: the C connector's wait for the saves
    ends at its deadline with nothing stored; every save is a failure
    (ETIMEDOUT), none is reported saved.  Once Redis is back, a new save is
    stored and the late end of the old ones is not reported again."""
    extra = {"backend": "redis", "redis_url": hosts.url, "namespace": "pytest", "timeout_ms": 500}
    wconn = producer(extra)
    try:
        assert wconn.worker.marks is None  # no pending marks: the C connector's path
        hosts.redis.pause()
        cache = {"k-%d" % i: roles.embedding(1, "k-%d" % i, 16, 64, torch.bfloat16) for i in range(3)}
        for h in cache:
            wconn.save_caches(cache, h)
        failures = wconn.wait_for_save(8000)
        assert sorted(failures) == [(h, codes.ETIMEDOUT) for h in sorted(cache)]
        saved, _ = wconn.get_finished(set())
        assert not saved, "saves the store never confirmed were reported stored: %r" % (saved,)
        st = wconn.get_ec_connector_stats()
        assert st.data["saves"] == 0 and st.data["save_failed"] == 3
        hosts.redis.resume()
        cache["k-new"] = roles.embedding(1, "k-new", 16, 64, torch.bfloat16)
        wconn.save_caches(cache, "k-new")
        assert wconn.wait_for_save(8000) == []
        saved, _ = wconn.get_finished(set())
        assert saved == {"k-new"}
    finally:
        hosts.redis.resume()
        wconn.shutdown()


def test_disk_backend_saves_and_failures_keep_their_status(hosts, tmp_path):
    """backend disk: stored saves are reported saved; a save into a
    directory that went away fails with the backend's code."""
    d = tmp_path / "ec"
    d.mkdir()
    wconn = producer({"backend": "disk", "disk_path": str(d), "timeout_ms": 2000})
    try:
        cache = {"d-1": roles.embedding(2, "d-1", 8, 32, torch.float32)}
        wconn.save_caches(cache, "d-1")
        assert wconn.wait_for_save(8000) == []
        assert wconn.get_finished(set())[0] == {"d-1"}
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
        cache["d-2"] = roles.embedding(2, "d-2", 8, 32, torch.float32)
        wconn.save_caches(cache, "d-2")
        failures = wconn.wait_for_save(8000)
        assert [h for h, _ in failures] == ["d-2"] and failures[0][1] != 0
        assert not wconn.get_finished(set())[0]
    finally:
        wconn.shutdown()


def test_shutdown_frees_the_load_pool_with_its_last_tensor(hosts):
    """A consumer's copied load lands in the pinned load pool; after
    shutdown the pool stays while vLLM holds that tensor, and goes (its
    memfd unmapped) once the tensor dies.  No later call makes a new one."""
    pextra = hosts.extra(hosts.a)
    assert roles.save_all(roles.vllm_config("ec_both", pextra), 3, ["c-1:64:256"]) == []
    cextra = hosts.extra(hosts.a, zero_copy=False, prefetch=False, load_pool_bytes="4M")
    sched = roles.scheduler(roles.vllm_config("ec_consumer", cextra))
    wconn = worker(cextra)
    name = "ecstore-vllm-load"
    try:
        req = roles.request("r", [("c-1", 64)])
        assert wait_ready(sched, req, 8.0)[0]
        _, cache, _ = load_step(sched, wconn, [req])
        want = roles.embedding(3, "c-1", 64, 256, torch.bfloat16)
        assert torch.equal(bits(cache["c-1"]), bits(want))
        assert wconn.worker.host.stats()["live_allocs"] == 1  # the load is in the pool
        assert mapped(name)
    finally:
        sched.shutdown()
        wconn.shutdown()
    assert torch.equal(bits(cache["c-1"]), bits(want))  # still valid: its pool lives on
    assert mapped(name)
    del cache
    gc.collect()
    assert not mapped(name), "the load pool outlived shutdown and its last tensor"
    assert wconn.worker._host_pool() is None


def test_save_after_shutdown_fails_and_keeps_no_tensor(hosts):
    """After shutdown a save has no thread to store it: it fails at once
    (ENOTCONN), and the tensor is not kept."""
    wconn = producer(hosts.extra(hosts.a))
    wconn.shutdown()
    cache = {"late": torch.ones(1024, 256)}
    ref = weakref.ref(cache["late"])
    wconn.save_caches(cache, "late")
    assert wconn.wait_for_save(100) == [("late", codes.ENOTCONN)]
    del cache
    gc.collect()
    assert ref() is None, "a save after shutdown kept its tensor"


def test_shutdown_swaps_held_views_for_copies_and_unmaps_the_pool(hosts):
    """A consumer's load is a view of the local server's pool.  shutdown()
    closes the Store, which drops the pins: the server may then reuse the
    bytes.  The tensor vLLM still holds in its encoder_cache must keep the
    item's bytes after the server evicted the item and reused its block,
    and the mapping of the server's pool goes."""
    small = start_server(hosts.redis.port, pool="8M")
    try:
        pextra = hosts.extra(hosts.a)
        cextra = hosts.extra(small, protocol="shm")
        assert roles.save_all(roles.vllm_config("ec_both", pextra), 4, ["v-0:512:1024"]) == []  # 1 MB
        sched = roles.scheduler(roles.vllm_config("ec_consumer", cextra))
        wconn = worker(cextra)
        try:
            req = roles.request("r", [("v-0", 512)])
            assert wait_ready(sched, req, 8.0)[0]
            _, cache, _ = load_step(sched, wconn, [req])
            want = roles.embedding(4, "v-0", 512, 1024, torch.bfloat16)
            assert torch.equal(bits(cache["v-0"]), bits(want))
            addr = cache["v-0"].data_ptr()
            pool_map = _mapping_of(addr)
            assert pool_map is not None and wconn.worker.leases  # a view of the server's pool
        finally:
            sched.shutdown()
            wconn.shutdown()
        assert not wconn.worker.leases
        with ecstore.connect(servers=cextra["servers"], namespace="pytest") as s:
            for i in range(12):  # 12 MB through an 8 MB pool: the item goes, its block is reused
                s.put_tensor("fill-%d" % i, torch.zeros(512, 1024, dtype=torch.bfloat16))
            assert s.stat(0)["evictions"] > 0
        assert torch.equal(bits(cache["v-0"]), bits(want)), "a tensor vLLM held changed after shutdown"
        gc.collect()
        assert _mapping_of(addr) != pool_map, "the server's pool is still mapped after shutdown"
    finally:
        small.stop()
