"""ecstore.pinned.HostPool: tensors carved from libecstore's pinned pool,
returned to it when garbage collected."""

import gc
import threading

import pytest
import torch

import ecstore
from ecstore.pinned import HostPool


def test_tensor_shape_dtype_and_return_on_gc():
    pool = HostPool(8 << 20)
    t = pool.tensor(torch.bfloat16, (650, 2048))
    assert t.dtype == torch.bfloat16 and tuple(t.shape) == (650, 2048) and t.is_contiguous()
    t.fill_(1.5)
    assert float(t[649, 2047]) == 1.5
    st = pool.stats()
    assert st["live_allocs"] == 1 and st["bytes_requested"] == 650 * 2048 * 2
    view = t[10:20]  # a view keeps the block alive
    del t
    gc.collect()
    assert pool.stats()["live_allocs"] == 1
    del view
    gc.collect()
    assert pool.stats()["live_allocs"] == 0


def test_full_pool_gives_none_and_room_comes_back():
    pool = HostPool(1 << 20)
    a = pool.tensor(torch.uint8, (768 << 10,))
    assert a is not None
    assert pool.tensor(torch.uint8, (512 << 10,)) is None  # no room now
    assert pool.tensor(torch.uint8, (4 << 20,)) is None  # never fits
    del a
    gc.collect()
    assert pool.tensor(torch.uint8, (512 << 10,)) is not None


def test_blocks_are_distinct_and_keep_their_bytes():
    pool = HostPool(4 << 20)
    ts = [pool.tensor(torch.int32, (1000, 10)) for _ in range(20)]
    for i, t in enumerate(ts):
        t.fill_(i)
    for i, t in enumerate(ts):
        assert int(t.min()) == i == int(t.max())


def test_pool_outlives_its_owner_while_tensors_live():
    pool = HostPool(1 << 20)
    t = pool.tensor(torch.float32, (256,))
    t.fill_(3.0)
    del pool
    gc.collect()
    assert float(t.sum()) == 768.0  # the region is still mapped


def test_free_from_other_threads():
    pool = HostPool(16 << 20)
    ts = [pool.tensor(torch.uint8, (64 << 10,)) for _ in range(100)]
    threads = [threading.Thread(target=lambda chunk=ts[i::4]: chunk.clear()) for i in range(4)]
    ts = None
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    gc.collect()
    assert pool.stats()["live_allocs"] == 0


def test_bad_size_raises():
    with pytest.raises(ecstore.EcstoreError):
        HostPool(0)
