"""ecstore.mooncake against the real Mooncake Store, call by call.

Every test here runs twice through the ``mc`` fixture: once against the
pinned Mooncake release (mooncake-transfer-engine-non-cuda, see
ec_connector/python/requirements-test.txt): its ``mooncake_master`` started
here on free loopback ports with its built-in HTTP metadata server, and an
in-process ``mooncake.store.MooncakeDistributedStore`` over TCP that also
contributes the memory segment; and once against ``ecstore.mooncake`` over a
redis-server and an ecstore-server started here.  Both sides make the same
calls and assert the same results; where the results differ on purpose the
test says so with ``if MOONCAKE`` / ``DIFF`` and docs/mooncake.md gives the
reason.

Mooncake not importable, or its master not starting, FAILS the Mooncake
half (it is a pinned test dependency), it never skips.
"""

import ctypes
import os
import pathlib
import shutil
import struct
import sys
import time

import numpy as np
import pytest
import torch  # Mooncake's tensor calls take torch tensors; a missing torch fails, never skips

from conftest import Proc, free_port, start_redis, start_server, wait_port

NS = "pytest-mc"
SEG = 64 << 20  # Mooncake's global segment (the memory this client contributes)
LOCAL_BUF = 16 << 20
HDR = 304  # Mooncake's tensor metadata


# ---- the two backends --------------------------------------------------------


def _mooncake_master_binary():
    try:
        import mooncake
    except ImportError as e:
        pytest.fail("Mooncake is not importable in %s (%s): install the pin of "
                    "ec_connector/python/requirements-test.txt (scripts/pyenv.sh does)" % (sys.executable, e))
    for cand in (pathlib.Path(sys.executable).parent / "mooncake_master",
                 pathlib.Path(mooncake.__file__).parent / "mooncake_master",
                 pathlib.Path(shutil.which("mooncake_master") or "/nonexistent")):
        if cand.exists():
            return str(cand)
    pytest.fail("no mooncake_master binary next to %s or in the mooncake package" % sys.executable)


class _Env:
    pass


@pytest.fixture(scope="module")
def mooncake_env():
    binary = _mooncake_master_binary()
    rpc, http, metrics = free_port(), free_port(), free_port()
    # Leases of 500 ms instead of 10 s: Mooncake refuses to remove an object
    # read within its lease (OBJECT_HAS_LEASE), and ecstore has no such read
    # lease to wait for.  (1 ms is too short: a read that outlives its lease
    # fails with LEASE_EXPIRED.)
    argv = [binary, "--rpc_port=%d" % rpc, "--rpc_address=127.0.0.1", "--enable_http_metadata_server=true",
            "--http_metadata_server_host=127.0.0.1", "--http_metadata_server_port=%d" % http,
            "--metrics_port=%d" % metrics, "--enable_metric_reporting=false", "--default_kv_lease_ttl=500"]
    try:
        master = Proc(argv, "mooncake-master", rpc)
        wait_port(master.proc, http, master.log)
    except Exception as e:
        pytest.fail("mooncake_master did not start: %s" % e)
    env = _Env()
    env.args = ("127.0.0.1", "http://127.0.0.1:%d/metadata" % http, SEG, LOCAL_BUF, "tcp", "",
                "127.0.0.1:%d" % rpc)
    env.kwargs = {}
    env.config = {"local_hostname": "127.0.0.1", "metadata_server": env.args[1], "global_segment_size": SEG,
                  "local_buffer_size": LOCAL_BUF, "protocol": "tcp", "master_server_addr": env.args[6]}
    import mooncake.store as mod

    env.mod = mod
    env.kind = "mooncake"
    yield env
    master.stop()


@pytest.fixture(scope="module")
def ecstore_env():
    redis = start_redis()
    server = start_server(redis.port, ns=NS)
    env = _Env()
    env.args = ("127.0.0.1", "redis://127.0.0.1:%d" % redis.port, SEG, LOCAL_BUF, "tcp", "",
                "127.0.0.1:%d" % server.port)
    env.kwargs = {"tenant_id": NS}
    env.config = {"local_hostname": "127.0.0.1", "metadata_server": env.args[1], "global_segment_size": SEG,
                  "local_buffer_size": LOCAL_BUF, "protocol": "tcp", "master_server_addr": env.args[6],
                  "tenant_id": NS}
    import ecstore.mooncake as mod

    env.mod = mod
    env.kind = "ecstore"
    yield env
    rc = server.stop()
    redis.stop()
    assert rc == 0, "ecstore-server exited with %s" % rc


class Backend:
    """One side: its module (for ReplicateConfig, ...) and a set-up store."""

    def __init__(self, env):
        self.env = env
        self.mod = env.mod
        self.kind = env.kind
        self.mooncake = env.kind == "mooncake"
        self.store = self.new()

    def new(self):
        s = self.mod.MooncakeDistributedStore()
        assert s.setup(*self.env.args, **self.env.kwargs) == 0
        return s


_backends = {}


@pytest.fixture(scope="module", params=["mooncake", "ecstore"])
def mc(request):
    env = request.getfixturevalue(request.param + "_env")
    b = Backend(env)
    yield b
    assert b.store.close() == 0


@pytest.fixture
def key(request, mc):
    n = [0]

    def make(tag=""):
        n[0] += 1
        return "%s-%s-%s-%d-%d" % (mc.kind, request.node.name, tag, os.getpid(), n[0])

    return make


def buf(n, fill=0):
    a = np.full(n, fill, np.uint8)
    return a, a.ctypes.data


# ---- setup and close -----------------------------------------------------------


def test_setup_forms_close_and_setup_again(mc, key):
    s = mc.mod.MooncakeDistributedStore()
    assert s.setup(*mc.env.args, **mc.env.kwargs) == 0  # positional, as every integration calls it
    k = key()
    assert s.put(k, b"one") == 0
    assert s.get(k) == b"one"
    assert s.close() == 0
    # The same object again, now with the config-dict form.  (What it put
    # before may be gone on the Mooncake side: there an object lives in the
    # memory segment of some client, and a closing client unmounts its own.)
    assert s.setup(mc.env.config) == 0
    k2 = key()
    assert s.put(k2, b"two") == 0
    assert mc.store.get(k2) == b"two"
    assert s.close() == 0
    # keyword names of the positional form (device_name is the older name of rdma_devices)
    kw = dict(zip(("local_hostname", "metadata_server", "global_segment_size", "local_buffer_size", "protocol",
                   "rdma_devices", "master_server_addr"), mc.env.args), **mc.env.kwargs)
    assert s.setup(**kw) == 0
    k3 = key()
    assert s.put(k3, b"three") == 0 and s.is_exist(k3) == 1
    assert s.get_hostname().startswith("127.0.0.1")
    assert s.close() == 0
    assert s.close() == 0


def test_setup_refuses_bad_protocol_and_missing_args(mc):
    s = mc.mod.MooncakeDistributedStore()
    args = list(mc.env.args)
    args[4] = "carrier-pigeon"
    assert s.setup(*args, **mc.env.kwargs) == -1  # Mooncake retries ~2 s, then -1
    with pytest.raises(TypeError):
        s.setup(*mc.env.args[:3])


# ---- bytes -----------------------------------------------------------------------


def test_put_get_get_size_and_misses(mc, key):
    s, k, miss = mc.store, key(), key("miss")
    assert s.put(k, b"hello") == 0
    assert s.get(k) == b"hello"
    assert s.get(miss) == b""
    assert s.get_size(k) == 5
    assert s.get_size(miss) == -704  # OBJECT_NOT_FOUND
    assert s.is_exist(k) == 1 and s.is_exist(miss) == 0
    assert s.batch_is_exist([k, miss]) == [1, 0]
    assert s.batch_is_exist([]) == []
    assert s.put(k, bytearray(b"hello")) == 0  # the same bytes again: fine on both
    assert s.put(key("empty-value"), b"") == -600  # INVALID_PARAMS
    assert s.put("", b"x") == -600


def test_put_batch_get_batch(mc, key):
    s, a, b, miss = mc.store, key(), key(), key("miss")
    assert s.put_batch([a, b], [b"1", memoryview(b"22")]) == 0
    assert s.get_batch([a, b, miss]) == [b"1", b"22", b""]
    assert s.put_batch([a, b], [b"1"]) == -600
    assert s.put_batch([], []) == 0
    assert s.get_batch([]) == [b""]  # Mooncake's answer to an empty list: one empty value


def test_put_from_get_into_keywords_small_buffers_and_lengths(mc, key):
    s, k, k2, miss = mc.store, key(), key(), key("miss")
    src, sp = buf(64, 7)
    dst, dp = buf(64)
    assert s.put_from(key=k, buffer_ptr=sp, size=64) == 0
    assert s.batch_put_from(keys=[k2], buffer_ptrs=[sp], sizes=[32]) == [0]
    assert s.get_into(key=k, buffer_ptr=dp, size=64) == 64
    assert (dst == 7).all()
    dst[:] = 0
    assert s.get_into(k, dp, 63) == -600  # buffer too small: INVALID_PARAMS
    assert s.get_into(miss, dp, 64) == -704
    assert s.batch_get_into(keys=[k, miss, k2], buffer_ptrs=[dp, dp, dp], sizes=[64, 64, 64]) == [64, -704, 32]
    assert s.batch_put_from([k, k2], [sp], [1, 1]) == [-600, -600]
    assert s.batch_get_into([k, k2], [dp, dp], [64]) == [-600, -600]
    assert s.batch_put_from([], [], []) == []
    assert s.batch_get_into([], [], []) == []
    # a put_from of 0 bytes reports success and stores nothing (Mooncake's
    # answer); its batch form refuses 0 bytes
    z = key("zero")
    assert s.put_from(z, sp, 0) == 0
    assert s.upsert_from(z, sp, 0) == 0
    assert s.batch_put_from([z], [sp], [0]) == [-600]
    assert s.is_exist(z) == 0


def test_get_buffer(mc, key):
    s, k, miss = mc.store, key(), key("miss")
    assert s.put(k, b"buffer bytes") == 0
    h = s.get_buffer(k)
    assert h is not None and h.size() == 12 and h.ptr() != 0
    mv = memoryview(h)
    assert mv.format in ("b", "<b") and mv.nbytes == 12 and bytes(mv) == b"buffer bytes"
    assert bytes(torch.frombuffer(h, dtype=torch.uint8).numpy()) == b"buffer bytes"
    assert s.get_buffer(miss) is None
    hs = s.batch_get_buffer([k, miss])
    assert hs[1] is None and bytes(memoryview(hs[0])) == b"buffer bytes"
    assert s.batch_get_buffer([]) == []


def test_remove_and_remove_all(mc, key):
    s = mc.store
    time.sleep(0.6)  # past Mooncake's 500 ms read leases of earlier tests
    assert s.remove_all() >= 0
    ks = [key() for _ in range(3)]
    for k in ks:
        assert s.put(k, b"x" * 100) == 0
    assert s.remove(ks[0]) == 0
    assert s.remove(ks[0]) == -704
    assert s.batch_remove([ks[0], ks[1]], force=False) == [-704, 0]
    assert s.is_exist(ks[1]) == 0
    assert s.put(ks[0], b"y") == 0
    assert s.remove_all() == 2
    assert s.remove_all(force=True) == 0
    assert s.batch_is_exist(ks) == [0, 0, 0]


def test_remove_by_regex(mc, key):
    s = mc.store
    tag = "%s-rx-%d-%d" % (mc.kind, os.getpid(), time.monotonic_ns())  # no regex metacharacters
    ks = [tag + "-a1", tag + "-a2", "z" + tag + "-b1"]
    for k in ks:
        assert s.put(k, b"v") == 0
    assert s.remove_by_regex(tag + "-a") == 2  # a search, not a full match
    # (no exists check in between: in Mooncake one renews the object's lease,
    # and a leased object is not removed)
    assert s.remove_by_regex("^z" + tag) == 1
    assert s.batch_is_exist(ks) == [0, 0, 0]
    assert s.remove_by_regex("([") == -600


def test_multi_buffers_and_metadata(mc, key):
    s, k, miss = mc.store, key(), key("miss")
    src = np.arange(32, dtype=np.uint8)
    d1, d2 = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
    p = src.ctypes.data
    assert s.put_from_with_metadata(k, p, p + 16, 8, 4) == 0
    assert s.get(k) == bytes(range(16, 20)) + bytes(range(8))
    r = s.batch_get_into_multi_buffers([k, miss], [[d1.ctypes.data, d2.ctypes.data], [d1.ctypes.data]],
                                       [[5, 7], [4]])
    assert r == [12, -704]
    assert list(d1) == [16, 17, 18, 19, 0, 0, 0, 0] and list(d2) == [1, 2, 3, 4, 5, 6, 7, 0]
    assert s.batch_get_into_multi_buffers([k], [[d1.ctypes.data, d2.ctypes.data]], [[5, 5]]) == [-600]
    assert s.batch_get_into_multi_buffers([k], [[d1.ctypes.data]], [[5, 5]]) == [-600]
    assert s.batch_get_into_multi_buffers([k, miss], [[d1.ctypes.data]], [[5]]) == [-600, -600]
    k2 = key()
    assert s.batch_put_from_multi_buffers([k2], [[p, p + 8]], [[2, 3]]) == [0]
    assert s.get(k2) == bytes([0, 1, 8, 9, 10])
    assert s.batch_put_from_multi_buffers([k2, k], [[p]], [[2]]) == [-600, -600]


def test_reput_and_upserts(mc, key):
    s, k = mc.store, key()
    assert s.put(k, b"first") == 0
    # DIFF: a put of other bytes under a stored key.  Mooncake reports
    # success and keeps the old bytes; ecstore keys are content hashes, so it
    # says so: OBJECT_ALREADY_EXISTS (-705), old bytes kept.
    assert s.put(k, b"second") == (0 if mc.mooncake else -705)
    assert s.get(k) == b"first"
    assert s.upsert(k, b"second") == 0
    assert s.get(k) == b"second"
    assert s.upsert(k, b"x" * 5000) == 0  # another size
    assert s.get_size(k) == 5000
    assert s.upsert(key("new"), b"fresh") == 0  # an insert
    src, sp = buf(16, 3)
    assert s.upsert_from(k, sp, 16) == 0
    assert s.get(k) == bytes([3]) * 16
    k2 = key()
    assert s.batch_upsert_from([k, k2], [sp, sp], [4, 8]) == [0, 0]
    assert s.get_batch([k, k2]) == [bytes([3]) * 4, bytes([3]) * 8]
    assert s.batch_upsert_from([k], [], []) == [-600]
    assert s.upsert_batch([k, k2], [b"u1", b"u22"]) == 0
    assert s.get_batch([k, k2]) == [b"u1", b"u22"]
    assert s.put_parts(key("parts"), b"ab", b"cd") == 0
    assert s.upsert_parts(k, b"x", bytearray(b"y")) == 0
    assert s.get(k) == b"xy"


def test_replicate_config(mc, key):
    s = mc.store
    rc = mc.mod.ReplicateConfig()
    assert rc.replica_num == 1 and rc.with_hard_pin is False and rc.preferred_segment == ""
    assert s.put(key(), b"abc", rc) == 0
    rc.data_type = mc.mod.ObjectDataType.TENSOR  # a label: fine on both
    assert s.batch_put_from([key()], [buf(4)[1]], [4], rc) == [0]
    two = mc.mod.ReplicateConfig()
    two.replica_num = 2
    pin = mc.mod.ReplicateConfig()
    pin.soft_pin_action = mc.mod.SoftPinAction.ENABLE
    pin.soft_pin_ttl_ms = 60000
    # One server (one segment): replica_num 2 stores the one copy there
    # and succeeds; a soft pin is taken (docs/mooncake.md: how ecstore
    # keeps it).
    k2, kp = key(), key()
    assert s.put(k2, b"abc", two) == 0 and s.get(k2) == b"abc"
    assert s.put(kp, b"abc", config=pin) == 0 and s.get(kp) == b"abc"
    assert s.batch_put_from([key()], [buf(4)[1]], [4], two) == [0]


def test_hard_pin_call_line(mc, key):
    """ReplicateConfig.with_hard_pin through every put form a client uses
    (put, put_batch, put_from, batch_put_from, put_parts, upsert, with a
    soft pin and its own TTL too; a TTL without soft_pin_action ENABLE is
    -600 on both): the same results on both, the objects
    read back, a remove takes them and a put again pins again.  (What the
    pin keeps under pressure, and its quota, is ecstore's side:
    test_mooncake_place.py; Mooncake's segment holds these few bytes
    anyway.)"""
    s = mc.store
    hard = mc.mod.ReplicateConfig()
    hard.with_hard_pin = True
    both = mc.mod.ReplicateConfig()
    both.with_hard_pin = True
    both.soft_pin_action = mc.mod.SoftPinAction.ENABLE
    both.soft_pin_ttl_ms = 1000
    ttl = mc.mod.ReplicateConfig()
    ttl.soft_pin_action = mc.mod.SoftPinAction.ENABLE
    ttl.soft_pin_ttl_ms = 2500
    src, sp = buf(64)
    src[:] = np.arange(64, dtype=np.uint8)
    bad = mc.mod.ReplicateConfig()  # a TTL without ENABLE: refused by both
    bad.soft_pin_ttl_ms = 2500
    assert s.put(key(), b"x", bad) == -600
    bad.soft_pin_action = mc.mod.SoftPinAction.DISABLE
    assert s.put(key(), b"x", bad) == -600 and s.put_from(key(), sp, 4, bad) == -600
    assert str(hard) == str(mc.mod.ReplicateConfig()).replace("with_hard_pin: 0", "with_hard_pin: 1")
    k = [key() for _ in range(9)]
    assert s.put(k[0], b"hard", hard) == 0
    assert s.put_batch([k[1], k[2]], [b"b1", b"b2"], hard) == 0
    assert s.put_from(k[3], sp, 64, hard) == 0
    assert s.batch_put_from([k[4], k[5]], [sp, sp + 8], [8, 16], config=hard) == [0, 0]
    assert s.put_parts(k[6], b"pa", b"rts", config=hard) == 0
    assert s.upsert(k[0], b"HARD", hard) == 0
    assert s.put(k[7], b"both", both) == 0
    assert s.put(k[8], b"ttl", ttl) == 0
    assert s.get(k[0]) == b"HARD" and s.get_batch([k[1], k[2]]) == [b"b1", b"b2"]
    assert s.get(k[3]) == bytes(src) and s.get(k[4]) == bytes(src[:8]) and s.get(k[5]) == bytes(src[8:24])
    assert s.get(k[6]) == b"parts"
    assert s.get(k[7]) == b"both" and s.get(k[8]) == b"ttl"
    assert s.batch_is_exist(k) == [1] * 9
    time.sleep(0.6)  # Mooncake's 500 ms read lease
    assert s.batch_remove(k[:4]) == [0] * 4 and s.remove(k[4]) == 0
    assert s.batch_is_exist(k[:5]) == [0] * 5
    assert s.put(k[0], b"again", hard) == 0 and s.get(k[0]) == b"again"


# ---- Mooncake's error semantics (issue 25: the cases a differential fuzz found) ----


def test_wrong_argument_types_raise_typeerror(mc, key):
    """A key that is not a str (None, an int), a negative size or pointer:
    TypeError from every call, as pybind11 raises in Mooncake; nothing is
    stored.  bytes keys are taken (pybind11 converts them)."""
    s, k = mc.store, key()
    a, p = buf(16)
    calls = [
        lambda: s.put(None, b"x"), lambda: s.put(1, b"x"), lambda: s.get(None), lambda: s.get(1),
        lambda: s.get_size(1), lambda: s.is_exist(None), lambda: s.remove(None), lambda: s.upsert(None, b"x"),
        lambda: s.put_from(None, p, 4), lambda: s.get_into(1, p, 4), lambda: s.get_into(k, p, -1),
        lambda: s.put_from(k, p, -1), lambda: s.put_from(k, -1, 4), lambda: s.upsert_from(k, p, -4),
        lambda: s.batch_put_from([None], [p], [4]), lambda: s.batch_get_into([1], [p], [4]),
        lambda: s.batch_get_into([k], [p], [-1]), lambda: s.batch_is_exist([None]), lambda: s.get_batch([None]),
        lambda: s.put_batch([None], [b"x"]), lambda: s.batch_remove([3]), lambda: s.get_buffer(None),
        lambda: s.batch_upsert_from([k, None], [p, p], [4, 4]),
    ]
    for i, call in enumerate(calls):
        with pytest.raises(TypeError):
            call()
            pytest.fail("call %d did not raise" % i)
    assert s.is_exist(k) == 0
    assert s.put(k.encode(), b"bytes key") == 0 and s.get(k) == b"bytes key"


def test_batches_are_all_or_nothing(mc, key):
    """put_batch / upsert_batch with an empty value store no item (-600);
    a bad key ("") fails alone, as Mooncake's."""
    s = mc.store
    a, b = key(), key()
    assert s.put_batch([a, b], [b"a", b""]) == -600
    assert s.batch_is_exist([a, b]) == [0, 0]
    assert s.upsert_batch([a, b], [b"a", b""]) == -600
    assert s.batch_is_exist([a, b]) == [0, 0]
    assert s.put_batch([a, ""], [b"a", b"b"]) == -600
    assert s.is_exist(a) == 1


def test_empty_parts_and_zero_sizes(mc, key):
    s, k = mc.store, key()
    assert s.put_parts(k) == 0 and s.upsert_parts(k) == 0  # no parts: 0, nothing stored
    a, p = buf(8)
    assert s.upsert_from(k, p, 0) == 0
    assert s.is_exist(k) == 0


def test_duplicate_keys_in_one_batch(mc, key):
    """A key given twice in one batch: 0 for both, one object stored:
    batch_put_from / batch_upsert_from keep the last, put_batch /
    upsert_batch the first (what Mooncake keeps)."""
    s = mc.store
    src = np.arange(16, dtype=np.uint8)
    p = src.ctypes.data
    k1, k2, k3, k4 = key(), key(), key(), key()
    assert s.batch_put_from([k1, k1], [p, p + 8], [4, 4]) == [0, 0]
    assert s.get(k1) == bytes([8, 9, 10, 11])
    assert s.batch_upsert_from([k2, k2], [p, p + 8], [4, 4]) == [0, 0]
    assert s.get(k2) == bytes([8, 9, 10, 11])
    assert s.put_batch([k3, k3], [b"ab", b"cd"]) == 0
    assert s.get(k3) == b"ab"
    assert s.upsert_batch([k4, k4], [b"ab", b"cd"]) == 0
    assert s.get(k4) == b"ab"


def test_empty_key(mc):
    """"" names no object: reads miss (-704), writes are -600."""
    s = mc.store
    a, p = buf(8)
    assert s.get_size("") == -704 and s.get("") == b"" and s.is_exist("") == 0
    assert s.remove("") == -704 and s.get_into("", p, 8) == -704
    assert s.batch_get_into(["", ""], [p, p], [8, 8]) == [-704, -704]
    assert s.put("", b"x") == -600 and s.upsert("", b"x") == -600 and s.put_from("", p, 4) == -600
    assert s.batch_put_from([""], [p], [4]) == [-600]
    assert s.put_tensor("", torch.zeros(2)) == -600 and s.get_tensor("") is None


def test_tensor_keys_through_byte_calls(mc, key):
    """A tensor key read with the byte calls is Mooncake's [304-byte
    metadata][data]: get_size counts the metadata, get and get_into give
    it; get_tensor of plain bytes is None unless they are such a buffer."""
    s = mc.store
    k, ku8, kb, kh = key(), key(), key(), key()
    t = torch.arange(4, dtype=torch.float32)
    assert s.put_tensor(k, t) == 0
    assert s.get_size(k) == HDR + 16
    raw = s.get(k)
    assert len(raw) == HDR + 16 and raw[HDR:] == t.numpy().tobytes()
    assert struct.unpack_from("<I", raw)[0] == 0x4D4F4F4E
    small, sp = buf(64)
    assert s.get_into(k, sp, 64) == -600
    big, bp = buf(400)
    assert s.get_into(k, bp, 400) == HDR + 16 and bytes(big[:HDR + 16]) == raw
    assert s.batch_get_into([k], [bp], [400]) == [HDR + 16]
    h = s.get_buffer(k)
    assert h.size() == HDR + 16 and bytes(memoryview(h)) == raw
    assert s.put_tensor(ku8, torch.arange(4, dtype=torch.uint8)) == 0  # a 1-D uint8 tensor too
    assert s.get_size(ku8) == HDR + 4
    assert _same(s.get_tensor(ku8), torch.arange(4, dtype=torch.uint8))
    assert s.put(kb, b"hello") == 0
    assert s.get_tensor(kb) is None and s.batch_get_tensor([kb]) == [None]
    assert s.put_from(kh, bp, HDR + 16) == 0  # bytes that are a tensor buffer
    assert _same(s.get_tensor(kh), t)
    st = torch.zeros(HDR + 64, dtype=torch.uint8)
    assert _same(s.get_tensor_into(kh, st.data_ptr(), st.numel()), t)


def test_get_hostname_names_a_port(mc):
    """Without a port in local_hostname, get_hostname() adds the one this
    client holds (12300..14300, as Mooncake's transfer engine); with one,
    it is kept."""
    s = mc.mod.MooncakeDistributedStore()
    assert s.setup(*mc.env.args, **mc.env.kwargs) == 0
    host, _, port = s.get_hostname().rpartition(":")
    assert host == "127.0.0.1" and 12300 <= int(port) <= 14300
    s2 = mc.mod.MooncakeDistributedStore()
    assert s2.setup(*mc.env.args, **mc.env.kwargs) == 0
    assert s2.get_hostname() != s.get_hostname()  # two clients, two names
    assert s2.close() == 0 and s.close() == 0
    p = free_port()
    s3 = mc.mod.MooncakeDistributedStore()
    assert s3.setup("127.0.0.1:%d" % p, *mc.env.args[1:], **mc.env.kwargs) == 0
    assert s3.get_hostname() == "127.0.0.1:%d" % p
    assert s3.close() == 0


def test_setup_config_dict_sizes(mc, key):
    """setup(config) takes Mooncake's size strings ("16MB", "16 MB", "1.5GB",
    "2 G", "512K"); "50%" or "16MiB" fail with -600, as a dict lacking a
    required key does."""
    for seg, buf_size in (("16MB", "16 MB"), ("0.0625GB", "2 M"), (16 << 20, "512K")):
        s = mc.mod.MooncakeDistributedStore()
        assert s.setup(dict(mc.env.config, global_segment_size=seg, local_buffer_size=buf_size)) == 0, seg
        k = key()
        assert s.put(k, b"sized") == 0 and s.get(k) == b"sized"
        assert s.close() == 0
    for seg in ("50%", "16MiB", -1):
        s = mc.mod.MooncakeDistributedStore()
        assert s.setup(dict(mc.env.config, global_segment_size=seg)) == -600, seg
        s.close()
    s = mc.mod.MooncakeDistributedStore()
    assert s.setup({"local_hostname": "127.0.0.1"}) == -600


def test_zero_local_buffer(mc, key):
    """local_buffer_size 0: the calls that stage a Python value through
    the local buffer fail (put -600, get b"", put_tensor -200, ...); the
    zero-copy calls work."""
    s = mc.mod.MooncakeDistributedStore()
    args = list(mc.env.args)
    args[3] = 0
    assert s.setup(*args, **mc.env.kwargs) == 0
    k, there = key(), key()
    assert mc.store.put(there, b"hello") == 0
    assert s.put(k, b"abc") == -600 and s.is_exist(k) == 0
    assert s.put_batch([k], [b"x"]) == -600 and s.upsert(k, b"x") == -600 and s.put_parts(k, b"x") == -600
    assert s.get(there) == b"" and s.get_batch([there]) == [b""] and s.get_buffer(there) is None
    assert s.get_size(there) == 5
    a, p = buf(64, 5)
    assert s.put_from(k, p, 8) == 0 and s.is_exist(k) == 1
    assert s.get_into(there, p + 16, 16) == 5 and bytes(a[16:21]) == b"hello"
    assert s.batch_get_into([there], [p + 32], [16]) == [5]
    # Mooncake: -200 when the master places the tensor in another client's
    # segment (it is staged through the local buffer), 0 when in this
    # client's own; ecstore's pool is never the client's: -200
    assert s.put_tensor(key(), torch.zeros(3)) in ((-200, 0) if mc.mooncake else (-200,))
    kt = key()
    assert mc.store.put_tensor(kt, torch.ones(3)) == 0
    assert s.get_tensor(kt) is None
    assert s.close() == 0


def test_replicate_config_types(mc, key):
    """ReplicateConfig's fields check their types as Mooncake's binding:
    a negative count or TTL, or a wrong type, raises TypeError; an unknown
    attribute AttributeError; replica_num 0 makes a put fail (-600)."""
    rc = mc.mod.ReplicateConfig()
    for field, bad in (("soft_pin_ttl_ms", -1), ("replica_num", -1), ("replica_num", "2"),
                       ("with_hard_pin", "yes"), ("preferred_segment", 3), ("soft_pin_action", 1)):
        with pytest.raises(TypeError):
            setattr(rc, field, bad)
    with pytest.raises(AttributeError):
        rc.with_soft_pin = True
    rc.soft_pin_ttl_ms = 1000
    rc.replica_num = 3
    rc.preferred_segments = ["a:1", "b:2"]
    assert rc.soft_pin_ttl_ms == 1000 and rc.preferred_segments == ["a:1", "b:2"]
    assert "replica_num: 3" in str(rc) and "soft_pin_ttl_ms: 1000" in str(rc)
    zero = mc.mod.ReplicateConfig()
    zero.replica_num = 0
    k = key()
    assert mc.store.put(k, b"x", zero) == -600 and mc.store.is_exist(k) == 0


def test_replicas_and_preferred_segment_outlive_their_writer(mc, key):
    """A second client puts with replica_num 2, and with a preferred segment
    naming the first client, then closes: both objects are still read (on
    Mooncake from the copy or the segment of a client still up; on ecstore
    from the server, which no client owns).  Soft and hard pins are taken
    and outlive the writer too."""
    w = mc.new()
    rc = mc.mod.ReplicateConfig()
    rc.replica_num = 2
    pref = mc.mod.ReplicateConfig()
    pref.preferred_segment = mc.store.get_hostname()
    soft = mc.mod.ReplicateConfig()
    soft.soft_pin_action = mc.mod.SoftPinAction.ENABLE
    soft.soft_pin_ttl_ms = 5000
    hard = mc.mod.ReplicateConfig()
    hard.with_hard_pin = True
    kr, kp, ks, kh = key(), key(), key(), key()
    assert w.put(kr, b"two copies", rc) == 0
    assert w.put(kp, b"on the first client's segment", pref) == 0
    assert w.put(ks, b"soft", soft) == 0
    assert w.put(kh, b"hard", hard) == 0
    assert w.close() == 0
    time.sleep(0.2)
    assert mc.store.get(kr) == b"two copies"
    assert mc.store.get(kp) == b"on the first client's segment"


def test_long_key(mc, key):
    k = key() + "k" * 300
    # DIFF: ecstore keys are 1..256 bytes.
    assert mc.store.put(k, b"abc") == (0 if mc.mooncake else -600)


def test_get_into_ranges(mc, key):
    s, k, miss = mc.store, key(), key("miss")
    assert s.put(k, bytes(range(100))) == 0
    dst, dp = buf(64)
    # Unregistered destination: refused by both.
    assert s.get_into_ranges([dp], [[k]], [[[0]]], [[[0]]], [[[4]]]) == [[[-600]]]
    assert s.register_buffer(dp, 64) == 0
    r = s.get_into_ranges([dp], [[k, miss]], [[[0, 10], [20]]], [[[5, 50], [0]]], [[[4, 3], [2]]])
    assert r == [[[4, 3], [-704]]]
    assert list(dst[:4]) == [5, 6, 7, 8] and list(dst[10:13]) == [50, 51, 52]
    assert s.get_into_ranges([dp], [[k]], [[[0]]], [[[98]]], [[[5]]]) == [[[-600]]]  # past the object
    assert s.get_into_ranges([dp], [[k]], [[[60]]], [[[0]]], [[[5]]]) == [[[-600]]]  # past the buffer
    assert s.get_into_ranges([dp], [[k]], [[[0, 10]]], [[[0, 99]]], [[[2, 5]]]) == [[[2, -600]]]
    assert s.get_into_ranges([dp], [[k]], [[[0]]], [[[0]]], [[[5, 6]]]) == [[[-600]]]
    assert s.get_into_ranges([dp, dp], [[k]], [[[0]], [[0]]], [[[0]], [[0]]], [[[1]], [[1]]]) == [[[-600]], [[-600]]]
    assert s.get_into_ranges([dp], [[k, k]], [[[0]]], [[[0]]], [[[1]]]) == [[[-600], [-600]]]
    assert s.get_into_ranges([dp], [[k]], [[[0, 3]]], [[[0, 1]]], [[[5, 0]]]) == [[[5, 0]]]
    assert s.get_into_ranges([], [], [], [], []) == []
    with pytest.raises(TypeError):
        s.get_into_ranges([dp], [[k]], [[[0]]], [[[-1]]], [[[2]]])
    assert s.unregister_buffer(dp) == 0


def test_register_buffer(mc):
    s = mc.store
    a, p = buf(4096)
    assert s.register_buffer(p, 4096) == 0
    assert s.unregister_buffer(p) == 0
    assert s.unregister_buffer(p + 8) == -600
    assert s.register_buffer(0, 10) == -600


# ---- tensors --------------------------------------------------------------------

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "uint16", "int32", "uint32",
          "int64", "uint64", "bool", "float8_e4m3fn", "float8_e5m2"]


def _sample(name, shape=(3, 5)):
    n = 1
    for d in shape:
        n *= d
    raw = torch.arange(n, dtype=torch.int64) * 37 % 97
    return (raw % 2).to(torch.bool).reshape(shape) if name == "bool" else \
        raw.to(torch.float32).to(getattr(torch, name)).reshape(shape)


def _same(a, b):
    return a is not None and a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and \
        torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("name", DTYPES)
def test_tensor_round_trip_every_dtype(mc, key, name):
    s, k = mc.store, key()
    t = _sample(name)
    assert s.put_tensor(k, t) == 0
    assert _same(s.get_tensor(k), t)
    staging = torch.zeros(HDR + t.numel() * t.element_size() + 64, dtype=torch.uint8)
    g = s.get_tensor_into(k, staging.data_ptr(), staging.numel())
    assert _same(g, t) and g.data_ptr() == staging.data_ptr() + HDR
    k2 = key()
    assert s.put_tensor_from(k2, staging.data_ptr(), HDR + t.numel() * t.element_size()) == 0
    assert _same(s.get_tensor(k2), t)


def test_tensor_batches_and_upserts(mc, key):
    s, a, b, miss = mc.store, key(), key(), key("miss")
    ta, tb = _sample("float32", (2, 4)), _sample("int64", (7,))
    assert s.batch_put_tensor([a, b], [ta, tb]) == [0, 0]
    got = s.batch_get_tensor([a, miss, b])
    assert _same(got[0], ta) and got[1] is None and _same(got[2], tb)
    assert s.batch_put_tensor([a, b], [ta]) == [-600, -600]
    st = torch.zeros(4096, dtype=torch.uint8)
    p = st.data_ptr()
    got = s.batch_get_tensor_into([a, miss, b], [p, p + 1024, p + 2048], [1024, 1024, 1024])
    assert _same(got[0], ta) and got[1] is None and _same(got[2], tb)
    c, d = key(), key()
    assert s.batch_put_tensor_from([c, d], [p, p + 2048], [HDR + 32, HDR + 56]) == [0, 0]
    assert _same(s.get_tensor(d), tb)
    tnew = _sample("bfloat16", (3, 3))
    assert s.upsert_tensor(a, tnew) == 0
    assert _same(s.get_tensor(a), tnew)
    assert s.batch_upsert_tensor([a, b], [ta, tnew]) == [0, 0]
    assert _same(s.get_tensor(a), ta) and _same(s.get_tensor(b), tnew)
    assert s.upsert_tensor_from(c, p + 2048, HDR + 56) == 0
    assert _same(s.get_tensor(c), tb)
    assert s.batch_upsert_tensor_from([c], [p], [HDR + 32]) == [0]
    assert _same(s.get_tensor(c), ta)


def test_tensor_errors_and_shapes(mc, key):
    s = mc.store
    assert s.put_tensor(key(), np.zeros(3, np.float32)) == -600  # not a torch tensor
    assert s.put_tensor(key(), torch.zeros(2, dtype=torch.complex64)) == -600
    assert s.put_tensor(key(), torch.zeros(*[1] * 9)) == -600  # > 8 dims
    assert s.get_tensor(key("miss")) is None
    k = key()
    t = torch.arange(12.0).reshape(3, 4).t()  # not contiguous: both copy it
    assert s.put_tensor(k, t) == 0
    assert torch.equal(s.get_tensor(k), t)
    small = torch.zeros(HDR + 8, dtype=torch.uint8)
    assert s.get_tensor_into(k, small.data_ptr(), small.numel()) is None  # too small
    assert s.get_tensor_into(key("miss"), small.data_ptr(), small.numel()) is None
    junk = torch.zeros(HDR + 64, dtype=torch.uint8)
    assert s.put_tensor_from(key(), junk.data_ptr(), junk.numel()) == -600  # no metadata there
    assert s.put_tensor_from(key(), junk.data_ptr(), 64) == -600
    e = key()
    assert s.put_tensor(e, torch.empty(0, 4)) == 0
    assert tuple(s.get_tensor(e).shape) == (0, 4)
    sc = key()
    assert s.put_tensor(sc, torch.tensor(3.5)) == 0
    # DIFF: Mooncake gives a 0-d tensor back as shape (1,); ecstore keeps ().
    got = s.get_tensor(sc)
    assert got.item() == 3.5 and tuple(got.shape) == ((1,) if mc.mooncake else ())


def test_tensor_with_tp(mc, key):
    """Tensor parallelism as Mooncake's *_with_tp: tp_size equal parts
    along split_dim under "{key}_tp_{r}", read back per rank; an uneven
    split is -600; tp_size 1 is the key itself; a rank past tp_size None."""
    s, k = mc.store, key()
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    assert s.put_tensor_with_tp(k, t, tp_size=2, split_dim=0) == 0
    assert s.batch_is_exist([k, k + "_tp_0", k + "_tp_1", k + "_tp_2"]) == [0, 1, 1, 0]
    for r in range(2):
        assert _same(s.get_tensor_with_tp(k, tp_rank=r, tp_size=2), t[2 * r:2 * r + 2])
        assert _same(s.get_tensor(k + "_tp_%d" % r), t[2 * r:2 * r + 2])
    assert s.get_size(k + "_tp_1") == HDR + 48
    assert s.get_tensor_with_tp(k, tp_rank=2, tp_size=2) is None
    k3 = key()
    assert s.put_tensor_with_tp(k3, t, tp_size=3, split_dim=1) == 0
    assert _same(s.get_tensor_with_tp(k3, 2, 3), t[:, 4:6].contiguous())
    assert s.put_tensor_with_tp(key(), t, tp_size=5) == -600  # 4 rows do not split into 5
    assert s.put_tensor_with_tp(key(), t, tp_size=2, split_dim=2) == -600
    one = key()
    assert s.put_tensor_with_tp(one, t, tp_size=1) == 0 and _same(s.get_tensor(one), t)
    assert _same(s.get_tensor_with_tp(one, 0, 1), t)
    z = key()
    assert s.put_tensor_with_tp(z, torch.empty((2, 0, 3)), tp_size=2) == 0
    assert tuple(s.get_tensor_with_tp(z, 1, 2).shape) == (1, 0, 3)
    b1, b2 = key(), key()
    assert s.batch_put_tensor_with_tp([b1, b2], [t, t * 2], tp_size=2) == [0, 0]
    got = s.batch_get_tensor_with_tp([b1, b2, key("miss")], tp_rank=1, tp_size=2)
    assert _same(got[0], t[2:]) and _same(got[1], t[2:] * 2) and got[2] is None
    st = torch.zeros(1024, dtype=torch.uint8)
    g = s.get_tensor_with_tp_into(k, st.data_ptr(), 1024, tp_rank=1, tp_size=2)
    assert _same(g, t[2:]) and g.data_ptr() == st.data_ptr() + HDR
    # a buffer get_tensor_with_tp_into wrote (a part's metadata) is split again
    f = key()
    assert s.put_tensor_with_tp_from(f, st.data_ptr(), HDR + 48, tp_size=2) == 0
    assert _same(s.get_tensor_with_tp(f, 1, 2), t[3:4])
    assert s.batch_get_tensor_with_tp_into([f], [st.data_ptr()], [1024], tp_rank=0, tp_size=2)[0] is not None


def test_tensor_metadata_layout_is_mooncakes(mooncake_env, ecstore_env, request):
    """Both directions at once: a buffer Mooncake's get_tensor_into wrote is
    taken by ecstore's put_tensor_from, and ecstore's get_tensor_into writes
    the same 304 metadata bytes as Mooncake's."""
    m, e = Backend(mooncake_env), Backend(ecstore_env)
    try:
        k = "layout-%d" % os.getpid()
        for name, shape in (("bfloat16", (5, 7)), ("bool", (2, 3, 4)), ("float64", (1,)), ("int16", (0, 3))):
            t = _sample(name, shape)
            n = HDR + t.numel() * t.element_size()
            bm, be = torch.zeros(n + 8, dtype=torch.uint8), torch.full((n + 8,), 9, dtype=torch.uint8)
            assert m.store.upsert_tensor(k, t) == 0 and e.store.upsert_tensor(k, t) == 0
            assert _same(m.store.get_tensor_into(k, bm.data_ptr(), n + 8), t)
            assert _same(e.store.get_tensor_into(k, be.data_ptr(), n + 8), t)
            assert bytes(bm[:n].numpy()) == bytes(be[:n].numpy()), name
            k2 = k + "-from-mooncake-" + name
            assert e.store.put_tensor_from(k2, bm.data_ptr(), n) == 0
            assert _same(e.store.get_tensor(k2), t)
            assert m.store.put_tensor_from(k2, be.data_ptr(), n) == 0
            assert _same(m.store.get_tensor(k2), t)
    finally:
        m.store.close()
        e.store.close()


# ---- after close ------------------------------------------------------------------


def test_calls_after_close_return_codes(ecstore_env):
    # ecstore only: Mooncake 0.3.13.post1 crashes the process (SIGSEGV) on a
    # put after close(), so that side cannot be run; docs/mooncake.md.
    b = Backend(ecstore_env)
    s = b.store
    assert s.close() == 0
    a, p = buf(8)
    assert s.put("k", b"x") == -1
    assert s.get("k") == b""
    assert s.batch_get_into(["k"], [p], [8]) == [-1]
    assert s.batch_is_exist(["k"]) == [-1]
    assert s.health_check() == 1
    assert s.close() == 0


# ---- the integrations' call shapes --------------------------------------------------


def test_vllm_ec_connector_call_shapes(mc, key):
    """As vLLM's Mooncake EC connector (ec_connector/mooncake_store_embedding)
    calls it: a ReplicateConfig labelled TENSOR; the put registers a header
    buffer and the tensor, then batch_put_from_multi_buffers([key], [[header,
    data]], [[len, len]]); the load checks batch_is_exist, registers one
    staging read buffer (pinned when there is CUDA) and batch_get_into's a
    chunk of keys at offsets in it, each result == header + data bytes; then
    unregister_buffer and close == 0.  The simpler zero-copy path
    (batch_put_from from registered staging) is checked too."""
    s = mc.new()
    rc = mc.mod.ReplicateConfig()
    rc.data_type = mc.mod.ObjectDataType.TENSOR
    keys = [key() for _ in range(3)]
    embs = [torch.randn(16, 32).to(torch.bfloat16) for _ in keys]
    hdr_struct = struct.Struct("<IIQQ")
    header = ctypes.create_string_buffer(hdr_struct.size)
    assert s.register_buffer(ctypes.addressof(header), hdr_struct.size) == 0
    for k, t in zip(keys, embs):
        ctypes.memmove(ctypes.addressof(header), hdr_struct.pack(0x4D4F4F4E, 12, *t.shape), hdr_struct.size)
        assert s.register_buffer(t.data_ptr(), t.nbytes) == 0
        assert s.batch_put_from_multi_buffers([k], [[ctypes.addressof(header), t.data_ptr()]],
                                              [[hdr_struct.size, t.nbytes]], rc) == [0]
        assert s.unregister_buffer(t.data_ptr()) == 0
    assert s.batch_is_exist(keys + [key("miss")]) == [1, 1, 1, 0]
    read = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
    assert s.register_buffer(read.data_ptr(), read.nbytes) == 0
    size = hdr_struct.size + embs[0].nbytes
    offs = [i * size for i in range(len(keys))]
    res = s.batch_get_into(keys, [read.data_ptr() + o for o in offs], [size] * len(keys))
    assert res == [size] * len(keys)
    for o, t in zip(offs, embs):
        assert hdr_struct.unpack(bytes(read[o:o + hdr_struct.size].numpy()))[0] == 0x4D4F4F4E
        got = read[o + hdr_struct.size:o + size].view(torch.bfloat16).view(16, 32)
        assert torch.equal(got, t)
    # zero-copy staging: batch_put_from out of the registered read buffer
    k2 = [key() for _ in range(2)]
    assert s.batch_put_from(k2, [read.data_ptr(), read.data_ptr() + size], [size, size], rc) == [0, 0]
    assert s.batch_get_into(k2, [read.data_ptr() + 4 * size, read.data_ptr() + 5 * size], [size, size]) == \
        [size, size]
    assert torch.equal(read[4 * size:6 * size], read[0:2 * size])
    assert s.unregister_buffer(read.data_ptr()) == 0
    assert s.unregister_buffer(ctypes.addressof(header)) == 0
    assert s.close() == 0


def test_sglang_hicache_call_shapes(mc, key):
    """As SGLang HiCache's Mooncake backend calls it: setup with eight
    positional arguments (the 8th a shared TransferEngine, None here); a
    warmup of put(4 KiB) == 0, is_exist == 1, get == the bytes;
    register_buffer on the host KV pool; then pages go out with
    batch_put_from and back with batch_get_into (results >= 0 are bytes),
    existence with batch_is_exist."""
    s = mc.mod.MooncakeDistributedStore()
    assert s.setup(*mc.env.args, None, **mc.env.kwargs) == 0
    warm = key("warmup")
    assert s.put(warm, bytes(4 * 1024)) == 0
    assert s.is_exist(warm) == 1
    assert s.get(warm) == bytes(4 * 1024)
    pool = torch.randint(0, 255, (8, 4096), dtype=torch.uint8)
    assert s.register_buffer(pool.data_ptr(), pool.numel()) == 0
    pages = [key("page") for _ in range(4)]
    ptrs = [pool[i].data_ptr() for i in range(4)]
    assert s.batch_put_from(pages, ptrs, [4096] * 4) == [0] * 4
    assert s.batch_is_exist(pages) == [1] * 4
    back = [pool[4 + i].data_ptr() for i in range(4)]
    assert s.batch_get_into(pages, back, [4096] * 4) == [4096] * 4
    assert torch.equal(pool[4:8], pool[0:4])
    assert s.close() == 0


def test_lmcache_call_shapes(mc, key):
    """As LMCache's Mooncake store backend calls it: setup with
    device_name as the 6th positional argument, a ReplicateConfig passed to
    put_from, get_into of a known size into a registered buffer, get_buffer
    for a read without a size, is_exist and remove."""
    s = mc.new()
    chunk = torch.randint(0, 255, (1 << 16,), dtype=torch.uint8)
    out = torch.zeros_like(chunk)
    assert s.register_buffer(chunk.data_ptr(), chunk.numel()) == 0
    assert s.register_buffer(out.data_ptr(), out.numel()) == 0
    k = key()
    assert s.put_from(k, chunk.data_ptr(), chunk.numel(), mc.mod.ReplicateConfig()) == 0
    assert s.is_exist(k) == 1
    assert s.get_into(k, out.data_ptr(), out.numel()) == chunk.numel()
    assert torch.equal(out, chunk)
    h = s.get_buffer(k)
    assert h.size() == chunk.numel()
    assert torch.equal(torch.frombuffer(h, dtype=torch.uint8), chunk)
    del h
    time.sleep(0.6)  # Mooncake's 500 ms read lease
    assert s.remove(k) == 0
    assert s.is_exist(k) == 0
    assert s.close() == 0


def test_lmcache_prefer_local_alloc_call_shapes(mc, key):
    """LMCache with mooncake_prefer_local_alloc: its ReplicateConfig names
    this client (preferred_segment = get_hostname()) and every put_from
    carries it; the puts must store (issue 25: they returned -600)."""
    s = mc.new()
    rc = mc.mod.ReplicateConfig()
    rc.replica_num = 1
    rc.preferred_segment = s.get_hostname()
    chunk = torch.randint(0, 255, (1 << 16,), dtype=torch.uint8)
    out = torch.zeros_like(chunk)
    assert s.register_buffer(chunk.data_ptr(), chunk.numel()) == 0
    assert s.register_buffer(out.data_ptr(), out.numel()) == 0
    k, k2, k3 = key(), key(), key()
    assert s.put_from(k, chunk.data_ptr(), chunk.numel(), rc) == 0
    assert s.batch_put_from([k2, k3], [chunk.data_ptr(), chunk.data_ptr() + 4096], [4096, 4096], rc) == [0, 0]
    assert s.batch_is_exist([k, k2, k3]) == [1, 1, 1]
    assert s.get_into(k, out.data_ptr(), out.numel()) == chunk.numel() and torch.equal(out, chunk)
    assert mc.store.get(k3) == bytes(chunk[4096:8192].numpy())  # another client reads it too
    assert s.unregister_buffer(chunk.data_ptr()) == 0 and s.unregister_buffer(out.data_ptr()) == 0
    assert s.close() == 0


# ---- the signatures ---------------------------------------------------------------


def _mooncake_params(doc):
    """[(name, has_default)] from the first pybind11 signature line of doc."""
    line = doc.strip().splitlines()[0]
    inner = line[line.index("(") + 1:line.rindex(")")]
    out = []
    for part in inner.split(", "):
        name = part.split(":")[0].split("=")[0].strip()
        if name != "self":
            out.append((name, "=" in part))
    return out


def test_signatures_match_mooncake(mooncake_env):
    """Every method ecstore.mooncake provides takes Mooncake's parameters by
    the same names, in the same order, with defaults in the same places
    (pybind11's unnamed argN are positional-only there: only their count is
    compared).  setup, with its two overloads, is tested by calls above."""
    import inspect

    import ecstore.mooncake as ours

    theirs = mooncake_env.mod.MooncakeDistributedStore
    checked = 0
    for name in dir(theirs):
        if name.startswith("_") or name == "setup" or not hasattr(ours.MooncakeDistributedStore, name):
            continue
        want = _mooncake_params(getattr(theirs, name).__doc__)
        sig = inspect.signature(getattr(ours.MooncakeDistributedStore, name))
        have = [(p.name if p.kind != p.VAR_POSITIONAL else "*" + p.name, p.default is not p.empty)
                for p in list(sig.parameters.values())[1:]]
        if all(n.startswith("arg") for n, _ in want):
            assert len(have) == len(want), name
        else:
            assert have == want, "%s: Mooncake %s, ecstore %s" % (name, want, have)
        checked += 1
    assert checked >= 40


@pytest.mark.parametrize(
    "header,unit,says",
    [
        (b"*300000000\r\n", b":1\r\n", "300000000 elements"),
        (b"$1000000000\r\n", b"x" * 64, "1000000000-byte string"),
        (b"*1\r\n" * 9 + b":1\r\n", b"", "nested deeper than 7"),
    ],
    ids=["array", "bulk", "nesting"],
)
def test_redis_scan_refuses_hostile_replies(header, unit, says):
    """remove_all's own Redis link (_redis_scan) against a hostile Redis
    (issue 13): a header announcing 300M elements, a 1 GB string (then
    16 MB of what it announced) or deep nesting is refused at the header
    with ConnectionError, never believed.  The peer is a fake on purpose:
    a real redis-server is not hostile."""
    import socket
    import threading

    from ecstore._mooncake_base import _redis_scan

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def serve():
        try:
            c, _ = srv.accept()
        except OSError:
            return
        c.settimeout(5)
        try:
            c.recv(65536)  # the SCAN
            c.sendall(header)
            chunk = unit * (65536 // len(unit)) if unit else b""
            for _ in range(256 if chunk else 0):
                c.sendall(chunk)
        except OSError:
            pass  # the victim hung up: what it should do
        finally:
            c.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    try:
        with pytest.raises(ConnectionError, match=says):
            _redis_scan("redis://127.0.0.1:%d" % port, b"x*", 5.0)
    finally:
        srv.close()
        th.join(10)
