"""ECConnector: vLLM's EC connector roles over the C ec_connector, on each
backend (ecstore, disk, redis), against real processes."""

import threading

import numpy as np
import pytest

import ecstore

import torch  # noqa: E402

if not ecstore.has_connector():
    pytest.skip("libecstore at %s has no ec_connector" % ecstore.lib_path(), allow_module_level=True)


@pytest.fixture(params=["ecstore", "disk", "redis"])
def conn_config(request, cluster, tmp_path):
    cfg = {"backend": request.param, "namespace": "pytest", "redis_url": cluster.redis_url, "timeout_ms": 5000,
           "staging_bytes": "16M", "queue_depth": 64}
    if request.param == "ecstore":
        cfg["servers"] = cluster.servers
    if request.param == "disk":
        cfg["disk_path"] = str(tmp_path)
    return cfg


def emb(seed, tokens=65, hidden=128, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, hidden, generator=g).to(dtype)


def test_producer_scheduler_consumer(conn_config, uniq):
    hashes = [uniq("h") for _ in range(4)]
    cache = {h: emb(i) for i, h in enumerate(hashes)}
    with ecstore.ECConnector(conn_config) as prod, ecstore.ECConnector(conn_config) as cons:
        assert prod.describe().startswith(conn_config["backend"])
        for h in hashes[:3]:
            prod.save_caches(cache, h)
        assert prod.wait_for_save() == []
        assert prod.save_pending() == 0
        assert cons.has_caches(hashes) == [True, True, True, False]
        assert cons.has_cache_item(hashes[0]) and not cons.has_cache_item(hashes[3])
        outs = {h: torch.empty(65, 128, dtype=torch.bfloat16) for h in hashes}
        with cons.start_load_caches(outs) as ld:
            got = ld.wait()
            assert ld.statuses == [0, 0, 0, ecstore.ENOTFOUND]
        for i in range(3):
            assert got[i].dtype == torch.bfloat16 and got[i].shape == (65, 128)
            assert torch.equal(got[i], cache[hashes[i]])
            assert got[i].data_ptr() == outs[hashes[i]].data_ptr()  # loaded in place
        assert got[3] is None
        st = prod.stats()
        assert st["saves"] == 3 and st["saves_stored"] == 3
        assert cons.stats()["load_hits"] == 3


def test_numpy_and_larger_staging_outs(conn_config, uniq):
    h = uniq()
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    with ecstore.ECConnector(conn_config) as c:
        c.save(h, a)
        assert c.wait_for_save() == []
        staging = np.zeros(100, np.float32)
        got = c.load_caches([(h, staging)])
        assert got[0].shape == (2, 3, 4) and np.array_equal(got[0], a)
        # expected_nbytes that differs: a miss, never wrong bytes
        with c.start_load_caches([(h, staging)], expected_nbytes=[4 * 25]) as ld:
            assert ld.wait() == [None]
            assert ld.statuses == [ecstore.EDTYPE]
        # an out too small: EBUFSMALL miss
        with c.start_load_caches([(h, np.zeros(3, np.float32))]) as ld:
            assert ld.wait() == [None] and ld.statuses == [ecstore.EBUFSMALL]
        # an out of another dtype: a miss with EDTYPE, the bytes are not handed out
        with c.start_load_caches([(h, np.zeros(24, np.int32))]) as ld:
            assert ld.wait() == [None] and ld.statuses == [ecstore.EDTYPE]


def test_poll(conn_config, uniq):
    h = uniq()
    with ecstore.ECConnector(conn_config) as c:
        c.save(h, emb(1))
        c.wait_for_save()
        ld = c.start_load_caches({h: torch.empty(65, 128, dtype=torch.bfloat16)})
        for _ in range(1000):
            if ld.poll():
                break
            threading.Event().wait(0.005)
        assert ld.statuses == [0]
        ld.release()
        ld.release()  # idempotent
        with pytest.raises(ecstore.InvalidArgumentError, match="released"):
            ld.wait()


def test_config_errors_carry_c_text(cluster):
    with pytest.raises(ecstore.InvalidArgumentError, match="bogus"):
        ecstore.ECConnector({"backend": "ecstore", "bogus": 1})
    with pytest.raises(ecstore.InvalidArgumentError, match="protocol"):
        ecstore.ECConnector(backend="ecstore", servers=cluster.servers, protocol="carrier-pigeon")
    with pytest.raises(ecstore.EcstoreError, match="127.0.0.1"):
        ecstore.ECConnector(backend="ecstore", servers="127.0.0.1:1", redis_url=cluster.redis_url,
                            connect_timeout_ms=300, timeout_ms=300)


def test_config_from_json_string_and_file(cluster, tmp_path):
    import json

    cfg = {"backend": "ecstore", "servers": cluster.servers, "namespace": "pytest", "redis_url": cluster.redis_url}
    with ecstore.ECConnector(json.dumps(cfg)) as c:
        assert c.describe().startswith("ecstore")
    p = tmp_path / "ec.json"
    p.write_text(json.dumps(cfg))
    with ecstore.ECConnector(str(p)) as c:
        assert c.has_caches([]) == []


def test_save_errors_raise_and_queue_nothing(cluster, uniq):
    cfg = {"backend": "ecstore", "servers": cluster.servers, "namespace": "pytest", "redis_url": cluster.redis_url,
           "staging_bytes": "64K"}
    with ecstore.ECConnector(cfg) as c:
        with pytest.raises(ecstore.NoSpaceError):
            c.save(uniq(), np.zeros(1 << 20, np.uint8))  # larger than the staging pool
        with pytest.raises(ecstore.InvalidArgumentError):
            c.save("x" * 300, np.zeros(4, np.uint8))
        with pytest.raises(ecstore.InvalidArgumentError, match="no ecstore dtype"):
            c.save(uniq(), np.zeros(4, np.complex64))  # float64 is a dtype now (Mooncake has it)
        assert c.save_pending() == 0
        assert c.stats()["saves"] == 0


def test_failed_saves_reach_wait_for_save(private_cluster, uniq):
    cfg = {"backend": "ecstore", "servers": private_cluster.servers, "namespace": "pytest",
           "redis_url": private_cluster.redis_url, "timeout_ms": 500, "connect_timeout_ms": 300}
    with ecstore.ECConnector(cfg) as c:
        private_cluster.server.stop()
        hs = [uniq() for _ in range(3)]
        for h in hs:
            c.save(h, np.ones(16, np.float32))
        failures = c.wait_for_save(timeout_ms=10000)
        assert sorted(f.mm_hash for f in failures) == sorted(hs)
        assert all(f.code in (ecstore.ECONN, ecstore.ETIMEDOUT) for f in failures)
        assert isinstance(failures[0].error, ecstore.EcstoreError)
        assert c.wait_for_save() == []  # reported once, never dropped nor repeated


def test_has_caches_error_is_never_exists(private_cluster, uniq):
    cfg = {"backend": "ecstore", "servers": private_cluster.servers, "namespace": "pytest",
           "redis_url": private_cluster.redis_url, "timeout_ms": 400}
    with ecstore.ECConnector(cfg) as c:
        h = uniq()
        c.save(h, np.ones(4, np.float32))
        assert c.wait_for_save() == []
        assert c.has_caches([h]) == [True]
        # Redis frozen: the servers answer instead, truthfully.
        private_cluster.redis.pause()
        try:
            assert c.has_caches([h, uniq()]) == [True, False]
            # Redis and the server both frozen: an error, never "exists".
            private_cluster.server.pause()
            try:
                with pytest.raises(ecstore.EcstoreError):
                    c.has_caches([h])
            finally:
                private_cluster.server.resume()
        finally:
            private_cluster.redis.resume()


def test_threads_share_a_connector(conn_config, uniq):
    prefix = uniq()
    errors = []
    with ecstore.ECConnector(conn_config) as c:
        def work(i):
            try:
                hs = ["%s-%d-%d" % (prefix, i, j) for j in range(10)]
                ts = [emb(i * 100 + j, tokens=8, hidden=16) for j in range(10)]
                for h, t in zip(hs, ts):
                    c.save(h, t)
                assert c.wait_for_save() == []
                outs = [torch.empty(8, 16, dtype=torch.bfloat16) for _ in hs]
                got = c.load_caches(list(zip(hs, outs)))
                assert all(torch.equal(g, t) for g, t in zip(got, ts))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        th = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in th:
            t.start()
        for t in th:
            t.join(60)
    assert not errors, errors


def test_close_releases_open_loads_and_then_refuses(conn_config, uniq):
    c = ecstore.ECConnector(conn_config)
    ld = c.start_load_caches({uniq(): np.zeros(4, np.float32)})
    c.close()
    c.close()
    with pytest.raises(ecstore.ConnectionFailedError, match="closed"):
        c.has_caches(["x"])
    with pytest.raises(ecstore.InvalidArgumentError, match="released"):
        ld.wait()
