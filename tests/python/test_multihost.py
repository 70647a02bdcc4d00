"""Servers discovered from Redis's registry through the Python binding
(issue 14; docs/multihost.md): a config with only redis_url and a
namespace finds the servers, and placement is a config key."""

import numpy as np
import pytest

import ecstore
from conftest import NAMESPACE, start_server


def test_discovery_config_finds_servers_and_places_puts(private_cluster, uniq):
    second = start_server(private_cluster.redis.port)
    try:
        cfg = {"redis_url": private_cluster.redis_url, "namespace": NAMESPACE, "placement": "hash",
               "registry_refresh_ms": 200, "timeout_ms": 5000}
        with ecstore.connect(cfg) as s:
            assert s.server_count() == 2
            keys = [uniq("m") for _ in range(40)]
            srcs = [np.random.default_rng(i).integers(0, 256, 2048, dtype=np.uint8) for i in range(40)]
            assert s.batch_put_from(keys, [a.ctypes.data for a in srcs], [a.nbytes for a in srcs]) == [0] * 40
            dsts = [np.zeros(2048, dtype=np.uint8) for _ in srcs]
            assert s.batch_get_into(keys, [d.ctypes.data for d in dsts], [d.nbytes for d in dsts]) == [2048] * 40
            for a, d in zip(srcs, dsts):
                assert np.array_equal(a, d)
            # both servers hold some: the puts were spread by rendezvous hashing
            assert all(s.stat(i)["objects"] > 0 for i in range(2))
    finally:
        second.stop()


def test_unknown_placement_is_refused(private_cluster):
    with pytest.raises(ecstore.EcstoreError, match="unknown placement"):
        ecstore.connect({"redis_url": private_cluster.redis_url, "namespace": NAMESPACE, "placement": "closest"})


def test_connector_without_servers_uses_the_registry(private_cluster, uniq):
    """The EC connector with only redis_url and a namespace (servers now
    optional): a producer saves with placement local, a consumer loads."""
    if not ecstore.has_connector():
        pytest.skip("libecstore has no ec_connector")
    import torch

    second = start_server(private_cluster.redis.port)
    try:
        cfg = {"backend": "ecstore", "redis_url": private_cluster.redis_url, "namespace": NAMESPACE,
               "placement": "local", "timeout_ms": 5000, "staging_bytes": "16M"}
        hashes = [uniq("c") for _ in range(6)]
        cache = {h: torch.full((33, 64), float(i), dtype=torch.bfloat16) for i, h in enumerate(hashes)}
        with ecstore.ECConnector(cfg) as prod, ecstore.ECConnector(cfg) as cons:
            for h in hashes:
                prod.save_caches(cache, h)
            assert prod.wait_for_save() == []
            assert cons.has_caches(hashes) == [True] * 6
            outs = {h: torch.empty(33, 64, dtype=torch.bfloat16) for h in hashes}
            with cons.start_load_caches(outs) as ld:
                got = ld.wait()
                assert ld.statuses == [0] * 6
            for i, h in enumerate(hashes):
                assert torch.equal(got[i], cache[h])
    finally:
        second.stop()


def test_replicas_two_copies_survive_a_killed_server(private_cluster, uniq):
    """replicas=2 over two servers: each holds every object; with one killed
    (SIGKILL: still in the registry until its TTL), every get is answered
    from the other copy with the right bytes."""
    second = start_server(private_cluster.redis.port, "--heartbeat-ttl", "2")
    try:
        cfg = {"redis_url": private_cluster.redis_url, "namespace": NAMESPACE, "replicas": 2,
               "registry_refresh_ms": 200, "timeout_ms": 5000}
        with ecstore.connect(cfg) as s:
            assert s.server_count() == 2
            keys = [uniq("r") for _ in range(20)]
            srcs = [np.random.default_rng(100 + i).integers(0, 256, 2048, dtype=np.uint8) for i in range(20)]
            assert s.batch_put_from(keys, [a.ctypes.data for a in srcs], [a.nbytes for a in srcs]) == [0] * 20
            assert s.put_copies() == (40, 40)
            before = [s.stat(i)["objects"] for i in range(2)]
            assert all(n >= 20 for n in before)
            second.proc.kill()
            second.proc.wait()
            dsts = [np.zeros(2048, dtype=np.uint8) for _ in srcs]
            assert s.batch_get_into(keys, [d.ctypes.data for d in dsts], [d.nbytes for d in dsts]) == [2048] * 20
            for a, d in zip(srcs, dsts):
                assert np.array_equal(a, d)
    finally:
        second.stop()


def test_replicas_with_a_servers_list_is_refused(private_cluster):
    with pytest.raises(ecstore.EcstoreError, match="replicas 2 needs the servers from Redis"):
        ecstore.connect({"servers": "127.0.0.1:%d" % private_cluster.server.port,
                         "redis_url": private_cluster.redis_url, "namespace": NAMESPACE, "replicas": 2})


def test_connector_replicas_key(private_cluster, uniq):
    """The EC connector's "replicas" key: each save lands on both servers,
    and a consumer still loads everything after one server stops."""
    if not ecstore.has_connector():
        pytest.skip("libecstore has no ec_connector")
    import torch

    second = start_server(private_cluster.redis.port)
    try:
        cfg = {"backend": "ecstore", "redis_url": private_cluster.redis_url, "namespace": NAMESPACE,
               "replicas": 2, "timeout_ms": 5000, "staging_bytes": "16M"}
        hashes = [uniq("cr") for _ in range(6)]
        cache = {h: torch.full((33, 64), float(i), dtype=torch.bfloat16) for i, h in enumerate(hashes)}
        with ecstore.connect({"redis_url": private_cluster.redis_url, "namespace": NAMESPACE}) as s:
            before = [s.stat(i)["objects"] for i in range(2)]
            with ecstore.ECConnector(cfg) as prod:
                for h in hashes:
                    prod.save_caches(cache, h)
                assert prod.wait_for_save() == []
            assert [s.stat(i)["objects"] - before[i] for i in range(2)] == [6, 6]
        second.stop()
        with ecstore.ECConnector(cfg) as cons:
            assert cons.has_caches(hashes) == [True] * 6
            outs = {h: torch.empty(33, 64, dtype=torch.bfloat16) for h in hashes}
            with cons.start_load_caches(outs) as ld:
                got = ld.wait()
                assert ld.statuses == [0] * 6
            for i, h in enumerate(hashes):
                assert torch.equal(got[i], cache[h])
    finally:
        second.stop()
