"""The ecstore store client, with the method names of the Mooncake Store.

>>> import ecstore
>>> with ecstore.connect(servers="127.0.0.1:7700", redis_url="redis://127.0.0.1:6379",
...                      namespace="qwen2.5-vl-7b") as store:
...     store.put_tensor("mm-hash", emb)            # numpy or torch CPU, any ecstore dtype
...     emb2 = store.get_tensor("mm-hash")          # same dtype and shape, or None

Results.  Batch calls return one int per item, as the Mooncake Store does:
``batch_put_from``: 0 or a negative ECS code; ``batch_get_into``: the bytes
read or a negative code (e.g. ``ecstore.ENOTFOUND`` = -5 for a miss);
``batch_is_exist``: 1 or 0.  A failure of the whole call (a server or
Redis unreachable, a deadline) is not folded into those ints as Mooncake
folds it into -1: it raises the matching :class:`~ecstore.EcstoreError`
subclass, whose message carries the C library's text, and whose
``statuses`` holds the per-item results the call still produced (items
placed on other servers may have succeeded).  Single-item tensor calls
raise on every error except a miss of ``get_tensor`` (None).

Threads.  A libecstore handle must not be used by two threads at once.
This client keeps one C handle per thread (``threading.local``), opened on
a thread's first call with the same configuration, so threads run their
I/O in parallel: ctypes releases the GIL during every C call.  A thread's
handle closes when the thread ends; :meth:`Store.close` closes all of them
(waiting for a call in flight on another thread to return, which its
deadline bounds).  Each handle also has a lock, so that close() never frees
a handle under a running call.
"""

import ctypes
import json
import struct as _struct
import os
import threading
import warnings
import weakref

from . import _lib
from . import codes
from . import tensors as _t
from .errors import EcstoreError, check, make_error

# Python config key -> (C field, kind).  Aliases share the C field.
_CONFIG = {
    "servers": ("servers", "servers"),
    "redis_url": ("redis_url", "str"),
    "namespace": ("ns", "str"),
    "ns": ("ns", "str"),
    "auth_token": ("auth_token", "str"),
    "connect_timeout_ms": ("connect_timeout_ms", "int"),
    "timeout_ms": ("timeout_ms", "int"),
    "verify_checksum": ("verify_checksum", "bool"),
    "transport": ("transport", "str"),
    "protocol": ("transport", "str"),
    "rdma_device": ("rdma_device", "str"),
    "device": ("rdma_device", "str"),
    "rdma_port": ("rdma_port", "int"),
    "rdma_gid_index": ("rdma_gid_index", "int"),
    "compression": ("compression", "str"),
    "shm_read_only": ("shm_read_only", "bool"),
    "max_object_size": ("max_object_size", "int"),
    "shm_server_uid": ("shm_server_uid", "int"),
    "placement": ("placement", "str"),
    "registry_refresh_ms": ("registry_refresh_ms", "int"),
    "replicas": ("replicas", "int"),
}


def _key(k):
    if isinstance(k, str):
        return k.encode()
    if isinstance(k, (bytes, bytearray, memoryview)):
        return bytes(k)
    raise TypeError("a key is str or bytes, not %s" % type(k).__name__)


def _keys(keys):
    """An ecs_key_t array for keys.  One bytearray holds the structs and,
    after them, every key's bytes (each NUL-terminated, as a c_char_p may
    be read); the array keeps it alive (from_buffer).  Setting the fields
    one struct at a time cost ~2 us a key (a vLLM load step's 32 keys:
    ~60 us)."""
    bs = [k.encode() if type(k) is str else _key(k) for k in keys]
    n = len(bs)
    head = n * _KEY_SIZE
    buf = bytearray(head)
    buf += b"\0".join(bs)
    buf += b"\0"
    arr = (_lib.Key * n).from_buffer(buf) if n else (_lib.Key * 0)()
    if n:
        base = ctypes.addressof(arr) + head
        flat = []
        for b in bs:
            flat.append(base)
            flat.append(len(b))
            base += len(b) + 1
        fmt = _KEYS_FMT.get(n)
        if fmt is None:
            fmt = _struct.Struct("@" + "PN" * n)
            if n <= 1024:  # the batch sizes met, kept
                _KEYS_FMT[n] = fmt
        fmt.pack_into(buf, 0, *flat)
    return arr


_KEY_SIZE = ctypes.sizeof(_lib.Key)
assert _struct.calcsize("@PN") == _KEY_SIZE, "ecs_key_t is not {pointer, size_t}"
_KEYS_FMT = {}  # n -> struct.Struct of n ecs_key_t


def _check_lengths(what, *seqs):
    n = len(seqs[0])
    for s in seqs[1:]:
        if len(s) != n:
            raise make_error(codes.EINVAL, "%s: %d keys but %d pointers/sizes" % (what, n, len(s)))
    return n


def _load_config(config, kwargs):
    if isinstance(config, (str, os.PathLike)):
        with open(config) as f:
            config = json.load(f)
    merged = dict(config or {})
    merged.update(kwargs)
    out = {}
    for k, v in merged.items():
        if k not in _CONFIG:
            raise make_error(codes.EINVAL, "unknown config key %r (known: %s)" % (k, ", ".join(sorted(_CONFIG))))
        field, kind = _CONFIG[k]
        if field in out:
            raise make_error(codes.EINVAL, "config key %r given twice (under an alias)" % k)
        if v is None:
            out[field] = None
        elif kind == "servers":
            out[field] = ",".join(v) if isinstance(v, (list, tuple)) else str(v)
        elif kind == "int":
            if isinstance(v, bool) or not isinstance(v, int):
                raise make_error(codes.EINVAL, "config key %r wants an integer, got %r" % (k, v))
            out[field] = v
        elif kind == "bool":
            out[field] = 1 if v else 0
        else:
            out[field] = str(v)
    return out


class _Handle:
    """One C client handle, used by one thread; the lock lets close() from
    another thread wait for a call in flight."""

    __slots__ = ("ptr", "lock", "_close", "__weakref__")

    def __init__(self, ptr):
        self.ptr = ptr
        self.lock = threading.Lock()
        # Bound now: at interpreter exit module globals may be gone.
        self._close = _lib.lib().ecs_client_close

    def close(self):
        with self.lock:
            if self.ptr:
                self._close(self.ptr)
                self.ptr = None

    def __del__(self):  # the owning thread ended, or the store was dropped
        if self.ptr:
            self._close(self.ptr)
            self.ptr = None


class Store:
    """An ecstore client.  ``Store(config)`` connects at once; ``Store()``
    waits for :meth:`setup`.  Also a context manager that closes on exit."""

    def __init__(self, config=None, **kwargs):
        self._lib = _lib.lib()
        self._tls = threading.local()
        self._handles = weakref.WeakSet()
        self._lock = threading.Lock()
        self._cfg_mem = None  # keeps the C config and its strings alive
        self._cfg = None
        self._closed = False
        self._buffers = {}  # register_buffer: start address -> size
        if config is not None or kwargs:
            self.setup(config, **kwargs)

    # ---- life cycle --------------------------------------------------

    def setup(self, config=None, **kwargs):
        """Connects with config, a dict, a path to a JSON file of one, or
        keyword arguments (which override the dict):

        ``servers`` ("H:P,H:P" or a list), ``redis_url``, ``namespace``
        (alias ``ns``), ``auth_token``, ``connect_timeout_ms``,
        ``timeout_ms``, ``verify_checksum``, ``transport`` (alias
        ``protocol``: auto, tcp, shm, rdma), ``rdma_device`` (alias
        ``device``), ``rdma_port``, ``rdma_gid_index``, ``compression``,
        ``shm_read_only``, ``max_object_size``,
        ``shm_server_uid``, ``placement`` (hash, local, least-loaded),
        ``registry_refresh_ms`` and ``replicas`` (copies of each put on
        distinct servers; discovery only).  Without ``servers`` but with
        ``redis_url``, the servers come from Redis's registry
        (docs/multihost.md).
        Unknown keys are an error.  Unlike Mooncake's positional setup(),
        only these names are taken.  Connects this thread's handle now,
        so a wrong address or token raises here (with the C library's
        reason); returns 0."""
        if self._cfg is not None:
            raise make_error(codes.EINVAL, "store already set up; close() it and make a new one")
        fields = _load_config(config, kwargs)
        # Room to spare past the struct: a header that grew without this
        # binding must not let ecs_client_config_init write past our memory
        # (tests/python/test_abi.py catches the mismatch itself).
        mem = ctypes.create_string_buffer(ctypes.sizeof(_lib.ClientConfig) + 512)
        cfg = _lib.ClientConfig.from_buffer(mem)
        self._lib.ecs_client_config_init(ctypes.byref(cfg))
        for field, value in fields.items():
            if isinstance(value, str):
                value = value.encode()
            setattr(cfg, field, value)  # c_char_p fields keep their bytes alive in cfg
        self._cfg_mem, self._cfg = mem, cfg
        try:
            self._handle()
        except BaseException:
            self._cfg_mem = self._cfg = None
            raise
        return 0

    def _connect_one(self):
        ptr = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        rc = self._lib.ecs_client_connect(ctypes.byref(self._cfg), ctypes.byref(ptr), err, len(err))
        check(rc, err.value.decode(errors="replace"))
        return _Handle(ptr.value)

    def _handle(self):
        h = getattr(self._tls, "h", None)
        if h is None:
            if self._cfg is None:
                raise make_error(codes.ENOTCONN, "store not set up: call setup() or ecstore.connect()")
            with self._lock:
                if self._closed:
                    raise make_error(codes.ENOTCONN, "store is closed")
            h = self._connect_one()
            with self._lock:
                if self._closed:  # close() ran while we connected
                    h.close()
                    raise make_error(codes.ENOTCONN, "store is closed")
                self._handles.add(h)
                regions = list(self._buffers.items())
            for p, n in regions:  # a new handle registers what the store holds
                self._register_on(h, p, n)
            self._tls.h = h
        return h

    def _call(self, fn, *args):
        """fn(handle, *args) on this thread's handle; returns (rc, detail)."""
        h = self._handle()
        with h.lock:
            if not h.ptr:
                raise make_error(codes.ENOTCONN, "store is closed")
            rc = fn(h.ptr, *args)
            detail = self._lib.ecs_client_errmsg(h.ptr).decode(errors="replace") if rc else ""
        return rc, detail

    def close(self):
        """Closes every thread's handle; later calls raise
        ConnectionFailedError (ENOTCONN).  Idempotent."""
        with self._lock:
            self._closed = True
            handles = list(self._handles)
        for h in handles:
            h.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def closed(self):
        return self._closed

    # ---- Mooncake-style raw calls ------------------------------------

    def batch_put_from(self, keys, ptrs, sizes, upsert=False):
        """Stores sizes[i] bytes at address ptrs[i] under keys[i] (as a 1-D
        u8 tensor).  Returns one status per item: 0, or a negative code
        (ECONFLICT: the key holds other bytes; ENOSPC/ETOOBIG; EKEY;
        EREDIS: stored, but Redis did not acknowledge its record in time,
        so exists says 0 until the server re-publishes it).  A
        whole-call failure raises, with the statuses in ``e.statuses``.
        upsert=True replaces what a key holds instead of ECONFLICT
        (ecs_upsert_batch; EBUSY while another request writes the key)."""
        n = _check_lengths("batch_put_from", keys, ptrs, sizes)
        if n == 0:
            return []
        karr = _keys(keys)
        tarr = (_lib.Tensor * n)()
        for i in range(n):
            t = tarr[i]
            t.data = ptrs[i]
            t.nbytes = sizes[i]
            t.desc.dtype = _lib.DTYPE_U8
            t.desc.ndim = 1
            t.desc.shape[0] = sizes[i]
        return self._put(karr, tarr, n, upsert)

    def _put(self, karr, tarr, n, upsert=False):
        st = (ctypes.c_int * n)()
        fn = self._lib.ecs_put_batch
        if upsert:
            fn = getattr(self._lib, "ecs_upsert_batch", None)
            if fn is None:
                raise make_error(codes.ENOTSUP, "this libecstore has no ecs_upsert_batch")
        rc, detail = self._call(fn, karr, tarr, n, st)
        out = list(st)
        check(rc, detail, out)
        return out

    def put_from(self, key, ptr, size):
        """batch_put_from of one item: returns its status."""
        return self.batch_put_from([key], [ptr], [size])[0]

    def batch_get_into(self, keys, ptrs, sizes):
        """Reads each object straight into the caller's buffer at ptrs[i]
        (capacity sizes[i]; one round trip per server).  Returns one int per
        item: the bytes written, or a negative code (ENOTFOUND -5: a miss;
        EBUFSMALL -11: the buffer is smaller than the object, nothing was
        written; ECHECKSUM).  A whole-call failure raises, with the
        per-item results in ``e.statuses``."""
        n = _check_lengths("batch_get_into", keys, ptrs, sizes)
        if n == 0:
            return []
        karr = _keys(keys)
        bufs = (_lib.GetBuf * n)()
        for i in range(n):
            bufs[i].data = ptrs[i]
            bufs[i].capacity = sizes[i]
        rc, detail = self._call(self._lib.ecs_get_batch, karr, bufs, n)
        out = [b.nbytes if b.status == 0 else b.status for b in bufs]
        check(rc, detail, out)
        return out

    def get_into(self, key, ptr, size):
        """batch_get_into of one item: returns its byte count or code."""
        return self.batch_get_into([key], [ptr], [size])[0]

    def batch_is_exist(self, keys):
        """1 or 0 per key.  With a redis_url configured this asks Redis only
        (the scheduler's call), else the servers.  An error raises: it is
        never reported as "exists" (nor as Mooncake's -1)."""
        n = len(keys)
        if n == 0:
            return []
        karr = _keys(keys)
        ex = (ctypes.c_int * n)()
        rc, detail = self._call(self._lib.ecs_exists_batch, karr, n, ex)
        check(rc, detail)
        return list(ex)

    def is_exist(self, key):
        """batch_is_exist of one key: 1 or 0."""
        return self.batch_is_exist([key])[0]

    def batch_remove(self, keys):
        """Removes objects: 0 or ENOTFOUND (-5) per key."""
        n = len(keys)
        if n == 0:
            return []
        karr = _keys(keys)
        st = (ctypes.c_int * n)()
        rc, detail = self._call(self._lib.ecs_remove_batch, karr, n, st)
        out = list(st)
        check(rc, detail, out)
        return out

    def remove(self, key):
        """Removes one object: 0, or ENOTFOUND (-5) when there was none."""
        return self.batch_remove([key])[0]

    # ---- buffer registration ------------------------------------------

    def register_buffer(self, ptr, size):
        """Registers [ptr, ptr+size) for RDMA transfers, as Mooncake Store's
        register_buffer does: batch_get_into and batch_put_from on memory
        inside a registered region go straight to and from the NIC, while
        unregistered memory is registered for each call (slow).  Without an
        RDMA transport the C library only records the region.

        Every thread's C handle registers it (handles opened later register
        it when they open).  Registering the same region again is a no-op (a
        retry is safe).  Returns 0; raises InvalidArgumentError on a bad or
        overlapping region, or the C error when registration fails."""
        if not isinstance(ptr, int) or not isinstance(size, int):
            raise TypeError("register_buffer(ptr, size) takes two ints")
        if ptr <= 0 or size <= 0 or ptr + size > 1 << 64:
            raise make_error(codes.EINVAL, "bad region: ptr=%#x size=%d" % (ptr, size))
        with self._lock:
            if self._buffers.get(ptr) == size:
                return 0
            for p, s in self._buffers.items():
                if ptr < p + s and p < ptr + size:
                    raise make_error(codes.EINVAL, "region %#x+%d overlaps registered region %#x+%d"
                                     % (ptr, size, p, s))
            self._buffers[ptr] = size
            handles = list(self._handles)
        done = []
        try:
            for h in handles:
                self._register_on(h, ptr, size)
                done.append(h)
        except BaseException:
            with self._lock:
                self._buffers.pop(ptr, None)
            for h in done:
                self._unregister_on(h, ptr)
            raise
        return 0

    def unregister_buffer(self, ptr):
        """Undoes register_buffer (by the region's start address) on every
        thread's handle.  Returns 0; raises NotFoundError when none starts
        there."""
        with self._lock:
            if self._buffers.pop(ptr, None) is None:
                raise make_error(codes.ENOTFOUND, "no registered buffer starts at %#x" % ptr)
            handles = list(self._handles)
        for h in handles:
            self._unregister_on(h, ptr)
        return 0

    def _register_on(self, h, ptr, size):
        fn = getattr(self._lib, "ecs_register_buffer", None)
        if fn is None:  # a library older than the call: recording is all there is
            return
        with h.lock:
            if not h.ptr:
                return
            rc = fn(h.ptr, ptr, size)
            detail = self._lib.ecs_client_errmsg(h.ptr).decode(errors="replace") if rc else ""
        if rc and rc != codes.EBUSY:
            check(rc, detail or "register_buffer")

    def _unregister_on(self, h, ptr):
        fn = getattr(self._lib, "ecs_unregister_buffer", None)
        if fn is None:
            return
        with h.lock:
            if h.ptr:
                fn(h.ptr, ptr)

    def registered_buffers(self):
        """{start address: size} of the recorded regions."""
        with self._lock:
            return dict(self._buffers)

    # ---- tensors -------------------------------------------------------

    def batch_put_tensors(self, keys, tensors, dtypes=None, upsert=False):
        """Stores numpy arrays / torch CPU tensors (contiguous) with their
        dtype and shape, straight from their memory.  dtypes (optional, one
        per item, None for "as is") relabels same-size elements, e.g. "bf16"
        for a numpy uint16 array of bf16 bits.  Returns one status per item
        (0, ECONFLICT, ENOSPC, ...).  An item that cannot be described (wrong
        dtype, not contiguous) raises before anything is sent."""
        n = _check_lengths("batch_put_tensors", keys, tensors)
        if dtypes is not None:
            _check_lengths("batch_put_tensors", keys, dtypes)
        if n == 0:
            return []
        karr = _keys(keys)
        tarr = (_lib.Tensor * n)()
        for i, obj in enumerate(tensors):
            ptr, nbytes, code, shape = _t.describe(obj, dtypes[i] if dtypes is not None else None)
            t = tarr[i]
            # A zero-size tensor may have no data pointer; the library wants one.
            t.data = ptr or ctypes.addressof(t)
            t.nbytes = nbytes
            t.desc.dtype = code
            t.desc.ndim = len(shape)
            for d, v in enumerate(shape):
                t.desc.shape[d] = v
        # tensors (the caller's list) keeps every array alive during the call.
        return self._put(karr, tarr, n, upsert)

    def put_tensor(self, key, tensor, dtype=None, upsert=False):
        """Stores one tensor; raises on any error (ConflictError, ...).
        upsert=True replaces what the key holds.  EREDIS is not an error
        here: the server stored the tensor but Redis did not acknowledge
        its record in time (slow or down); gets find it, and the server
        publishes the record when Redis answers (a warning is issued)."""
        st = self.batch_put_tensors([key], [tensor], None if dtype is None else [dtype], upsert)[0]
        if st == codes.EREDIS:
            warnings.warn("ecstore: %r stored, but its Redis record is not published yet "
                          "(Redis slow or down; the server re-publishes it)" % (key,), RuntimeWarning,
                          stacklevel=2)
            return
        check(st, "put %r" % (key,))

    def batch_get_tensors(self, keys, outs=None, framework="torch", pin_memory=False, with_status=False,
                          alloc=None):
        """Fetches tensors with their stored dtype and shape.  Returns a list
        with, per key, the tensor or None (a miss or an item error); with
        with_status=True, returns (tensors, statuses).

        Round trips, per server holding some of the keys:
        - outs given (one numpy array / torch tensor per key, contiguous,
          at least the object's size, of the dtype a get returns, see
          ecstore.tensors): 1 round trip, bytes land in outs[i]; the result
          is a view of outs[i] with the stored shape.  Too small: EBUFSMALL.
        - no outs: 1 round trip; libecstore allocates each object's buffer
          as the sizes arrive and the result wraps it without a copy (freed
          when the array/tensor is garbage collected).
        - pin_memory=True (torch, needs CUDA): 2 round trips: one to learn
          each object's dtype and shape (no bytes sent), then a read straight
          into torch.empty(..., pin_memory=True).
        - alloc (no outs): 2 round trips as with pin_memory, the second into
          alloc(dtype code, shape), an uninitialised tensor/array of that
          dtype and shape in memory of the caller's choosing (a pool), or
          None to skip the item (its status: ENOSPC).
        framework: "torch" (default) or "numpy", for results allocated here."""
        results, statuses, _ = self._batch_get(keys, outs, framework, pin_memory, alloc)
        return (results, statuses) if with_status else results

    def _batch_get(self, keys, outs, framework, pin_memory, alloc=None):
        """(results, statuses, details): details[i] says why an item whose
        out did not fit the stored dtype failed ("" otherwise)."""
        _t.check_framework(framework)
        n = len(keys)
        if n == 0:
            return [], [], []
        karr = _keys(keys)
        bufs = (_lib.GetBuf * n)()
        if outs is not None:
            _check_lengths("batch_get_tensors", keys, outs)
            return self._get_into_outs(karr, bufs, n, outs)
        if pin_memory or alloc is not None:
            if alloc is None:
                def alloc(code, shape):
                    return _t.alloc(framework, code, shape, pin_memory=True)
            return self._get_learnt(keys, karr, bufs, n, alloc)
        return self._get_alloc(karr, bufs, n, framework)

    def _get_into_outs(self, karr, bufs, n, outs):
        for i, o in enumerate(outs):
            bufs[i].data, bufs[i].capacity = _t.describe_out(o)
        rc, detail = self._call(self._lib.ecs_get_batch, karr, bufs, n)
        statuses = [b.status for b in bufs]
        check(rc, detail, statuses)
        results = [None] * n
        details = [""] * n
        for i, b in enumerate(bufs):
            if b.status == 0:
                try:
                    results[i] = _t.view_out(outs[i], b.desc.dtype, b.desc.shape[: b.desc.ndim])
                except EcstoreError as e:  # dtype of out differs from the stored one
                    statuses[i], details[i] = e.code, e.detail
        return results, statuses, details

    def _get_alloc(self, karr, bufs, n, framework):
        rc, detail = self._call(self._lib.ecs_get_batch_alloc, karr, bufs, n)
        statuses = [b.status for b in bufs]
        results = [None] * n
        # Take ownership of every block first, so that nothing leaks if a
        # wrap or the raise below fails.
        owned = [(i, b.data) for i, b in enumerate(bufs) if b.status == 0 and b.data]
        for i, ptr in owned:
            b = bufs[i]
            results[i] = _t.wrap_c_buffer(ptr, b.desc.dtype, b.desc.shape[: b.desc.ndim], framework)
        check(rc, detail, statuses)
        return results, statuses, [""] * n

    def _get_learnt(self, keys, karr, bufs, n, alloc):
        # Round trip 1: capacity 0 gives EBUFSMALL with dtype and shape.
        rc, detail = self._call(self._lib.ecs_get_batch, karr, bufs, n)
        check(rc, detail, [b.status for b in bufs])
        results = [None] * n
        statuses = [b.status for b in bufs]
        for i, b in enumerate(bufs):
            if b.status in (0, codes.EBUFSMALL):
                results[i] = alloc(b.desc.dtype, tuple(b.desc.shape[: b.desc.ndim]))
                if results[i] is None:
                    statuses[i] = codes.ENOSPC  # alloc said no
        # Round trip 2: into the tensors alloc gave (an object replaced in
        # between with a larger one is EBUFSMALL: a miss, never wrong bytes).
        todo = [i for i in range(n) if results[i] is not None]
        details = [""] * n
        if not todo:
            return results, statuses, details
        m = len(todo)
        got, st2, d2 = self._get_into_outs(_keys([keys[i] for i in todo]), (_lib.GetBuf * m)(), m,
                                       [results[i] for i in todo])
        for j, i in enumerate(todo):
            results[i], statuses[i], details[i] = got[j], st2[j], d2[j]
        return results, statuses, details

    def get_tensor(self, key, out=None, framework="torch", pin_memory=False):
        """One tensor with its stored dtype and shape, or None when the key
        is not stored.  Other errors raise.  out / framework / pin_memory
        and the round trips: as batch_get_tensors."""
        res, st, details = self._batch_get([key], None if out is None else [out], framework, pin_memory)
        if st[0] == codes.ENOTFOUND:
            return None
        check(st[0], details[0] or "get %r" % (key,))
        return res[0]

    # ---- servers ---------------------------------------------------------

    def ping(self):
        """A round trip to every server; raises when one fails."""
        rc, detail = self._call(self._lib.ecs_ping)
        check(rc, detail)

    def transport(self):
        """The data path this thread's handle uses now ("tcp", "shm" or
        "mixed"), or None when the library predates ecs_client_transport."""
        fn = getattr(self._lib, "ecs_client_transport", None)
        if fn is None:
            return None
        return self._call(fn)[0].decode()

    def put_copies(self):
        """(stored, wanted): the copies this thread's last put stored and
        the copies it asked for (items x ``replicas``); stored < wanted
        means some items have fewer copies than asked (docs/multihost.md)."""
        fn = getattr(self._lib, "ecs_client_put_copies", None)
        if fn is None:
            raise make_error(codes.ENOTSUP, "this libecstore has no ecs_client_put_copies")
        stored, wanted = _lib._S(), _lib._S()
        self._call(fn, ctypes.byref(stored), ctypes.byref(wanted))
        return stored.value, wanted.value

    # ---- zero-copy views (shm) -----------------------------------------

    def get_views(self, keys):
        """Pins each object in its server's shared pool and returns a
        :class:`Views` of them (no byte moves; ecs_get_view_batch).  Per
        item: ``statuses[i]`` (0, ENOTFOUND, ENOTSUP when the server is not
        reached over shm, ECHECKSUM, ...) and, for 0, ``tensor(i)``, a
        read-only-by-contract torch uint8 tensor over the pool's bytes.
        The pins belong to this thread's connection: release them on this
        thread (``Views.release``).  A server drops a pin held longer than
        its --lease-timeout-ms (default 30 s)."""
        if getattr(self._lib, "ecs_get_view_batch", None) is None:
            raise make_error(codes.ENOTSUP, "%s has no ecs_get_view_batch" % _lib.lib_path())
        n = len(keys)
        views = (_lib.View * max(n, 1))()
        if n == 0:
            return Views(self, None, views, 0)
        karr = _keys(keys)
        h = self._handle()
        with h.lock:
            if not h.ptr:
                raise make_error(codes.ENOTCONN, "store is closed")
            rc = self._lib.ecs_get_view_batch(h.ptr, karr, views, n)
            detail = self._lib.ecs_client_errmsg(h.ptr).decode(errors="replace") if rc else ""
        out = Views(self, h, views, n)
        if rc:
            out.release()
            check(rc, detail, out.statuses)
        return out

    # ---- where objects are, and server-to-server pulls ---------------------

    def locate(self, keys):
        """Each object's holder (ecs_locate_batch): a list of
        ``(status, addr, node_id, local)``; with discovery from Redis, the
        nearest live holder (one on this host first).  Redis failing raises."""
        if getattr(self._lib, "ecs_locate_batch", None) is None:
            raise make_error(codes.ENOTSUP, "%s has no ecs_locate_batch" % _lib.lib_path())
        n = len(keys)
        if n == 0:
            return []
        karr = _keys(keys)
        out = (_lib.Holder * n)()
        rc, detail = self._call(self._lib.ecs_locate_batch, karr, n, out)
        res = [(h.status, h.addr.decode(errors="replace"), h.node_id.decode(errors="replace"), bool(h.local))
               for h in out]
        check(rc, detail, [r[0] for r in res])
        return res

    def pull(self, keys, holders, server=0):
        """Asks server number ``server`` to fetch each key from its holder
        (``holders[i]``: "HOST:PORT" as locate gives it) into its own pool,
        server to server (ecs_pull_batch).  Returns a status per key (0:
        there now).  Raises EcstoreError ENOTSUP when that server cannot
        pull (no Redis there, or older than PULL: get and put instead)."""
        if getattr(self._lib, "ecs_pull_batch", None) is None:
            raise make_error(codes.ENOTSUP, "%s has no ecs_pull_batch" % _lib.lib_path())
        _check_lengths("pull", keys, holders)
        n = len(keys)
        if n == 0:
            return []
        karr = _keys(keys)
        hb = [h.encode() if isinstance(h, str) else bytes(h) for h in holders]
        harr = (ctypes.c_char_p * n)(*hb)
        st = (ctypes.c_int * n)()
        rc, detail = self._call(self._lib.ecs_pull_batch, server, karr, harr, n, st)
        out = list(st)
        check(rc, detail, out)
        return out

    def server_count(self):
        """The number of configured servers."""
        return self._call(self._lib.ecs_client_server_count)[0]

    def stat(self, server=0):
        """A server's counters as a dict (see docs/protocol.md, STAT);
        pool_cuda_registered is None from a server too old to say."""
        st = _lib.ServerStat()
        ex = _lib.ServerStatExt(pool_cuda_registered=_lib.STAT_UNKNOWN)
        if hasattr(self._lib, "ecs_stat_ext"):
            rc, detail = self._call(self._lib.ecs_stat_ext, server, ctypes.byref(st), ctypes.byref(ex))
        else:  # a library older than the counter
            rc, detail = self._call(self._lib.ecs_stat, server, ctypes.byref(st))
        check(rc, detail)
        out = {name: getattr(st, name) for name, _ in _lib.ServerStat._fields_}
        reg = ex.pool_cuda_registered
        out["pool_cuda_registered"] = None if reg == _lib.STAT_UNKNOWN else reg
        out["node_id"] = st.node_id.decode(errors="replace")
        out["address"] = st.address.decode(errors="replace")
        return out


class Views:
    """Pinned views from Store.get_views; release() (idempotent) unpins."""

    def __init__(self, store, handle, views, n):
        self._store = store
        self._h = handle
        self._v = views
        self.n = n
        self._parsed = None  # (statuses, descs, nbytes), read from the C structs when first asked

    # statuses, descs and nbytes are read from the C structs when first
    # asked: a caller that needs none of them (the vLLM worker's load, whose
    # tensors come from DLBox) pays nothing for them (~3 us an item).

    @property
    def statuses(self):
        return (self._parsed or self._parse())[0]

    @property
    def descs(self):
        return (self._parsed or self._parse())[1]

    @property
    def nbytes(self):
        return (self._parsed or self._parse())[2]

    def _parse(self):
        # One pass over the C structs (each index makes a ctypes object).
        st, ds, nb = [], [], []
        for v in self._v[: self.n]:
            s = v.status
            st.append(s)
            if s == 0:
                d = v.desc
                ds.append((d.dtype, tuple(d.shape[: d.ndim])))
                nb.append(v.nbytes)
            else:
                ds.append(None)
                nb.append(0)
        self._parsed = (st, ds, nb)
        return self._parsed

    def address(self, i):
        return self._v[i].data if self.statuses[i] == 0 else None

    def tensor(self, i):
        """Item i's bytes as a torch uint8 tensor over the pool (no copy);
        valid until release()."""
        if self.statuses[i] != 0:
            return None
        return _t.wrap_view(self._v[i].data, self._v[i].nbytes, self)

    def release(self):
        """Unpins every view (one-way, never blocks on the server)."""
        self.release_items(range(self.n))

    def release_items(self, idx):
        """Unpins the views idx (the others stay pinned); idempotent."""
        h = self._h
        idx = [i for i in idx if self.statuses[i] == 0]
        if h is None or not idx:
            return
        with h.lock:
            if h.ptr:
                if len(idx) == 1:
                    self._store._lib.ecs_view_release(h.ptr, ctypes.byref(self._v[idx[0]]), 1)
                else:
                    # One call (one RELEASE message per server) for them all:
                    # the C call takes an array, so hand it copies of the views.
                    arr = (_lib.View * len(idx))()
                    for j, i in enumerate(idx):
                        arr[j] = self._v[i]
                    self._store._lib.ecs_view_release(h.ptr, arr, len(idx))
                    for i in idx:  # released through the copies: no longer views
                        ctypes.memset(ctypes.byref(self._v[i]), 0, ctypes.sizeof(_lib.View))
                        self._v[i].status = codes.ENOTFOUND
        for i in idx:
            self.statuses[i] = codes.ENOTFOUND


def connect(config=None, **kwargs):
    """A connected :class:`Store` (see Store.setup for the config keys)."""
    return Store(config, **kwargs)
