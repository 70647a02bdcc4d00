"""Store's upsert flag (ecs_upsert_batch): replace what a key holds."""

import numpy as np
import pytest

import ecstore


def test_upsert_replaces_where_put_conflicts(store, uniq):
    k = uniq()
    a, b = np.arange(16, dtype=np.uint8), np.arange(32, dtype=np.uint8)[::-1].copy()
    assert store.batch_put_from([k], [a.ctypes.data], [a.nbytes]) == [0]
    assert store.batch_put_from([k], [b.ctypes.data], [b.nbytes]) == [ecstore.ECONFLICT]
    assert store.batch_put_from([k], [b.ctypes.data], [b.nbytes], upsert=True) == [0]
    out = np.zeros(64, np.uint8)
    assert store.batch_get_into([k], [out.ctypes.data], [64]) == [32]
    assert (out[:32] == b).all()
    # the same bytes again: idempotent, for put and upsert alike
    assert store.batch_put_from([k], [b.ctypes.data], [b.nbytes]) == [0]
    assert store.batch_put_from([k], [b.ctypes.data], [b.nbytes], upsert=True) == [0]


def test_upsert_tensor_changes_dtype_and_shape(store, uniq):
    k = uniq()
    store.put_tensor(k, np.ones((2, 3), np.float32))
    with pytest.raises(ecstore.ConflictError):
        store.put_tensor(k, np.zeros(5, np.int16))
    store.put_tensor(k, np.zeros(5, np.int16), upsert=True)
    got = store.get_tensor(k, framework="numpy")
    assert got.dtype == np.int16 and got.shape == (5,) and not got.any()
    assert store.batch_put_tensors([k, uniq()], [np.ones(2, np.float64), np.ones(1, bool)], upsert=True) == [0, 0]
    assert store.get_tensor(k, framework="numpy").dtype == np.float64
