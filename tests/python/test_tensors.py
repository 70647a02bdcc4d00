"""Tensor helpers: every dtype, numpy and torch, dtype and shape kept, no
copies through bytes; misses, outs, and the dtypes numpy lacks."""

import numpy as np
import pytest

import ecstore

import torch  # noqa: E402

NUMPY_DTYPES = ["float32", "float16", "int8", "uint8", "int32", "int64"]
TORCH_DTYPES = ["float32", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]
SHAPES = [(650, 16), (3,), (), (2, 0, 3), (1, 2, 1, 2, 1, 2, 1, 2)]


def np_sample(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def torch_sample(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    if dt.is_floating_point:
        return torch.randn(shape, generator=g).to(dt)
    info = torch.iinfo(dt)
    return torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dt)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_round_trip(store, uniq, dtype, shape):
    a = np_sample(dtype, shape)
    k = uniq()
    store.put_tensor(k, a)
    b = store.get_tensor(k, framework="numpy")
    assert isinstance(b, np.ndarray)
    assert b.dtype == a.dtype and b.shape == a.shape
    assert np.array_equal(a, b)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_torch_round_trip(store, uniq, dtype, shape):
    t = torch_sample(dtype, shape)
    k = uniq()
    store.put_tensor(k, t)
    u = store.get_tensor(k)
    assert isinstance(u, torch.Tensor)
    assert u.dtype == t.dtype and tuple(u.shape) == tuple(t.shape)
    assert torch.equal(t, u)


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_torch_put_numpy_get_and_back(store, uniq, dtype):
    t = torch_sample(dtype, (5, 7), seed=3)
    k = uniq()
    store.put_tensor(k, t)
    a = store.get_tensor(k, framework="numpy")
    assert a.shape == (5, 7)
    if dtype == "bfloat16":
        # numpy has no bf16: the raw bits come back as uint16
        assert a.dtype == np.uint16
        assert torch.equal(torch.from_numpy(a.view(np.int16)).view(torch.bfloat16), t)
        # ... and go back as bf16 when the put says so: same content, same key
        store.put_tensor(k, a, dtype="bf16")
    else:
        assert np.array_equal(a, t.numpy())
        store.put_tensor(k, a)  # same dtype, shape and bytes: no conflict


@pytest.mark.parametrize("name", ["f8e4m3", "f8e5m2"])
def test_float8_as_uint8_bits(store, uniq, name):
    bits = np.arange(256, dtype=np.uint8).reshape(16, 16)
    k = uniq()
    store.put_tensor(k, bits, dtype=name)
    a = store.get_tensor(k, framework="numpy")
    assert a.dtype == np.uint8 and np.array_equal(a, bits)
    t = store.get_tensor(k)
    f8 = getattr(torch, {"f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2"}[name], None)
    assert t.dtype == (f8 or torch.uint8)
    assert torch.equal(t.view(torch.uint8), torch.from_numpy(bits))


@pytest.mark.parametrize("name", ["float64", "int16", "uint16", "uint32", "uint64", "bool"])
def test_numpy_dtypes_added_for_mooncake(store, uniq, name):
    # A plain uint16 array is u16 now (bf16 bits still need dtype="bf16").
    a = (np.arange(12) % 3).astype(name).reshape(3, 4)
    k = uniq()
    store.put_tensor(k, a)
    got = store.get_tensor(k, framework="numpy")
    assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)


@pytest.mark.parametrize("bad", [np.zeros(3, np.complex64), np.zeros(3, np.float128), np.zeros(3, "U2")],
                         ids=["complex64", "float128", "str"])
def test_unsupported_numpy_dtypes(store, uniq, bad):
    with pytest.raises(ecstore.InvalidArgumentError, match="no ecstore dtype"):
        store.put_tensor(uniq(), bad)


def test_dtype_override_must_match_element_size(store, uniq):
    with pytest.raises(ecstore.InvalidArgumentError, match="2-byte elements"):
        store.put_tensor(uniq(), np.zeros(4, np.float32), dtype="bf16")
    with pytest.raises(ecstore.InvalidArgumentError, match="unknown dtype"):
        store.put_tensor(uniq(), np.zeros(4, np.float32), dtype="float128")


def test_non_contiguous_and_big_endian_refused(store, uniq):
    a = np.zeros((4, 4), np.float32)
    with pytest.raises(ecstore.InvalidArgumentError, match="contiguous"):
        store.put_tensor(uniq(), a[:, 1])
    with pytest.raises(ecstore.InvalidArgumentError, match="contiguous"):
        store.put_tensor(uniq(), torch.zeros(4, 4).t())
    with pytest.raises(ecstore.InvalidArgumentError, match="byte order"):
        store.put_tensor(uniq(), np.zeros(4, ">f4"))
    with pytest.raises(ecstore.InvalidArgumentError, match="dimensions"):
        store.put_tensor(uniq(), np.zeros((1,) * 9, np.float32))
    with pytest.raises(TypeError):
        store.put_tensor(uniq(), [1, 2, 3])


def test_no_payload_copies_in_python(store, uniq):
    # tracemalloc sees every allocation Python and numpy make (bytes objects,
    # numpy buffers), not libecstore's malloc: a copy of the 16 MiB payload
    # through bytes or a temporary array would show in the peak.
    import tracemalloc

    a = np_sample("float32", (4096, 1024))
    t = torch.from_numpy(a)
    out = np.empty_like(a)
    k1, k2 = uniq(), uniq()
    tracemalloc.start()
    try:
        store.put_tensor(k1, a)
        store.put_tensor(k2, t)
        got = store.get_tensor(k1, out=out)
        fresh = store.get_tensor(k2, framework="numpy")
        tfresh = store.get_tensor(k2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, "Python allocated %d bytes for a %d-byte payload" % (peak, a.nbytes)
    assert got.ctypes.data == out.ctypes.data  # a view of out: the bytes landed there
    assert np.array_equal(out, a) and np.array_equal(fresh, a) and torch.equal(tfresh, t)


def test_get_into_out_larger_buffer_gives_view_with_stored_shape(store, uniq):
    t = torch_sample("bfloat16", (10, 3))
    k = uniq()
    store.put_tensor(k, t)
    staging = torch.zeros(1000, dtype=torch.bfloat16)
    u = store.get_tensor(k, out=staging)
    assert u.shape == (10, 3) and u.data_ptr() == staging.data_ptr()
    assert torch.equal(u, t)


def test_get_into_out_too_small_or_wrong_dtype(store, uniq):
    k = uniq()
    store.put_tensor(k, np.ones((4, 4), np.float32))
    with pytest.raises(ecstore.BufferTooSmallError):
        store.get_tensor(k, out=np.empty(15, np.float32))
    with pytest.raises(ecstore.InvalidArgumentError, match="object is f32"):
        store.get_tensor(k, out=np.empty(16, np.int32))


def test_get_missing_is_none(store, uniq):
    assert store.get_tensor(uniq()) is None
    assert store.get_tensor(uniq(), framework="numpy") is None


def test_batch_with_misses(store, uniq):
    keys = [uniq() for _ in range(6)]
    ts = [torch_sample(dt, (i + 1, 4), seed=i) for i, dt in enumerate(TORCH_DTYPES[:6])]
    # put every other one
    assert store.batch_put_tensors(keys[::2], ts[::2]) == [0, 0, 0]
    res, st = store.batch_get_tensors(keys, with_status=True)
    assert st == [0, ecstore.ENOTFOUND] * 3
    for i in range(6):
        if i % 2:
            assert res[i] is None
        else:
            assert res[i].dtype == ts[i].dtype and torch.equal(res[i], ts[i])
    # into outs
    outs = [torch.empty_like(t) for t in ts]
    res2 = store.batch_get_tensors(keys, outs=outs)
    assert [r is None for r in res2] == [False, True] * 3
    assert all(torch.equal(outs[i], ts[i]) for i in range(0, 6, 2))
    # numpy
    res3 = store.batch_get_tensors(keys, framework="numpy")
    assert np.array_equal(res3[0], ts[0].numpy()) and res3[1] is None


def test_batch_put_reports_per_item(store, uniq):
    k = uniq()
    store.put_tensor(k, np.zeros(8, np.float32))
    st = store.batch_put_tensors([k, uniq()], [np.ones(8, np.float32), np.ones(8, np.float32)])
    assert st == [ecstore.ECONFLICT, 0]


def test_allocated_results_own_their_memory(store, uniq):
    import gc

    k = uniq()
    a = np_sample("int64", (1000,))
    store.put_tensor(k, a)
    views = []
    for _ in range(50):  # freed as they go: no leak, no double free
        b = store.get_tensor(k, framework="numpy")
        views.append(b[10:20])
        del b
    gc.collect()
    assert all(np.array_equal(v, a[10:20]) for v in views)
    t = store.get_tensor(k)
    u = t[5:8].clone()
    del t
    gc.collect()
    assert torch.equal(u, torch.from_numpy(a[5:8]))


def test_pinned_tensors(store, uniq):
    if not torch.cuda.is_available():
        pytest.skip("pinned memory needs CUDA; torch.cuda.is_available() is False here")
    t = torch.randn(64, 32).to(torch.bfloat16).pin_memory()
    k = uniq()
    store.put_tensor(k, t)
    u = store.get_tensor(k, pin_memory=True)
    assert u.is_pinned() and torch.equal(u, t)


def test_get_into_memory_the_caller_allocates(store, uniq):
    """alloc=: the get learns each object's dtype and shape, asks alloc for
    the tensor, reads into it; alloc's None skips that item (ENOSPC) and
    a missing key never reaches alloc."""
    a, b = torch_sample("bfloat16", (8, 16), 1), torch_sample("float32", (3, 5), 2)
    ka, kb, kc = uniq(), uniq(), uniq()
    store.batch_put_tensors([ka, kb], [a, b])
    asked, backing = [], []

    def alloc(code, shape):
        asked.append((ecstore.tensors.dtype_name(code), shape))
        if len(asked) == 2:
            return None
        dt = ecstore.tensors.torch_dtype(code)
        buf = torch.empty(1024, dtype=torch.uint8)  # the caller's memory
        backing.append(buf)
        n = torch.empty((), dtype=dt).element_size() * shape[0] * shape[1]
        return buf[:n].view(dt).view(shape)

    got, st = store.batch_get_tensors([ka, kb, kc], alloc=alloc, with_status=True)
    assert asked == [("bf16", (8, 16)), ("f32", (3, 5))]
    assert st[0] == 0 and torch.equal(got[0], a) and got[0].data_ptr() == backing[0].data_ptr()
    assert st[1] == ecstore.codes.ENOSPC and got[1] is None
    assert st[2] == ecstore.codes.ENOTFOUND and got[2] is None


def test_cuda_tensor_refused(store, uniq):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    with pytest.raises(ecstore.InvalidArgumentError, match="only CPU"):
        store.put_tensor(uniq(), torch.zeros(4, device="cuda"))
