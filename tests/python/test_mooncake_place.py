"""ecstore.mooncake's ReplicateConfig placement over several ecstore
servers (docs/mooncake.md "ReplicateConfig"): replica_num N stores N copies
on distinct servers and a get finds a copy when a holder is gone;
preferred_segment puts the object on the server of that host (servers on
127.0.0.2 and 127.0.0.3 stand for other hosts); without Redis the put
still succeeds with one copy.  ecstore only: the Mooncake half of these
behaviours (replica_num 2 and preferred segments accepted, a replica read
after its writer closed) is in test_mooncake.py and Mooncake's own
replicated-store tests."""

import ctypes
import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

from conftest import BIN_DIR, _die_with_parent, free_port, start_redis, start_server

import ecstore
import ecstore.mooncake as mc

NS = "pytest-mc-place"


class _Server:
    """An ecstore-server on host (a loopback address), waited for there."""

    def __init__(self, host, redis_port):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="ecs-py-place-")
        self.log = os.path.join(self.dir, "server.log")
        argv = [str(BIN_DIR / "ecstore-server"), "--listen", "%s:%d" % (host, self.port), "--redis",
                "127.0.0.1:%d" % redis_port, "--pool-size", "64M", "--ns", NS, "--log-level", "warn"]
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=self.dir,
                                         preexec_fn=_die_with_parent)
        end = time.monotonic() + 10
        while time.monotonic() < end and self.proc.poll() is None:
            try:
                with socket.create_connection((host, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        self.stop()
        pytest.fail("ecstore-server on %s:%d did not start: %s" % (host, self.port, open(self.log).read()))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    redis = start_redis()
    servers = [_Server(h, redis.port) for h in ("127.0.0.1", "127.0.0.2", "127.0.0.3")]
    addrs = ["%s:%d" % (h, s.port) for h, s in zip(("127.0.0.1", "127.0.0.2", "127.0.0.3"), servers)]
    yield redis, servers, addrs
    for s in servers:
        s.stop()
    redis.stop()


def _client(redis, addrs, meta=True):
    s = mc.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "redis://127.0.0.1:%d" % redis.port if meta else "P2PHANDSHAKE", 0, 16 << 20,
                   "tcp", "", ",".join(addrs), tenant_id=NS) == 0, s.last_error
    return s


def _holders(addrs, key):
    """The servers holding key, asked one by one (no Redis)."""
    out = []
    for a in addrs:
        st = ecstore.Store(servers=a, namespace=NS)
        try:
            if st.batch_is_exist([key]) == [1]:
                out.append(a)
        finally:
            st.close()
    return out


def test_replica_num_copies_and_a_lost_holder(cluster):
    redis, servers, addrs = cluster
    s = _client(redis, addrs)
    rc = mc.ReplicateConfig()
    rc.replica_num = 2
    keys = ["rep-%d-%d" % (os.getpid(), i) for i in range(6)]
    assert s.put_batch(keys, [b"copy %d" % i for i in range(6)], rc) == 0
    held = {k: _holders(addrs, k) for k in keys}
    assert all(len(h) == 2 for h in held.values()), held
    one = mc.ReplicateConfig()
    plain = "plain-%d" % os.getpid()
    assert s.put(plain, b"one copy", one) == 0 and len(_holders(addrs, plain)) == 1
    # three copies asked on three servers: three
    rc.replica_num = 3
    k3 = "rep3-%d" % os.getpid()
    assert s.put(k3, b"three", rc) == 0 and len(_holders(addrs, k3)) == 3
    # every client of the namespace reads every copy, whichever server the key hashes to
    r = _client(redis, addrs)
    assert r.get_batch(keys) == [b"copy %d" % i for i in range(6)]
    # remove reaches both copies
    assert s.remove(keys[0]) == 0 and _holders(addrs, keys[0]) == []
    assert r.close() == 0 and s.close() == 0


def test_preferred_segment_places_on_that_hosts_server(cluster):
    redis, servers, addrs = cluster
    s = _client(redis, addrs)
    for i, host in enumerate(("127.0.0.2", "127.0.0.3")):
        rc = mc.ReplicateConfig()
        rc.preferred_segment = "%s:%d" % (host, 12345 + i)
        ks = ["pref-%s-%d-%d" % (host, os.getpid(), j) for j in range(4)]
        assert s.put_batch(ks, [b"x"] * 4, rc) == 0
        assert all(_holders(addrs, k) == [addrs[1 + i]] for k in ks), [_holders(addrs, k) for k in ks]
        assert s.get_batch(ks) == [b"x"] * 4
    # preferred_segments (a list): the first that names a host with a server
    rc = mc.ReplicateConfig()
    rc.preferred_segments = ["10.255.255.1:1", "127.0.0.3:1"]
    k = "prefs-%d" % os.getpid()
    assert s.put(k, b"y", rc) == 0 and _holders(addrs, k) == [addrs[2]]
    # this client's own name (LMCache's prefer_local_alloc): this host's server
    rc = mc.ReplicateConfig()
    rc.preferred_segment = s.get_hostname()
    k = "self-%d" % os.getpid()
    assert s.put(k, b"z", rc) == 0 and _holders(addrs, k) == [addrs[0]]
    # a host with no server: placed as usual, the put succeeds (as Mooncake falls back)
    rc.preferred_segment = "10.255.255.1:1"
    k = "nohost-%d" % os.getpid()
    assert s.put(k, b"w", rc) == 0 and len(_holders(addrs, k)) == 1
    assert s.close() == 0


def test_without_redis_one_copy_and_success(cluster):
    redis, servers, addrs = cluster
    s = _client(redis, addrs, meta=False)
    rc = mc.ReplicateConfig()
    rc.replica_num = 2
    rc.preferred_segment = "127.0.0.3:1"
    k = "nometa-%d" % os.getpid()
    assert s.put(k, b"v", rc) == 0 and len(_holders(addrs, k)) == 1
    assert s.get(k) == b"v"
    assert s.close() == 0


def test_no_servers_listed_uses_the_registry(cluster):
    """master_server_addr "" with a Redis metadata server: the servers come
    from Redis's registry; replica_num and this host's segment are
    honoured there too."""
    redis, servers, addrs = cluster
    s = mc.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "redis://127.0.0.1:%d" % redis.port, 0, 16 << 20, "tcp", "", "",
                   tenant_id=NS) == 0, s.last_error
    rc = mc.ReplicateConfig()
    rc.replica_num = 2
    keys = ["reg-%d-%d" % (os.getpid(), i) for i in range(4)]
    assert s.put_batch(keys, [b"r"] * 4, rc) == 0
    assert all(len(_holders(addrs, k)) == 2 for k in keys)
    assert s.get_batch(keys) == [b"r"] * 4
    own = mc.ReplicateConfig()
    own.preferred_segment = s.get_hostname()
    k = "reg-own-%d" % os.getpid()
    assert s.put(k, b"o", own) == 0 and len(_holders(addrs, k)) == 1 and s.get(k) == b"o"
    assert s.remove(keys[0]) == 0 and _holders(addrs, keys[0]) == []
    assert s.close() == 0
    bare = mc.MooncakeDistributedStore()
    assert bare.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", "") == -1  # nowhere to find servers


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("ttl_ms,kept", [(60000, True), (200, False)], ids=["pinned", "pin-expired"])
def test_soft_pin_evicted_last(ttl_ms, kept, transport):
    """A soft-pinned put (ReplicateConfig soft_pin_action ENABLE) is evicted
    only after every unpinned object, for the server's --soft-pin-ttl-ms:
    the server's pool (8 MiB) is filled three times over after it, and it
    is still there; once its pin expired it goes in FIFO order, first.
    Over tcp (the flag rides the PUT) and shm (it rides the RESERVE; the
    COMMIT has none)."""
    redis = start_redis()
    server = start_server(redis.port, "--soft-pin-ttl-ms", str(ttl_ms), ns=NS + "-pin", pool="8M")
    try:
        s = mc.MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "redis://127.0.0.1:%d" % redis.port, 0, 16 << 20, transport, "",
                       "127.0.0.1:%d" % server.port, tenant_id=NS + "-pin") == 0, s.last_error
        pin = mc.ReplicateConfig()
        pin.soft_pin_action = mc.SoftPinAction.ENABLE
        blob = bytes(1 << 20)
        assert s.put("pinned", b"p" + blob[1:], pin) == 0
        assert s.put("plain", b"q" + blob[1:]) == 0  # the next oldest, unpinned
        if not kept:
            time.sleep(ttl_ms / 1000.0 + 0.2)
        for i in range(24):
            assert s.put("fill-%d" % i, bytes([i]) * (1 << 20)) == 0
        assert s.is_exist("plain") == 0
        assert s.is_exist("pinned") == (1 if kept else 0)
        if kept:
            assert s.get("pinned")[:1] == b"p"
            # later puts go on without the pin
            assert s.put("after", b"a" + blob[1:]) == 0 and s.is_exist("pinned") == 1
        assert s.close() == 0
    finally:
        server.stop()
        redis.stop()


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_hard_pin_kept_and_bounded(transport):
    """A hard-pinned put (ReplicateConfig with_hard_pin) is never evicted:
    the server's pool (8 MiB) is filled three times over after it, and the
    background eviction runs, and it is still there.  Hard pins are bounded
    by --hard-pin-max (2 MiB here): one past it is refused alone
    (NO_AVAILABLE_HANDLE, the item's neighbours stored), plain puts go on,
    and a remove gives its room back.  Over tcp (the flag rides the PUT)
    and shm (the RESERVE)."""
    redis = start_redis()
    server = start_server(redis.port, "--hard-pin-max", "2M", ns=NS + "-hard", pool="8M")
    try:
        s = mc.MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "redis://127.0.0.1:%d" % redis.port, 0, 16 << 20, transport, "",
                       "127.0.0.1:%d" % server.port, tenant_id=NS + "-hard") == 0, s.last_error
        hard = mc.ReplicateConfig()
        hard.with_hard_pin = True
        mib = 1 << 20
        assert s.put("h0", b"h" * mib, hard) == 0
        bufs = [ctypes.create_string_buffer(bytes([65 + i]) * mib, mib) for i in range(2)]
        ptrs = [ctypes.addressof(b) for b in bufs]
        # h1 takes the rest of the cap; h2, past it, is refused alone
        assert s.batch_put_from(["h1", "h2"], ptrs, [mib, mib], hard) == [0, mc.NO_AVAILABLE_HANDLE]
        assert s.is_exist("h2") == 0
        assert s.put("h2", b"j" * mib, hard) == mc.NO_AVAILABLE_HANDLE
        assert s.put("plain", b"p" * mib) == 0  # plain puts are not bounded by it
        for i in range(24):
            assert s.put("fill-%d" % i, bytes([i]) * mib) == 0
        time.sleep(0.3)  # the background eviction's ticks
        assert s.get("h0") == b"h" * mib and s.get("h1") == b"A" * mib
        assert s.is_exist("fill-0") == 0  # the plain ones went
        assert s.remove("h0") == 0
        assert s.put("h2", b"j" * mib, hard) == 0
        for i in range(24, 40):
            assert s.put("fill-%d" % i, bytes([i]) * mib) == 0
        assert s.get("h2") == b"j" * mib and s.get("h1") == b"A" * mib
        assert s.close() == 0
    finally:
        server.stop()
        redis.stop()


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_soft_pin_own_ttl(transport):
    """ReplicateConfig.soft_pin_ttl_ms is the put's own pin TTL (the server's
    --soft-pin-ttl-ms is 10 minutes here): a 300 ms pin is over after half
    a second and its object then goes in FIFO order, first; a 60 s pin
    keeps its object through the same pressure."""
    redis = start_redis()
    server = start_server(redis.port, "--soft-pin-ttl-ms", "600000", ns=NS + "-ttl", pool="8M")
    try:
        s = mc.MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "redis://127.0.0.1:%d" % redis.port, 0, 16 << 20, transport, "",
                       "127.0.0.1:%d" % server.port, tenant_id=NS + "-ttl") == 0, s.last_error
        short, long_ = mc.ReplicateConfig(), mc.ReplicateConfig()
        short.soft_pin_action = long_.soft_pin_action = mc.SoftPinAction.ENABLE
        short.soft_pin_ttl_ms = 300  # on the wire in whole seconds: 1 s
        long_.soft_pin_ttl_ms = 60000
        mib = 1 << 20
        assert s.put("short", b"s" * mib, short) == 0
        assert s.put("long", b"l" * mib, long_) == 0
        time.sleep(1.3)
        for i in range(24):
            assert s.put("fill-%d" % i, bytes([i]) * mib) == 0
        assert s.is_exist("short") == 0
        assert s.get("long") == b"l" * mib
        assert s.close() == 0
    finally:
        server.stop()
        redis.stop()


def test_replica_survives_its_holder_stopping(cluster):
    """Last (it stops a server): two copies, one holder stopped; every key
    is still read (from the other holder, found through Redis)."""
    redis, servers, addrs = cluster
    s = _client(redis, addrs)
    rc = mc.ReplicateConfig()
    rc.replica_num = 2
    keys = ["surv-%d-%d" % (os.getpid(), i) for i in range(12)]
    assert s.put_batch(keys, [b"k%d" % i for i in range(12)], rc) == 0
    victim = 1
    lost = [k for k in keys if addrs[victim] in _holders(addrs, k)]
    assert lost
    servers[victim].stop()
    # the writer (its connection to the stopped server fails), and a client
    # listing the servers still up (the keys hash elsewhere: misses there)
    assert s.get_batch(keys) == [b"k%d" % i for i in range(12)]
    r = _client(redis, [a for i, a in enumerate(addrs) if i != victim])
    assert r.get_batch(keys) == [b"k%d" % i for i in range(12)]
    assert r.close() == 0 and s.close() == 0
