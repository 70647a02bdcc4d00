"""C errors become Python exceptions carrying the C library's text."""

import time

import numpy as np
import pytest

import ecstore
from conftest import free_port


def test_connection_refused_carries_c_text():
    port = free_port()
    with pytest.raises(ecstore.ConnectionFailedError) as e:
        ecstore.connect(servers="127.0.0.1:%d" % port, connect_timeout_ms=500)
    err = e.value
    assert isinstance(err, ecstore.EcstoreError) and isinstance(err, ConnectionError)
    assert err.code == ecstore.ECONN and err.name == "ECONN"
    assert err.strerror == ecstore.strerror(ecstore.ECONN) == "connection failed or closed"
    assert "cannot connect to 127.0.0.1:%d" % port in str(err)


def test_bad_config_values(cluster):
    with pytest.raises(ecstore.InvalidArgumentError, match="unknown transport 'bogus'"):
        ecstore.connect(cluster.config(transport="bogus"))
    with pytest.raises(ecstore.InvalidArgumentError, match="unknown config key 'srvers'"):
        ecstore.connect(cluster.config(srvers="x"))
    with pytest.raises(ecstore.InvalidArgumentError, match="given twice"):
        ecstore.connect(cluster.config(ns="pytest"))  # namespace and its alias
    with pytest.raises(ecstore.InvalidArgumentError, match="wants an integer"):
        ecstore.connect(cluster.config(timeout_ms="10"))


def test_redis_port_out_of_range_is_named(cluster):
    # Not "a user needs a password": the port, and never the password.
    with pytest.raises(ecstore.InvalidArgumentError,
                       match=r"bad Redis URL 'redis://127\.0\.0\.1:99999': port 99999 of '127\.0\.0\.1:99999' "
                             r"is out of range \(1\.\.65535\)"):
        ecstore.connect(cluster.config(redis_url="redis://127.0.0.1:99999"))
    with pytest.raises(ecstore.InvalidArgumentError, match="port 'x' of 'h:x' is not a number") as e:
        ecstore.connect(cluster.config(redis_url="redis://u:s3cret@h:x"))
    assert "s3cret" not in str(e.value)


def test_wrong_namespace_names_server(cluster):
    with pytest.raises(ecstore.EcstoreError, match="refused the namespace 'other'"):
        ecstore.connect(cluster.config(namespace="other"))


def test_unreachable_redis_still_serves(cluster, uniq):
    # Redis holds metadata only: a client whose Redis is down still puts,
    # gets, and asks the servers whether keys exist.
    k = uniq()
    with ecstore.connect(cluster.config(redis_url="redis://127.0.0.1:%d" % free_port(),
                                        connect_timeout_ms=500)) as s:
        s.put_tensor(k, np.arange(6, dtype=np.int64))
        assert np.array_equal(s.get_tensor(k, framework="numpy"), np.arange(6, dtype=np.int64))
        assert s.batch_is_exist([k, uniq()]) == [1, 0]


def test_conflict_and_too_big(store, uniq):
    k = uniq()
    store.put_tensor(k, np.zeros(4, np.float32))
    with pytest.raises(ecstore.ConflictError, match=r"key exists with different content \(ECONFLICT\): put"):
        store.put_tensor(k, np.ones(4, np.float32))
    with pytest.raises(ecstore.NoSpaceError) as e:
        store.put_tensor(uniq(), np.zeros(129 << 20, np.uint8))  # the pool is 128M
    assert e.value.name == "ETOOBIG"


def test_missing_key_error_is_keyerror(store, uniq):
    e = ecstore.error_class(ecstore.ENOTFOUND)(ecstore.ENOTFOUND, "k")
    assert isinstance(e, KeyError) and str(e) == "key not found (ENOTFOUND): k"
    with pytest.raises(KeyError):
        ecstore.check(ecstore.ENOTFOUND)
    ecstore.check(ecstore.OK)


def test_deadline_on_paused_server_and_recovery(private_cluster, uniq):
    k = uniq()
    with ecstore.connect(private_cluster.config(timeout_ms=400)) as s:
        s.put_tensor(k, np.arange(10, dtype=np.int32))
        private_cluster.server.pause()
        try:
            t0 = time.monotonic()
            with pytest.raises(ecstore.DeadlineExceededError, match="deadline exceeded") as e:
                s.batch_get_tensors([k, uniq()])
            assert time.monotonic() - t0 < 3
            # the whole-call error still reports every item
            assert e.value.statuses == [ecstore.ETIMEDOUT, ecstore.ETIMEDOUT]
            assert isinstance(e.value, TimeoutError)
        finally:
            private_cluster.server.resume()
        assert np.array_equal(s.get_tensor(k, framework="numpy"), np.arange(10, dtype=np.int32))
        private_cluster.redis.pause()
        try:
            # Redis frozen: the server answers the existence check
            assert s.batch_is_exist([k]) == [1]
            # both frozen: an error, never "exists"
            private_cluster.server.pause()
            try:
                with pytest.raises(ecstore.DeadlineExceededError):
                    s.batch_is_exist([k])
            finally:
                private_cluster.server.resume()
        finally:
            private_cluster.redis.resume()
        assert s.batch_is_exist([k]) == [1]
        private_cluster.server.stop()
        with pytest.raises(ecstore.ConnectionFailedError, match="cannot connect") as e:
            s.batch_put_from([k], [1], [0])
        assert e.value.statuses == [ecstore.ECONN]


def test_closed_store_raises(cluster):
    s = ecstore.connect(cluster.config())
    s.close()
    s.close()  # idempotent
    assert s.closed
    with pytest.raises(ecstore.ConnectionFailedError, match="store is closed"):
        s.ping()
    with pytest.raises(ecstore.ConnectionFailedError, match="not set up"):
        ecstore.Store().ping()


def test_context_manager_closes_even_on_error(cluster):
    with pytest.raises(RuntimeError):
        with ecstore.connect(cluster.config()) as s:
            s.ping()
            raise RuntimeError("boom")
    assert s.closed
    with pytest.raises(ecstore.ConnectionFailedError):
        s.ping()


def test_put_with_redis_frozen_is_stored_not_published(private_cluster, uniq):
    """A put while Redis is frozen: answered within the server's Redis
    timeout (500 ms by default) as EREDIS, stored and readable; the server
    publishes the record once Redis answers (docs/redis-schema.md)."""
    k1, k2 = uniq(), uniq()
    arr = np.arange(64, dtype=np.float32)
    with ecstore.connect(private_cluster.config(timeout_ms=10000)) as s:
        s.put_tensor(uniq(), arr)  # the link is up
        private_cluster.redis.pause()
        try:
            with pytest.warns(RuntimeWarning, match="not published"):
                s.put_tensor(k1, arr)  # stored: a warning, not an error
            assert s.batch_put_tensors([k2], [arr]) == [ecstore.EREDIS]
            assert np.array_equal(s.get_tensor(k1, framework="numpy"), arr)
            assert np.array_equal(s.get_tensor(k2, framework="numpy"), arr)
        finally:
            private_cluster.redis.resume()
    # the re-sync publishes both: a fresh client (which asks Redis, not
    # the servers, while Redis answers) sees them
    deadline = time.monotonic() + 15
    seen = None
    while seen != [1, 1] and time.monotonic() < deadline:
        time.sleep(0.2)
        with ecstore.connect(private_cluster.config()) as fresh:
            seen = fresh.batch_is_exist([k1, k2])
    assert seen == [1, 1]
