"""Pending markers: "a save of this key has started", in Redis.

A producer marks the keys it is about to save (``ecs:{ns}:pend:{key}``, a
string with a TTL) in one pipelined round trip before its save returns, and
deletes the marks once the puts are done (stored or failed).  A consumer
reads the marks with the object records: a marked key is coming, so it
waits for it instead of encoding it again.  A producer killed mid-save
leaves marks that expire after their TTL; a consumer then stops waiting
(docs/vllm.md, "Saves that return at once").

The link is a plain socket (no Redis package), with the C link's URL forms
and password sources (``_mooncake_base.redis_endpoint``).  Every call is
bounded by ``timeout_s``; after a failure the link stays down for
``backoff_s`` (calls then fail at once), so a frozen Redis costs one
timeout per backoff, not one per call.
"""

import os
import socket
import threading
import time

from . import _mooncake_base as _mb

#: The longest marker value kept (producer id and time: a few dozen bytes).
_MAX_VALUE = 256


def read_password_file(path):
    """The first line of a ``chmod 600`` file (the C connector's rule for
    ``redis_password_file``)."""
    st = os.stat(path)
    if st.st_mode & 0o077:
        raise PermissionError("%s: group or others can access it (chmod 600 it)" % path)
    with open(path) as f:
        return f.readline().rstrip("\r\n")


class PendingMarks:
    """Marks of one namespace in one Redis; safe from any thread (one
    connection, one call at a time)."""

    def __init__(self, url, namespace, ttl_ms, timeout_s=0.5, backoff_s=1.0, password=None):
        if not url:
            raise ValueError("pending marks need a redis_url")
        self.url = url if "://" in url else "redis://" + url
        self.prefix = ("ecs:{%s}:pend:" % namespace).encode()
        self.ttl_ms = int(ttl_ms)
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.password = password
        self.lock = threading.Lock()
        self.conn = None
        self.down_until = 0.0
        self.last_error = None

    def key(self, k):
        return self.prefix + (k.encode() if isinstance(k, str) else bytes(k))

    def _connect(self):
        host, port, user, password, db = _mb.redis_endpoint(self.url, self.timeout_s)
        if self.password:
            password = self.password
        r = _mb.redis_login(host, port, user, password, db, self.timeout_s)
        try:  # Redis Cluster: the namespace's slot may live on another node
            r.cmd("EXISTS", self.prefix)
        except _mb.RedisReplyError as e:
            r.close()
            if not str(e).startswith("MOVED "):
                raise
            host, port = _mb._hostport(str(e).split()[2])
            r = _mb.redis_login(host, port, user, password, db, self.timeout_s)
        return r

    def _run(self, cmds):
        """Replies of cmds (one round trip), or raises ConnectionError/OSError
        (the link is then down for backoff_s).  Waits at most timeout_s for
        the link: another thread may hold it through a (re)connect of
        several round trips, and a hook must not wait that out."""
        if not self.lock.acquire(timeout=self.timeout_s):
            raise ConnectionError("redis link busy (another call holds it for more than %.2fs)" % self.timeout_s)
        try:
            return self._run_locked(cmds)
        finally:
            self.lock.release()

    def _run_locked(self, cmds):
        if self.conn is None:
            if time.monotonic() < self.down_until:
                raise ConnectionError("redis link down after: %s" % self.last_error)
            try:
                self.conn = self._connect()
            except (OSError, ValueError, ConnectionError) as e:
                self._down(e)
                raise ConnectionError(str(e)) from None
        try:
            return self.conn.pipeline(cmds)
        except (OSError, ValueError, ConnectionError) as e:
            self.conn.close()
            self.conn = None
            self._down(e)
            raise ConnectionError(str(e)) from None

    def _down(self, e):
        self.last_error = e if not isinstance(e, socket.timeout) else "timed out after %.2fs" % self.timeout_s
        self.down_until = time.monotonic() + self.backoff_s

    def mark(self, keys, value=b""):
        """Marks keys as being saved (SET PX), one round trip.  Raises
        ConnectionError when Redis did not take them."""
        if not keys:
            return
        value = value[:_MAX_VALUE]
        reps = self._run([(b"SET", self.key(k), value, b"PX", self.ttl_ms) for k in keys])
        bad = [r for r in reps if isinstance(r, Exception)]
        if bad:
            raise ConnectionError("redis refused a pending mark: %s" % bad[0])

    def unmark(self, keys):
        """Deletes the marks of keys (their saves are done), one round trip;
        a failure is ignored (the marks expire)."""
        if not keys:
            return
        try:
            self._run([[b"DEL"] + [self.key(k) for k in keys]])
        except ConnectionError:
            pass

    def pending(self, keys):
        """[bool] per key: is a save of it marked?  Raises ConnectionError."""
        if not keys:
            return []
        rep = self._run([[b"MGET"] + [self.key(k) for k in keys]])[0]
        if not isinstance(rep, list) or len(rep) != len(keys):
            raise ConnectionError("unexpected Redis reply to MGET: %r" % (rep,)[:80])
        return [v is not None for v in rep]

    def close(self):
        with self.lock:
            if self.conn is not None:
                self.conn.close()
                self.conn = None
