"""Staging: a consumer whose loads would copy (tcp, or shm views turned
off) has its workers fetch each ready item into pinned host memory while
vLLM defers the request, so that ``start_load_caches`` only hands tensors
over.

The scheduler (``StageHub``) listens on a Unix socket named after vLLM's
instance id and data-parallel rank (abstract namespace, same user only:
the peer's uid is checked on both ends).  Each worker (``StageClient``)
connects to it from a thread of its own, says its TP rank, and then
receives ``stage`` and ``drop`` lists and answers ``staged`` / ``failed``.
An item is ready for vLLM once every connected worker answered for it, or
once ``stage_timeout_ms`` passed (the load then copies in the step, as
without staging): staging only moves a copy earlier, it never decides
whether an item loads.

Messages are JSON lines of at most _MAX_LINE bytes:
    worker -> scheduler: {"rank": r}, {"staged": [h...], "failed": [h...]}
    scheduler -> worker: {"stage": [[h, nbytes, dtype code, shape], ...]}
                         (nbytes -1: not known, read it from its holder),
                         {"drop": [h...]}
"""

import json
import os
import selectors
import socket
import struct
import threading
import time

_MAX_LINE = 1 << 20
_MAX_ITEMS = 4096  # per message


def channel_name(vllm_config, py):
    """The abstract socket name the scheduler and its workers share."""
    if py.get("stage_channel"):
        return py["stage_channel"]
    pc = getattr(vllm_config, "parallel_config", None)
    dp = int(getattr(pc, "data_parallel_rank", 0) or 0) if pc is not None else 0
    return "ecstore-vllm-stage/%d/%s/%d" % (os.getuid(), getattr(vllm_config, "instance_id", "") or "", dp)


def _addr(name):
    return "\0" + name


def _peer_uid_ok(sock):
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return False
    _, uid, _ = struct.unpack("3i", creds)
    return uid == os.getuid()


class _Lines:
    """Reads JSON lines from a non-blocking socket; None on a closed or
    misbehaving peer."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def read(self):
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return []
        except OSError:
            return None
        if not data:
            return None
        self.buf += data
        out = []
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            try:
                msg = json.loads(line)
            except Exception:  # noqa: BLE001 - ValueError, RecursionError (deep nesting): a bad peer
                return None
            if not isinstance(msg, dict):
                return None
            out.append(msg)
        if len(self.buf) > _MAX_LINE:
            return None
        return out


def _send(sock, msg, timeout_s=1.0):
    """Sends one message whole within timeout_s; False when it could not."""
    data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
    end = time.monotonic() + timeout_s
    view = memoryview(data)
    while view:
        try:
            n = sock.send(view)
            view = view[n:]
        except BlockingIOError:
            if time.monotonic() >= end:
                return False
            time.sleep(0.0005)
        except OSError:
            return False
    return True


def _hashes(v):
    if not isinstance(v, list) or len(v) > _MAX_ITEMS:
        return []
    return [h for h in v if isinstance(h, str) and 0 < len(h) <= 1024]


class StageHub:
    """The scheduler's end.  on_answer(rank, staged, failed) and
    on_gone(rank) are called on the hub's thread."""

    def __init__(self, name, on_answer, on_gone, warn):
        self.on_answer, self.on_gone, self.warn = on_answer, on_gone, warn
        self.lock = threading.Lock()
        self.workers = {}  # socket -> rank (None until it said)
        self.send_locks = {}  # socket -> Lock: one message at a time on it (the prefetch and vLLM's threads send)
        self.closed = False
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.listener.bind(_addr(name))
            self.listener.listen(16)
        except OSError:
            self.listener.close()
            raise
        self.listener.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.thread = threading.Thread(target=self._main, name="ecstore-stage-hub", daemon=True)
        self.thread.start()

    def ranks(self):
        """The ranks of the workers connected now."""
        with self.lock:
            return {r for r in self.workers.values() if r is not None}

    def stage(self, specs):
        """Asks every connected worker to stage specs [(h, nbytes, code,
        shape)]; returns the ranks asked."""
        return self._broadcast({"stage": [[h, int(n), int(c), list(s)] for h, n, c, s in specs]})

    def drop(self, hashes):
        if hashes:
            self._broadcast({"drop": list(hashes)})

    def _broadcast(self, msg):
        with self.lock:
            targets = [(s, r, self.send_locks.get(s)) for s, r in self.workers.items() if r is not None]
        asked = set()
        for s, r, lk in targets:
            if lk is None:
                continue
            with lk:
                ok = _send(s, msg)
            if ok:
                asked.add(r)
            else:
                self._forget(s)
        return asked

    def _forget(self, s):
        with self.lock:
            r = self.workers.pop(s, None)
            self.send_locks.pop(s, None)
        try:
            self.sel.unregister(s)
        except (KeyError, ValueError):
            pass
        s.close()
        if r is not None:
            try:
                self.on_gone(r)
            except Exception as e:  # noqa: BLE001 - the hub thread must live on
                self.warn.warn("stage", "ecstore EC connector: stage worker gone: %r", e)

    def _main(self):
        while not self.closed:
            try:
                events = self.sel.select(0.1)
            except (OSError, ValueError):
                return
            for key, _ in events:
                if key.fileobj is self.listener:
                    self._accept()
                    continue
                s, lines = key.fileobj, key.data
                msgs = lines.read()
                if msgs is None:
                    self._forget(s)
                    continue
                for m in msgs:
                    if "rank" in m:
                        r = m["rank"]
                        if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < 1 << 16:
                            self._forget(s)
                            break
                        with self.lock:
                            self.workers[s] = r
                    else:
                        with self.lock:
                            r = self.workers.get(s)
                        if r is not None:
                            try:
                                self.on_answer(r, _hashes(m.get("staged")), _hashes(m.get("failed")))
                            except Exception as e:  # noqa: BLE001 - this thread must live on
                                self.warn.warn("stage", "ecstore EC connector: stage answer: %r", e)

    def _accept(self):
        try:
            s, _ = self.listener.accept()
        except OSError:
            return
        if not _peer_uid_ok(s):
            self.warn.warn("stage", "ecstore EC connector: a process of another user connected to the stage "
                           "channel; refused")
            s.close()
            return
        s.setblocking(False)
        with self.lock:
            self.workers[s] = None
            self.send_locks[s] = threading.Lock()
        self.sel.register(s, selectors.EVENT_READ, _Lines(s))

    def close(self):
        self.closed = True
        self.thread.join(2.0)
        with self.lock:
            socks = list(self.workers)
            self.workers.clear()
        for s in socks:
            s.close()
        self.listener.close()
        self.sel.close()


class StageClient:
    """A worker's end: connects to the scheduler's hub (again every
    retry_s while it cannot), and hands each stage list to
    fetch(specs) -> (staged hashes, failed hashes), drop lists to
    drop(hashes).  Everything runs on its own thread."""

    def __init__(self, name, rank, fetch, drop, retry_s, warn):
        self.name, self.rank = name, rank
        self.fetch, self.drop_fn = fetch, drop
        self.retry_s = retry_s
        self.warn = warn
        self.closed = False
        self.connected = threading.Event()
        self.thread = threading.Thread(target=self._main, name="ecstore-stage", daemon=True)
        self.thread.start()

    def _connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(1.0)
            s.connect(_addr(self.name))
            if not _peer_uid_ok(s):
                raise OSError("the stage channel belongs to another user")
            s.setblocking(False)
            if not _send(s, {"rank": self.rank}):
                raise OSError("hello not sent")
        except OSError:
            s.close()
            return None
        return s

    def _main(self):
        while not self.closed:
            s = self._connect()
            if s is None:
                self._sleep(self.retry_s)
                continue
            self.connected.set()
            self._serve(s)
            self.connected.clear()
            s.close()

    def _sleep(self, t):
        end = time.monotonic() + t
        while not self.closed and time.monotonic() < end:
            time.sleep(min(0.05, end - time.monotonic()))

    def _serve(self, s):
        lines = _Lines(s)
        sel = selectors.DefaultSelector()
        sel.register(s, selectors.EVENT_READ)
        try:
            while not self.closed:
                if not sel.select(0.1):
                    continue
                msgs = lines.read()
                if msgs is None:
                    return
                for m in msgs:
                    if "drop" in m:
                        self.drop_fn(_hashes(m["drop"]))
                    specs = self._specs(m.get("stage"))
                    if specs:
                        try:
                            staged, failed = self.fetch(specs)
                        except Exception as e:  # noqa: BLE001 - this thread must live on
                            self.warn.warn("stage", "ecstore EC connector: staging: %r", e)
                            staged, failed = [], [h for h, *_ in specs]
                        if not _send(s, {"staged": staged, "failed": failed}):
                            return
        finally:
            sel.close()

    @staticmethod
    def _specs(v):
        out = []
        if not isinstance(v, list) or len(v) > _MAX_ITEMS:
            return out
        for e in v:
            if not (isinstance(e, list) and len(e) == 4):
                continue
            h, n, c, shape = e
            # n == -1: size, dtype and shape unknown (the worker learns them);
            # shape is then [rows a request expects], or [] (a size guess)
            if not (isinstance(h, str) and 0 < len(h) <= 1024 and isinstance(n, int) and -1 <= n < 1 << 40
                    and isinstance(c, int) and isinstance(shape, list) and len(shape) <= 8
                    and all(isinstance(d, int) and 0 <= d < 1 << 32 for d in shape)):
                continue
            out.append((h, n, c, tuple(shape)))
        return out

    def close(self):
        self.closed = True
        self.thread.join(2.0)
