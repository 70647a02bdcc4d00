"""One Store used from several threads: one C handle per thread, the GIL
released during I/O, close() from another thread."""

import threading
import time

import numpy as np
import pytest

import ecstore


def run_threads(n, fn):
    errors = []

    def wrap(i):
        try:
            fn(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors


def test_many_threads_round_trip(store, uniq):
    prefix = uniq()
    handles = []  # strong references: no id is reused while we look

    def work(i):
        handles.append(store._handle())
        rng = np.random.default_rng(i)
        for j in range(20):
            k = "%s-%d-%d" % (prefix, i, j)
            a = rng.standard_normal((64, 33)).astype(np.float32)
            store.put_tensor(k, a)
            b = store.get_tensor(k, framework="numpy")
            assert np.array_equal(a, b)
            assert store.batch_is_exist([k, k + "-no"]) == [1, 0]

    run_threads(8, work)
    # every thread had a C handle of its own
    ids = {id(h) for h in handles}
    assert len(ids) == 8 and id(store._handle()) not in ids


def test_gil_released_during_io(private_cluster):
    # A call blocked in C (a paused server, until its deadline) must not
    # stop the other Python threads: ctypes.CDLL drops the GIL.
    with ecstore.connect(private_cluster.config(timeout_ms=1000)) as s:
        s.ping()
        private_cluster.server.pause()
        try:
            done = threading.Event()
            result = []

            def blocked():
                try:
                    s.ping()
                except ecstore.DeadlineExceededError as e:
                    result.append(e)
                done.set()

            t = threading.Thread(target=blocked)
            t.start()
            time.sleep(0.05)
            spins = 0
            t0 = time.monotonic()
            while not done.is_set() and time.monotonic() - t0 < 0.5:
                spins += 1  # pure Python: runs only while the GIL is free
            t.join(5)
        finally:
            private_cluster.server.resume()
    assert result and isinstance(result[0], ecstore.DeadlineExceededError)
    assert spins > 10000, spins


def test_close_from_another_thread(cluster):
    s = ecstore.connect(cluster.config())
    started = threading.Barrier(5)
    stop = threading.Event()
    outcomes = []

    def user(i):
        started.wait()
        try:
            while not stop.is_set():
                s.ping()
        except ecstore.ConnectionFailedError as e:
            outcomes.append(e.name)

    ts = [threading.Thread(target=user, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    started.wait()
    time.sleep(0.1)
    s.close()
    for t in ts:
        t.join(10)
    assert outcomes == ["ENOTCONN"] * 4


def test_thread_handles_close_when_threads_end(cluster):
    import gc

    with ecstore.connect(cluster.config()) as s:
        run_threads(4, lambda i: s.ping())
        gc.collect()
        assert len(s._handles) == 1  # only the main thread's remains
