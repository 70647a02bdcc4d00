"""Store.get_views / Views.release_items: a batch of views released in one
call (the vLLM worker releases every dead view of a step at once) unpins
exactly those, and the others stay pinned and readable."""

import numpy as np
import pytest

import ecstore
from conftest import NAMESPACE, start_redis, start_server

MB = 1 << 20


@pytest.fixture
def small():
    redis = start_redis()
    server = start_server(redis.port, pool="8M")
    yield server
    server.stop()
    redis.stop()


def test_batched_release_unpins_only_those(small):
    with ecstore.connect(servers="127.0.0.1:%d" % small.port, namespace=NAMESPACE, transport="shm",
                         timeout_ms=5000) as s:
        assert s.transport() == "shm"
        keys = ["v%d" % i for i in range(4)]
        blobs = [np.full(MB, i + 1, dtype=np.uint8) for i in range(4)]
        assert s.batch_put_tensors(keys, blobs) == [0] * 4
        views = s.get_views(keys)
        assert views.statuses == [0] * 4
        views.release_items([0, 2, 3])  # one call for three
        assert [views.statuses[i] == 0 for i in range(4)] == [False, True, False, False]
        assert views.tensor(0) is None and views.tensor(2) is None
        # Fill the 8 MiB pool many times over: the unpinned objects go,
        # the one still pinned cannot.
        for j in range(40):
            s.batch_put_tensors(["fill%d" % j], [np.zeros(MB, dtype=np.uint8)])
        assert s.batch_is_exist(["v0", "v2", "v3"]) == [0, 0, 0]
        t = views.tensor(1)
        assert t is not None and bool((t.numpy() == 2).all())
        assert s.batch_is_exist(["v1"]) == [1]
        views.release()  # the rest; idempotent for the others
        assert views.tensor(1) is None
        views.release_items([0, 1])
