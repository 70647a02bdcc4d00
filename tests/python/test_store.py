"""The Mooncake-named raw calls: pointers and sizes in, per-item ints out."""

import ctypes

import numpy as np
import pytest

import ecstore


def buf(n, fill=0):
    a = np.full(n, fill, dtype=np.uint8)
    return a, a.ctypes.data


def test_batch_put_from_and_get_into_with_misses(store, uniq):
    keys = [uniq("k") for _ in range(4)]
    srcs = [np.random.default_rng(i).integers(0, 256, 1000 + i * 4096, dtype=np.uint8) for i in range(4)]
    st = store.batch_put_from(keys[:3], [s.ctypes.data for s in srcs[:3]], [s.nbytes for s in srcs[:3]])
    assert st == [0, 0, 0]
    dsts = [np.zeros(s.nbytes, dtype=np.uint8) for s in srcs]
    got = store.batch_get_into(keys, [d.ctypes.data for d in dsts], [d.nbytes for d in dsts])
    assert got[:3] == [s.nbytes for s in srcs[:3]]
    assert got[3] == ecstore.ENOTFOUND
    for s, d in zip(srcs[:3], dsts[:3]):
        assert np.array_equal(s, d)
    assert not dsts[3].any()  # a miss writes nothing


def test_get_into_small_buffer_is_ebufsmall(store, uniq):
    k = uniq()
    src, p = buf(5000, 7)
    assert store.put_from(k, p, 5000) == 0
    small, sp = buf(4999)
    assert store.get_into(k, sp, 4999) == ecstore.EBUFSMALL
    assert not small.any()
    big, bp = buf(8192)
    assert store.get_into(k, bp, 8192) == 5000
    assert (big[:5000] == 7).all() and not big[5000:].any()


def test_is_exist_and_remove(store, uniq):
    k1, k2 = uniq(), uniq()
    a, p = buf(64, 1)
    store.put_from(k1, p, 64)
    assert store.batch_is_exist([k1, k2]) == [1, 0]
    assert store.is_exist(k1) == 1
    assert store.remove(k1) == 0
    assert store.remove(k1) == ecstore.ENOTFOUND
    assert store.batch_remove([k1, k2]) == [ecstore.ENOTFOUND, ecstore.ENOTFOUND]
    assert store.batch_is_exist([k1]) == [0]


def test_put_is_idempotent_and_conflicts_on_other_bytes(store, uniq):
    k = uniq()
    a, p = buf(100, 1)
    b, q = buf(100, 2)
    assert store.batch_put_from([k, k], [p, p], [100, 100]) == [0, 0]
    assert store.put_from(k, q, 100) == ecstore.ECONFLICT


def test_bad_key_fails_only_its_item(store, uniq):
    k = uniq()
    a, p = buf(10, 3)
    st = store.batch_put_from([k, "x" * 300, b""], [p, p, p], [10, 10, 10])
    assert st == [0, ecstore.EKEY, ecstore.EKEY]
    assert store.batch_is_exist([k]) == [1]


def test_bytes_keys_and_str_keys_are_the_same(store, uniq):
    k = uniq()
    a, p = buf(10, 3)
    store.put_from(k.encode(), p, 10)
    assert store.is_exist(k) == 1


def test_length_mismatch_raises(store):
    with pytest.raises(ecstore.InvalidArgumentError, match="2 keys but 1"):
        store.batch_put_from(["a", "b"], [1], [1, 2])


def test_empty_batches(store):
    assert store.batch_put_from([], [], []) == []
    assert store.batch_get_into([], [], []) == []
    assert store.batch_is_exist([]) == []


def test_register_buffer_records_and_validates(store):
    a, p = buf(1 << 20)
    assert store.register_buffer(p, a.nbytes) == 0
    assert store.register_buffer(p, a.nbytes) == 0  # a retry is a no-op
    assert store.registered_buffers() == {p: a.nbytes}
    with pytest.raises(ecstore.InvalidArgumentError, match="overlaps"):
        store.register_buffer(p + 4096, 4096)
    with pytest.raises(ecstore.InvalidArgumentError, match="bad region"):
        store.register_buffer(0, 10)
    with pytest.raises(ecstore.InvalidArgumentError, match="bad region"):
        store.register_buffer(p, 0)
    with pytest.raises(TypeError):
        store.register_buffer(float(p), 10)
    # Transfers into a registered region work as any other.
    k = "regbuf-%d" % p
    a[:] = 9
    assert store.put_from(k, p, 4096) == 0
    a[:] = 0
    assert store.get_into(k, p + 8192, 4096) == 4096
    assert (a[8192:8192 + 4096] == 9).all()
    assert store.unregister_buffer(p) == 0
    assert store.registered_buffers() == {}
    with pytest.raises(ecstore.NotFoundError, match="no registered buffer"):
        store.unregister_buffer(p)


def test_register_buffer_reaches_every_c_handle(store):
    """The C client knows the region (a second C registration says EBUSY),
    on this thread's handle and on one a new thread opens afterwards."""
    import threading
    lib = ecstore._lib.lib()
    a, p = buf(1 << 16)
    assert store.register_buffer(p, a.nbytes) == 0
    assert lib.ecs_register_buffer(store._handle().ptr, p, a.nbytes) == ecstore.codes.EBUSY
    seen = []

    def other():
        seen.append(lib.ecs_register_buffer(store._handle().ptr, p, a.nbytes))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == [ecstore.codes.EBUSY]
    assert store.unregister_buffer(p) == 0
    assert lib.ecs_unregister_buffer(store._handle().ptr, p) == ecstore.codes.ENOTFOUND


def test_stat_ping_server_count(store):
    store.ping()
    assert store.server_count() == 1
    st = store.stat(0)
    assert st["pool_size"] == 128 << 20
    assert st["address"].startswith("127.0.0.1:")
    assert st["pool_cuda_registered"] == 0  # the fixture's server has no --cuda-register


def test_connect_forms(cluster):
    cfg = cluster.config()
    with ecstore.Store(cfg) as s1:
        s1.ping()
    s2 = ecstore.Store()
    assert s2.setup(servers=[cluster.servers], redis_url=cluster.redis_url, ns="pytest", verify_checksum=True) == 0
    s2.ping()
    with pytest.raises(ecstore.InvalidArgumentError, match="already set up"):
        s2.setup(cfg)
    s2.close()


def test_connect_from_json_file(cluster, tmp_path):
    import json

    p = tmp_path / "ecstore.json"
    p.write_text(json.dumps(cluster.config()))
    with ecstore.connect(str(p)) as s:
        s.ping()


def test_exists_without_redis_asks_servers(cluster, uniq):
    cfg = cluster.config()
    del cfg["redis_url"]
    with ecstore.connect(cfg) as s:
        k = uniq()
        a, p = buf(10, 1)
        s.put_from(k, p, 10)
        assert s.batch_is_exist([k, uniq()]) == [1, 0]
