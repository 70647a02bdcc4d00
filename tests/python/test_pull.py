"""PULL: a server fetches objects from another server of its namespace
straight into its own pool (Store.locate + Store.pull), against real
redis-server and ecstore-server processes on free loopback ports.

Each test starts its own servers: some stop or kill them."""

import os
import socket
import tempfile
import threading
import time

import pytest
import torch

import ecstore
from ecstore import codes
from conftest import NAMESPACE, start_redis, start_server


class Hosts:
    def __init__(self, *server_args, n=2, ns=NAMESPACE):
        self.redis = start_redis()
        self.procs = []
        try:
            for args in (server_args or [()] * n):
                self.procs.append(start_server(self.redis.port, *args, ns=ns))
        except Exception:
            self.stop()
            raise
        self.stores = []

    @property
    def url(self):
        return "redis://127.0.0.1:%d" % self.redis.port

    def addr(self, i):
        return "127.0.0.1:%d" % self.procs[i].port

    def store(self, i=None, **over):
        """A store on server i (None: discovery through Redis)."""
        cfg = {"redis_url": self.url, "namespace": NAMESPACE, "timeout_ms": 5000}
        if i is not None:
            cfg["servers"] = self.addr(i)
        cfg.update(over)
        s = ecstore.connect(cfg)
        self.stores.append(s)
        return s

    def settle(self, i, j, **over):
        """Waits until server i knows server j from the registry (its copy is
        read every second, and at once when asked for an address it lacks)."""
        s = self.store(i, **over)
        end = time.monotonic() + 5
        while s.pull(["settle-probe"], [self.addr(j)]) in ([codes.EPERM], [codes.EBUSY]) and time.monotonic() < end:
            time.sleep(0.02)
        assert s.pull(["settle-probe"], [self.addr(j)]) == [codes.ENOTFOUND]

    def stop(self):
        """Stops everything; the exit codes of the servers (0 unless a test
        killed one: a crash or a sanitizer report fails the test)."""
        for s in getattr(self, "stores", []):
            s.close()
        rcs = [p.stop() for p in self.procs]
        self.redis.stop()
        return rcs


@pytest.fixture
def hosts_factory():
    made = []

    def make(*args, **kw):
        h = Hosts(*args, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        assert all(rc in (0, -9) for rc in h.stop()), "an ecstore-server exited badly (see its log)"


def wait_registered(store, key, timeout=5.0):
    """The holder of key as Redis says, once it says so."""
    end = time.monotonic() + timeout
    while True:
        st, addr, node, _ = store.locate([key])[0]
        if st == 0 or time.monotonic() > end:
            return st, addr, node
        time.sleep(0.05)


def test_pull_brings_bit_identical_bytes_with_one_transfer(hosts_factory):
    h = hosts_factory()
    h.settle(1, 0)
    a, disc, b = h.store(0), h.store(), h.store(1)
    g = torch.Generator().manual_seed(7)
    ts = [torch.randint(-(2**31), 2**31 - 1, (1000 + i, 512), dtype=torch.int32, generator=g) for i in range(3)]
    ts.append(torch.zeros((0, 8), dtype=torch.float16))  # an empty tensor is an object too
    keys = ["pull-a", "pull-b", "pull-c", "pull-empty"]
    assert a.batch_put_tensors(keys, ts) == [0] * 4
    locs = disc.locate(keys + ["pull-none"])
    assert [l[0] for l in locs] == [0, 0, 0, 0, codes.ENOTFOUND]
    assert all(l[1] == h.addr(0) for l in locs[:4])
    gets_before = a.stat()["gets"]
    sts = b.pull(keys + ["pull-none", "pull-a"], [l[1] for l in locs[:4]] + [h.addr(0)] * 2)
    assert sts == [0, 0, 0, 0, codes.ENOTFOUND, 0]  # a key named twice is stored once, OK twice
    # one GET item per named key reached the holder: the bytes crossed once
    assert a.stat()["gets"] - gets_before == 6
    # B holds them as its own objects: a store that knows only B reads them
    only_b = h.store(1, redis_url=None)
    got, st = only_b.batch_get_tensors(keys, with_status=True)
    assert st == [0] * 4
    for t, u in zip(ts, got):
        assert u.dtype == t.dtype and tuple(u.shape) == tuple(t.shape)
        assert torch.equal(u, t)
    views = only_b.get_views(keys[:3])
    assert views.statuses == [0, 0, 0]
    for i, t in enumerate(ts[:3]):
        assert bytes(views.tensor(i).numpy()) == t.numpy().tobytes()
    views.release()
    # again: already here, answered without asking the holder
    gets_before = a.stat()["gets"]
    assert b.pull(keys, [h.addr(0)] * 4) == [0] * 4
    assert a.stat()["gets"] == gets_before
    # B's record makes it a holder too: with A gone, discovery finds B's copy
    h.procs[0].stop()
    end = time.monotonic() + 5
    while time.monotonic() < end:
        st, addr, _ = wait_registered(disc, "pull-a", timeout=0.2)
        if st == 0 and addr == h.addr(1):
            break
        time.sleep(0.1)
    assert (st, addr) == (0, h.addr(1))


def test_pull_refuses_an_address_that_is_not_a_registered_server(hosts_factory):
    """A client cannot make the server dial an arbitrary host:port (SSRF):
    only the registry's servers of its namespace, never itself."""
    h = hosts_factory()
    h.settle(1, 0)
    a, b = h.store(0), h.store(1)
    assert a.batch_put_tensors(["ssrf-k"], [torch.ones(16)]) == [0]
    trap = socket.socket()
    trap.bind(("127.0.0.1", 0))
    trap.listen(8)
    trap.setblocking(False)
    other = start_server(h.redis.port, ns="other-ns")  # registered, but in another namespace
    try:
        bad = ["127.0.0.1:%d" % trap.getsockname()[1], "127.0.0.1:%d" % other.port, "localhost:%d" % h.procs[0].port,
               "x" * 255, "%s:%d" % ("127.0.0.1", 1)]
        assert b.pull(["ssrf-k"] * len(bad), bad) == [codes.EPERM] * len(bad)
        assert b.pull(["ssrf-k"], [h.addr(1)]) == [codes.EINVAL]  # the server itself
        assert b.pull(["ssrf-k"], ["x" * 256]) == [codes.EINVAL]  # over the wire's bound: never sent
        time.sleep(0.3)
        with pytest.raises(BlockingIOError):
            trap.accept()  # nobody connected to the trap
        # the registered holder, named as registered, works
        assert b.pull(["ssrf-k"], [h.addr(0)]) == [0]
    finally:
        trap.close()
        other.stop()


def test_stopped_or_dead_holder_fails_within_the_deadline_while_the_server_serves(hosts_factory):
    h = hosts_factory(n=3)
    h.settle(1, 0)
    h.settle(1, 2)
    a, c, b = h.store(0), h.store(2), h.store(1, timeout_ms=1500)
    t = torch.arange(4096, dtype=torch.float32)
    assert a.batch_put_tensors(["stop-k"], [t]) == [0]
    assert c.batch_put_tensors(["live-k"], [t * 3]) == [0]
    h.procs[0].pause()  # SIGSTOP: its socket still accepts, nothing answers
    try:
        out = {}

        def stalled():
            t0 = time.monotonic()
            out["st"] = b.pull(["stop-k"], [h.addr(0)])
            out["s"] = time.monotonic() - t0

        th = threading.Thread(target=stalled)
        th.start()
        time.sleep(0.2)
        # meanwhile the pulling server answers others at once: a put, a get,
        # and a pull from a live holder
        other = h.store(1, timeout_ms=5000)
        t0 = time.monotonic()
        assert other.batch_put_tensors(["side-k"], [t]) == [0]
        assert torch.equal(other.get_tensor("side-k"), t)
        assert other.pull(["live-k"], [h.addr(2)]) == [0]
        assert time.monotonic() - t0 < 1.0
        th.join(10)
        assert out["st"] == [codes.ETIMEDOUT]
        assert out["s"] < 2.5  # the call's own deadline (1.5 s), not longer
    finally:
        h.procs[0].resume()
    assert b.pull(["stop-k"], [h.addr(0)]) == [0]  # back: it works
    # dead: refused at once, and the server stays up
    assert c.batch_put_tensors(["dead-k"], [t]) == [0]
    h.procs[2].proc.kill()
    h.procs[2].proc.wait()
    t0 = time.monotonic()
    assert b.pull(["dead-k"], [h.addr(2)]) == [codes.ECONN]
    assert time.monotonic() - t0 < 1.0
    assert b.stat()["objects"] >= 3


def _acl(tmp, lines):
    p = os.path.join(tmp, "acl")
    with open(p, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.chmod(p, 0o600)
    return p


def test_pull_needs_read_and_write_and_proves_itself_to_the_holder(hosts_factory):
    tmp = tempfile.mkdtemp(prefix="ecs-pull-acl-")
    acl = _acl(tmp, ["rw-tok %s read,write" % NAMESPACE, "wo-tok %s write" % NAMESPACE,
                     "ro-tok %s read" % NAMESPACE, "peer-tok %s read" % NAMESPACE])
    tokf = os.path.join(tmp, "peer")
    with open(tokf, "w") as f:
        f.write("peer-tok\n")
    os.chmod(tokf, 0o600)
    bad_tok = os.path.join(tmp, "bad")
    with open(bad_tok, "w") as f:
        f.write("nobody-tok\n")
    os.chmod(bad_tok, 0o600)
    h = hosts_factory(("--acl-file", acl), ("--acl-file", acl, "--pull-token-file", tokf),
                      ("--acl-file", acl, "--pull-token-file", bad_tok))
    h.settle(1, 0, auth_token="rw-tok")
    a = h.store(0, auth_token="rw-tok")
    assert a.batch_put_tensors(["acl-k"], [torch.ones(64)]) == [0]
    assert h.store(1, auth_token="wo-tok").pull(["acl-k"], [h.addr(0)]) == [codes.EPERM]
    with pytest.raises(ecstore.EcstoreError) as e:
        h.store(1, auth_token="ro-tok").pull(["acl-k"], [h.addr(0)])
    assert e.value.code == codes.EPERM
    # a pulling server whose token the holder does not know gets nothing
    end = time.monotonic() + 5
    while h.store(2, auth_token="rw-tok").pull(["acl-k"], [h.addr(0)]) in ([codes.EPERM], [codes.EBUSY]):
        assert time.monotonic() < end
        time.sleep(0.02)
    assert h.store(2, auth_token="rw-tok").pull(["acl-k"], [h.addr(0)]) == [codes.EAUTH]
    b = h.store(1, auth_token="rw-tok")
    assert b.pull(["acl-k"], [h.addr(0)]) == [0]
    assert torch.equal(b.get_tensor("acl-k"), torch.ones(64))


def test_a_server_without_redis_says_it_cannot_pull(hosts_factory):
    r = start_redis()
    lone = start_server(None)
    try:
        s = ecstore.connect({"servers": "127.0.0.1:%d" % lone.port, "namespace": NAMESPACE})
        with pytest.raises(ecstore.EcstoreError) as e:
            s.pull(["k"], ["127.0.0.1:1"])
        assert e.value.code == codes.ENOTSUP
        s.close()
    finally:
        lone.stop()
        r.stop()


# ---- a hostile holder ------------------------------------------------------------

import struct
import subprocess

_HDR = struct.Struct("<IBBHIiIIQ")  # magic version opcode flags req_id status count meta_len data_len


def _reply(op, req_id, meta=b"", data_len=0, count=0):
    return _HDR.pack(0x31534345, 2, op, 1, req_id, 0, count, len(meta), data_len) + meta


def _recv_exact(c, n):
    b = b""
    while len(b) < n:
        got = c.recv(n - len(b))
        if not got:
            raise EOFError
        b += got
    return b


def _fake_holder(sock, node_id, mode, served):
    """Answers HELLO as node_id, then one GET with a lie (mode)."""
    try:
        c, _ = sock.accept()
    except OSError:
        return
    c.settimeout(5)
    with c:
        try:
            while True:
                hdr = _HDR.unpack(_recv_exact(c, 32))
                _recv_exact(c, hdr[7])
                op, req = hdr[2], hdr[4]
                if op == 1:  # HELLO: node id, max_items 16, epoch, pool 1 GiB, max_data
                    nid = node_id.encode()
                    meta = struct.pack("<HHIQQQ", len(nid), 0, 16, 1, 1 << 30, 1 << 30) + nid + struct.pack("<H", 0)
                    c.sendall(_reply(1, req, meta))
                    continue
                served.append(mode)
                size = 1 << 40 if mode == "huge" else 64
                dlen = {"huge": 1 << 40, "mismatch": 128}.get(mode, 64)
                rec = struct.pack("<iBBBBQQQ", 0, 0, 7, 1, 0, size, size, 0x1234) + struct.pack("<Q", size)
                payload = b"\x07" * (32 if mode == "short" else 64)
                c.sendall(_reply(3, req, rec, data_len=dlen, count=1) + payload)
                time.sleep(3 if mode == "short" else 0.1)  # short: the rest never comes
                return
        except (EOFError, OSError):
            return


@pytest.mark.parametrize("mode,want", [("huge", codes.EPROTO), ("mismatch", codes.EPROTO),
                                       ("short", codes.ETIMEDOUT), ("corrupt", codes.ECHECKSUM)])
def test_a_lying_holder_costs_its_items_only(hosts_factory, mode, want):
    """A registered entry that answers with sizes it cannot back: over the
    pool, or a data section that disagrees with its items (nothing is
    reserved); bytes that stop coming (the deadline); bytes that fail their
    checksum (nothing is stored).  The server stays
    up and stores nothing."""
    h = hosts_factory(n=1)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    addr = "127.0.0.1:%d" % sock.getsockname()[1]
    node = "fake-" + mode
    cli = ["redis-cli", "-p", str(h.redis.port)]
    subprocess.run(cli + ["HSET", "ecs:{%s}:node:%s" % (NAMESPACE, node), "addr", addr, "port", "0", "pool",
                          str(1 << 30), "epoch", "1", "started", "1", "free", "0"], check=True, capture_output=True)
    subprocess.run(cli + ["SADD", "ecs:{%s}:nodes" % NAMESPACE, node], check=True, capture_output=True)
    served = []
    th = threading.Thread(target=_fake_holder, args=(sock, node, mode, served), daemon=True)
    th.start()
    try:
        b = h.store(0, timeout_ms=1500)
        end = time.monotonic() + 5
        st = b.pull(["lie-k"], [addr])
        while st in ([codes.EPERM], [codes.EBUSY]) and time.monotonic() < end:  # until its registry copy has it
            time.sleep(0.05)
            st = b.pull(["lie-k"], [addr])
        assert st == [want]
        assert served == [mode]
        assert b.batch_is_exist(["lie-k"]) == [0]
        st = b.stat()
        assert st["objects"] == 0 and st["bytes_in_use"] == 0  # no block left reserved
        assert b.batch_put_tensors(["after"], [torch.ones(8)]) == [0]  # up and serving
    finally:
        sock.close()
        th.join(5)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_pull_of_a_compressed_shuffled_object(hosts_factory, codec):
    """A tcp put with compression stores 16/32-bit tensors compressed and
    byte-shuffled; the pulling server must take the holder's reply as the
    client's get does (the size check once passed the shuffle flag to the
    codec bound, which refused it: EPROTO for the whole batch)."""
    h = hosts_factory()
    h.settle(1, 0)
    a, b = h.store(0, compression=codec, transport="tcp"), h.store(1)
    keys = ["cz-i32", "cz-f16"]
    ts = [torch.arange(200000, dtype=torch.int32).reshape(400, 500), torch.zeros(300, 700, dtype=torch.float16)]
    assert a.batch_put_tensors(keys, ts) == [0, 0]
    assert b.pull(keys, [h.addr(0)] * 2) == [0, 0]
    got, st = h.store(1, redis_url=None).batch_get_tensors(keys, with_status=True)
    assert st == [0, 0]
    for t, u in zip(ts, got):
        assert torch.equal(u, t)
