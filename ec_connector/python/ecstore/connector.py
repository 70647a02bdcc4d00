"""The EC connector: vLLM's ECConnector roles over the C ec_connector.

>>> conn = ecstore.ECConnector({"backend": "ecstore", "servers": "127.0.0.1:7700",
...                             "redis_url": "redis://127.0.0.1:6379", "namespace": "m"})
>>> conn.save_caches({"h1": emb}, "h1")        # producer: async put, returns at once
>>> conn.wait_for_save()                       # [] when every save is stored
>>> conn.has_caches(["h1", "h2"])              # scheduler: [True, False] (Redis only)
>>> ld = conn.start_load_caches({"h1": out})   # consumer: async load into out
>>> ld.wait()                                  # [tensor view of out] (None for a miss)

Roles (vLLM ECConnectorBase -> here -> C):

- producer: ``save_caches(encoder_cache, mm_hash)`` / ``save(mm_hash,
  tensor)`` -> ecs_ec_save (the bytes are copied into the connector's
  pinned staging pool before the call returns, so the tensor may be reused
  at once); ``wait_for_save(timeout_ms)`` -> ecs_ec_wait_for_save.
- scheduler: ``has_caches(mm_hashes)`` / ``has_cache_item(mm_hash)`` ->
  ecs_ec_has (Redis only with the ecstore backend).
- consumer: ``start_load_caches(items)`` -> ecs_ec_start_load, returns a
  :class:`LoadHandle`; ``LoadHandle.wait()/poll()/release()`` ->
  ecs_ec_wait_for_load / ecs_ec_poll_load / ecs_ec_load_release.

Config: a dict, a JSON string or a path to a JSON file, with the keys of
ecs_ec_config_t (docs/connector.md): backend, servers, redis_url,
namespace, auth_token, protocol, device, compression, timeouts,
staging_bytes, queue_depth, ...  The C parser checks it: an unknown key or
a bad value raises InvalidArgumentError naming the key.

Threads: every method may be called from any thread (the C connector locks
per role); close() waits for calls in flight.  A LoadHandle is used by one
thread at a time.  The GIL is released during every C call.
"""

import ctypes
import json
import os
import threading
import weakref

from . import _lib
from . import codes
from . import tensors as _t
from .errors import check, make_error


class SaveFailure(tuple):
    """(mm_hash, code) of a save that failed, as wait_for_save reports it."""

    __slots__ = ()

    def __new__(cls, mm_hash, code):
        return tuple.__new__(cls, (mm_hash, code))

    mm_hash = property(lambda self: self[0])
    code = property(lambda self: self[1])

    @property
    def error(self):
        """The exception this failure's code maps to (not raised)."""
        return make_error(self[1], "save %r" % self[0])

    def __repr__(self):
        return "SaveFailure(%r, %s)" % (self[0], _name(self[1]))


def _name(code):
    from .errors import err_name

    return err_name(code)


def _config_json(config, kwargs):
    if isinstance(config, (dict, type(None))):
        merged = dict(config or {})
        merged.update(kwargs)
        return json.dumps(merged)
    if kwargs:
        raise make_error(codes.EINVAL, "keyword overrides need a dict config")
    if isinstance(config, str) and config.lstrip().startswith("{"):
        return config
    with open(os.fspath(config)) as f:
        return f.read()


class ECConnector:
    """One C ec_connector (``ecs_ec_open_json``).  Context manager."""

    def __init__(self, config=None, **kwargs):
        lib = _lib.lib()
        if not _lib.has_connector():
            raise make_error(codes.ENOTSUP, "%s has no ec_connector (ecs_ec_open_json missing): rebuild it"
                             % _lib.lib_path())
        self._lib = lib
        self._cv = threading.Condition()
        self._inflight = 0
        self._closed = False
        self._loads = weakref.WeakSet()
        ptr = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        rc = lib.ecs_ec_open_json(_config_json(config, kwargs).encode(), ctypes.byref(ptr), err, len(err))
        check(rc, err.value.decode(errors="replace"))
        self._ptr = ptr.value

    # ---- plumbing ----------------------------------------------------------

    def _enter(self):
        with self._cv:
            if self._closed:
                raise make_error(codes.ENOTCONN, "connector is closed")
            self._inflight += 1
        return self._ptr

    def _leave(self):
        with self._cv:
            self._inflight -= 1
            if self._inflight == 0:
                self._cv.notify_all()

    def _run(self, fn, *args):
        ptr = self._enter()
        try:
            return fn(ptr, *args)
        finally:
            self._leave()

    def close(self):
        """Releases open loads, waits for calls in flight, then
        ecs_ec_close (which waits up to timeout_ms for queued saves; collect
        their failures with wait_for_save first).  Idempotent."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            while self._inflight:
                self._cv.wait()
        for ld in list(self._loads):
            ld.release()
        self._lib.ecs_ec_close(self._ptr)
        self._ptr = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        if getattr(self, "_ptr", None):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - at interpreter exit; nothing to report to
                pass

    def describe(self):
        """The backend in use and its path, as ecs_ec_describe says."""
        return self._run(self._lib.ecs_ec_describe).decode()

    def stats(self):
        """The connector's counters as a dict."""
        st = _lib.EcStats()
        self._run(self._lib.ecs_ec_stats, ctypes.byref(st))
        return {name: getattr(st, name) for name, _ in _lib.EcStats._fields_}

    # ---- producer ------------------------------------------------------------

    def save(self, mm_hash, tensor, dtype=None):
        """Queues an asynchronous put of a numpy array / torch CPU tensor
        (dtype and shape kept).  The bytes are copied into pinned staging
        memory before this returns.  Raises BusyError when no room came
        within save_timeout_ms, NoSpaceError (ETOOBIG) for a tensor larger
        than the staging pool, InvalidArgumentError for a bad key/dtype;
        when it raises, nothing was queued."""
        ptr, nbytes, code, shape = _t.describe(tensor, dtype)
        t = _lib.Tensor()
        t.data = ptr or ctypes.addressof(t)
        t.nbytes = nbytes
        t.desc.dtype = code
        t.desc.ndim = len(shape)
        for d, v in enumerate(shape):
            t.desc.shape[d] = v
        rc = self._run(self._lib.ecs_ec_save, _key(mm_hash), ctypes.byref(t))
        check(rc, "save %r" % (mm_hash,))

    def save_caches(self, encoder_cache, mm_hash, **kwargs):
        """vLLM's producer call: saves encoder_cache[mm_hash]."""
        self.save(mm_hash, encoder_cache[mm_hash])

    def wait_for_save(self, timeout_ms=-1):
        """Blocks (a condition variable in C) until no save is queued or in
        flight.  Returns the saves that failed since the last call, as
        SaveFailure(mm_hash, code) ([] when all were stored): none is
        dropped.  Raises DeadlineExceededError when saves are still pending
        after timeout_ms (< 0: the config's timeout_ms; 0: don't wait); the
        failures collected so far are in the exception's ``statuses``."""
        failures = []
        cap = 64
        arr = (_lib.EcSaveResult * cap)()
        nf = ctypes.c_size_t(0)
        while True:
            rc = self._run(self._lib.ecs_ec_wait_for_save, timeout_ms, arr, cap, ctypes.byref(nf))
            failures += [SaveFailure(arr[i].mm_hash.decode(errors="replace"), arr[i].status) for i in range(nf.value)]
            if nf.value < cap or rc == codes.ETIMEDOUT:
                break
            timeout_ms = 0  # more failures than fitted: collect the rest now
        if rc == codes.ETIMEDOUT:
            raise make_error(rc, "%d saves still pending" % self.save_pending(), failures)
        if rc not in (codes.OK, codes.EIO):
            check(rc, "wait_for_save", failures)
        return failures

    def save_pending(self):
        """Saves queued or in flight now."""
        return self._run(self._lib.ecs_ec_save_pending)

    # ---- scheduler -----------------------------------------------------------

    def has_caches(self, mm_hashes):
        """[bool] per mm_hash (Redis only with the ecstore backend).  An
        error raises; it is never "exists"."""
        n = len(mm_hashes)
        if n == 0:
            return []
        keep = [_key(h) for h in mm_hashes]
        arr = (ctypes.c_char_p * n)(*keep)
        out = (ctypes.c_int * n)()
        rc = self._run(self._lib.ecs_ec_has, arr, n, out)
        check(rc, "has_caches")
        return [bool(v) for v in out]

    def has_cache_item(self, mm_hash):
        """has_caches of one mm_hash."""
        return self.has_caches([mm_hash])[0]

    # ---- consumer -------------------------------------------------------------

    def start_load_caches(self, items, expected_nbytes=None):
        """Queues a load and returns a LoadHandle at once.  items: a dict
        {mm_hash: out} or a list of (mm_hash, out), where out is a
        preallocated numpy array / torch CPU tensor (contiguous, of the dtype
        a get returns, at least the object's size).  expected_nbytes: None,
        or one int per item (0: any size that fits) making a size mismatch
        a miss (EDTYPE).  The connector writes into the outs until the load
        completes or is released; the handle keeps them alive until then."""
        pairs = list(items.items()) if isinstance(items, dict) else list(items)
        n = len(pairs)
        if n == 0:
            raise make_error(codes.EINVAL, "start_load_caches: no items")
        if expected_nbytes is not None and len(expected_nbytes) != n:
            raise make_error(codes.EINVAL, "expected_nbytes: %d values for %d items" % (len(expected_nbytes), n))
        arr = (_lib.EcLoadItem * n)()
        for i, (h, out) in enumerate(pairs):
            ptr, cap = _t.describe_out(out)
            arr[i].mm_hash = _key(h)
            arr[i].dst = ptr
            arr[i].capacity = cap
            arr[i].expected_nbytes = expected_nbytes[i] if expected_nbytes is not None else 0
        ld = ctypes.c_void_p()
        rc = self._run(self._lib.ecs_ec_start_load, arr, n, ctypes.byref(ld))
        check(rc, "start_load_caches")
        handle = LoadHandle(self, ld.value, pairs)
        self._loads.add(handle)
        return handle

    def load_caches(self, items, timeout_ms=-1, expected_nbytes=None):
        """start_load_caches + wait + release: tensors (views of the outs)
        or None per item."""
        with self.start_load_caches(items, expected_nbytes) as ld:
            return ld.wait(timeout_ms)


def _key(h):
    b = h.encode() if isinstance(h, str) else bytes(h)
    if b"\0" in b:
        raise make_error(codes.EKEY, "mm_hash contains a NUL byte")
    return b


class LoadHandle:
    """A load in progress.  ``statuses`` holds the per-item codes of the
    last wait/poll (ECS_OK: hit; anything else: a miss the engine
    recomputes; EBUSY: still pending).  Context manager: releases on exit.
    wait() and poll() are for one thread at a time (as in C)."""

    def __init__(self, conn, ptr, pairs):
        self._conn = conn
        self._ptr = ptr
        self._lock = threading.Lock()
        self._release = conn._lib.ecs_ec_load_release  # bound now: usable at interpreter exit
        self._pairs = pairs  # keeps the destination buffers alive
        self._res = (_lib.EcLoadResult * len(pairs))()
        self.statuses = [codes.EBUSY] * len(pairs)
        self.mm_hashes = [h for h, _ in pairs]
        # (dtype code, shape) as stored, per item, when the last wait/poll
        # learned it (a hit, or a miss by size: EBUFSMALL, EDTYPE); else None.
        self.descs = [None] * len(pairs)

    def __len__(self):
        return len(self._pairs)

    def _results(self):
        out = []
        for i, r in enumerate(self._res):
            st = r.status
            t = None
            if st in (0, codes.EBUFSMALL, codes.EDTYPE):
                self.descs[i] = (r.desc.dtype, tuple(r.desc.shape[: r.desc.ndim]))
            if st == 0:
                try:
                    t = _t.view_out(self._pairs[i][1], r.desc.dtype, r.desc.shape[: r.desc.ndim])
                except Exception as e:
                    st = getattr(e, "code", codes.EDTYPE)
            self.statuses[i] = st
            out.append(t)
        return out

    def wait(self, timeout_ms=-1):
        """Blocks until every item is done; returns, per item, a view of its
        out with the stored dtype and shape, or None for a miss (see
        ``statuses`` for why).  Raises DeadlineExceededError when items are
        still pending after timeout_ms (< 0: config timeout_ms); wait again
        or release()."""
        if not self._ptr:
            raise make_error(codes.EINVAL, "load already released")
        rc = self._conn._run(lambda _c: self._conn._lib.ecs_ec_wait_for_load(self._ptr, timeout_ms, self._res))
        out = self._results()
        check(rc, "wait_for_load", list(self.statuses))
        return out

    def poll(self):
        """True when every item is done (then wait(0) returns the results)."""
        if not self._ptr:
            raise make_error(codes.EINVAL, "load already released")
        rc = self._conn._run(lambda _c: self._conn._lib.ecs_ec_poll_load(self._ptr, self._res))
        self._results()
        if rc not in (codes.OK, codes.EBUSY):
            check(rc, "poll_load")
        return rc == codes.OK

    def release(self):
        """Cancels items not started, waits for the one in flight, frees the
        handle; after it the connector never touches the outs again.
        Idempotent, and safe against the connector's close() on another
        thread (which releases open loads first)."""
        with self._lock:
            if self._ptr:
                self._release(self._ptr)
                self._ptr = None
                self._pairs = [(h, None) for h, _ in self._pairs]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def __del__(self):
        self.release()
