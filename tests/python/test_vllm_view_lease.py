"""How long the consumer worker holds a view it handed vLLM: the item
stays pinned in the local server's pool while any tensor over its bytes
lives, the slices vLLM makes of it included (vLLM gathers embeddings as
slices of the encoder-cache entry, which may outlive the entry), and goes
back once the last one died.  A view released early lets the server evict
the item and reuse its block under the slice: the test fills the pool and
checks both the object's presence and the slice's bytes.  Real vLLM
modules, a real redis-server and ecstore-servers started here.

Also the DLPack tensors themselves (ecstore.tensors.DLBox): a view's
tensor has the stored dtype and shape over the pool's bytes, and its token
comes back only after its last slice died.
"""

import gc
import os
import sys
import time

import numpy as np
import pytest
import torch
import vllm

from conftest import start_server

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vllm_roles as roles  # noqa: E402
from test_vllm_async import Hosts, bits, load_step, wait_ready, worker  # noqa: E402

import ecstore  # noqa: E402
from ecstore import tensors as T  # noqa: E402

MB = 1 << 20


@pytest.fixture
def hosts():
    h = Hosts()
    yield h
    h.stop()
    vllm.distributed.ec_transfer.ensure_ec_transfer_shutdown()


def step(wconn, cache):
    """An engine step with nothing to load: the worker's housekeeping runs
    (it releases the views whose tensors died)."""
    wconn.bind_connector_metadata(ecstore.vllm.ECStoreConnectorMetadata())
    wconn.start_load_caches(cache)
    wconn.get_finished(set())
    wconn.clear_connector_metadata()


def fill(store, rounds):
    """Puts rounds MB through the local server's 8 MB pool: every object
    no one pins is evicted and its block reused."""
    for j in range(rounds):
        store.put_tensor("fill-%d" % j, torch.zeros(512, 1024, dtype=torch.uint8))


def test_view_held_while_only_a_slice_lives_and_released_after(hosts):
    small = start_server(hosts.redis.port, pool="8M")
    try:
        pextra = hosts.extra(hosts.a)
        cextra = hosts.extra(small, protocol="shm")
        assert roles.save_all(roles.vllm_config("ec_both", pextra), 5, ["sl-0:512:1024"]) == []  # 1 MB
        want = roles.embedding(5, "sl-0", 512, 1024, torch.bfloat16)
        sched = roles.scheduler(roles.vllm_config("ec_consumer", cextra))
        wconn = worker(cextra)
        try:
            req = roles.request("r", [("sl-0", 512)])
            assert wait_ready(sched, req, 8.0)[0]
            _, cache, _ = load_step(sched, wconn, [req])
            t = cache["sl-0"]
            assert torch.equal(bits(t), bits(want))
            assert wconn.worker.leases, "the load was not a view of the local pool"
            # vLLM's gather: a slice of the entry, which outlives the entry.
            sl = t[100:300]
            del t, cache["sl-0"]
            sched.shutdown()  # the scheduler's pin goes: only the worker's view pins the item now
            gc.collect()
            step(wconn, cache)
            with ecstore.connect(servers=cextra["servers"], namespace="pytest", transport="tcp") as s:
                fill(s, 24)
                assert s.stat(0)["evictions"] > 0
                assert s.batch_is_exist(["sl-0"]) == [1], "the item went while a slice of its view lived"
                assert torch.equal(bits(sl), bits(want[100:300])), "the slice's bytes changed under it"
                assert wconn.worker.leases
                del sl
                gc.collect()
                step(wconn, cache)
                assert not wconn.worker.leases, "the view outlived its last tensor"
                fill(s, 24)
                assert s.batch_is_exist(["sl-0"]) == [0], "the item stayed pinned after its last slice died"
        finally:
            sched.shutdown()
            wconn.shutdown()
    finally:
        small.stop()


@pytest.mark.parametrize("dtype", ["bf16", "f32", "f16", "i64", "u8", "f8e4m3", "u16", "bool"])
def test_dlbox_tensor_is_the_view_and_reports_after_its_last_slice(hosts, dtype):
    code = T.parse_dtype(dtype)
    shape = (6, 10)
    raw = np.random.default_rng(code).integers(0, 2, size=shape[0] * shape[1] * T.dtype_size(code),
                                               dtype=np.uint8)
    with ecstore.connect(servers="127.0.0.1:%d" % hosts.b.port, namespace="pytest", transport="shm") as s:
        assert s.batch_put_tensors(["dl-%s" % dtype], [raw.view(T.numpy_dtype(code)).reshape(shape)],
                                   dtypes=[dtype]) == [0]
        views = s.get_views(["dl-%s" % dtype, "dl-absent"])
        box = T.DLBox()
        try:
            ts = box.tensors(views, 40)
            assert ts[1] is None  # not found: no tensor, no token
            t = ts[0]
            del ts
            assert tuple(t.shape) == shape and t.data_ptr() == views.address(0)
            if t.dtype != T.torch_dtype(code):
                t = t.view(T.torch_dtype(code))
            assert t.element_size() == T.dtype_size(code)
            assert bytes(t.contiguous().view(torch.uint8).reshape(-1).numpy()) == raw.tobytes()
            sl = t[2:4, 1:5]
            del t
            gc.collect()
            assert box.drain() == []
            del sl
            gc.collect()
            assert box.drain() == [40]
            assert box.drain() == []
        finally:
            box.close()
            views.release()


def test_view_kept_past_view_hold_s_is_swapped_for_a_copy_then_released(hosts):
    """A view vLLM keeps past view_hold_s becomes a copy in its encoder
    cache (the server's lease must not run out under it); the view goes
    once the last tensor over it died, and one dropped before is not
    copied."""
    pextra = hosts.extra(hosts.a)
    cextra = hosts.extra(hosts.b, protocol="shm", view_hold_s=0.3)
    specs = ["vh-0:64:256", "vh-1:64:256"]
    assert roles.save_all(roles.vllm_config("ec_both", pextra), 6, specs) == []
    sched = roles.scheduler(roles.vllm_config("ec_consumer", cextra))
    wconn = worker(cextra)
    try:
        reqs = [roles.request("r%d" % i, [("vh-%d" % i, 64)]) for i in range(2)]
        for r in reqs:
            assert wait_ready(sched, r, 8.0)[0]
        _, cache, _ = load_step(sched, wconn, reqs)
        w = wconn.worker
        assert len(w.leases) == 2
        ptr0 = cache["vh-0"].data_ptr()
        sl = cache["vh-0"][:8]  # lives on past the swap
        del cache["vh-1"]  # dropped before view_hold_s: nothing to copy
        gc.collect()
        step(wconn, cache)
        assert len(w.leases) == 1
        time.sleep(0.4)
        step(wconn, cache)
        t = cache["vh-0"]
        assert t.data_ptr() != ptr0, "not swapped for a copy past view_hold_s"
        want = roles.embedding(6, "vh-0", 64, 256, torch.bfloat16)
        assert torch.equal(bits(t), bits(want)) and torch.equal(bits(sl), bits(want[:8]))
        assert len(w.leases) == 1  # the slice still holds the view
        st = wconn.get_ec_connector_stats()
        assert st.data["load_copies"] == 1
        del sl
        gc.collect()
        step(wconn, cache)
        assert not w.leases
    finally:
        sched.shutdown()
        wconn.shutdown()


def test_dlbox_item_torch_refuses_is_deleted_and_its_token_comes_back(hosts):
    """An item torch's from_dlpack refuses gets no tensor; its DLPack
    tensor is deleted here (its token comes back), so the box frees it."""
    with ecstore.connect(servers="127.0.0.1:%d" % hosts.b.port, namespace="pytest", transport="shm") as s:
        s.put_tensor("dl-refused", torch.ones(4, 4))
        views = s.get_views(["dl-refused"])
        box = T.DLBox()
        try:
            def refuse(cap):
                raise RuntimeError("unsupported")

            box._from = refuse
            assert box.tensors(views, 7) == [None]
            assert box.drain() == [7]
        finally:
            box.close()
            views.release()


def test_views_of_carrier_dtypes_have_the_stored_dtype(hosts):
    """Items whose dtype DLPack tensors carry as another of the same size
    (float8, bool, u16) or that share the carriers' torch dtypes (u8, i16)
    reach vLLM with the stored dtype and bytes."""
    cextra = hosts.extra(hosts.b, protocol="shm")
    names = ["u16", "f8e4m3", "bool", "i16", "u8", "f16"]
    want = {}
    with ecstore.connect(servers=cextra["servers"], redis_url=hosts.url, namespace="pytest",
                         transport="shm") as s:
        for n in names:
            code = T.parse_dtype(n)
            raw = np.random.default_rng(code).integers(0, 2, size=64 * 32 * T.dtype_size(code), dtype=np.uint8)
            arr = raw.view(T.numpy_dtype(code)).reshape(64, 32)
            assert s.batch_put_tensors(["cd-" + n], [arr], dtypes=[n]) == [0]
            want[n] = (T.torch_dtype(code), raw.tobytes())
    sched = roles.scheduler(roles.vllm_config("ec_consumer", cextra))
    wconn = worker(cextra)
    try:
        reqs = [roles.request("r-" + n, [("cd-" + n, 64)]) for n in names]
        for r in reqs:
            assert wait_ready(sched, r, 8.0)[0]
        _, cache, _ = load_step(sched, wconn, reqs)
        assert len(wconn.worker.leases) == len(names)  # views, not copies
        for n in names:
            t = cache["cd-" + n]
            assert t.dtype == want[n][0], n
            assert tuple(t.shape) == (64, 32)
            assert bytes(bits(t).numpy()) == want[n][1], n
    finally:
        sched.shutdown()
        wconn.shutdown()
