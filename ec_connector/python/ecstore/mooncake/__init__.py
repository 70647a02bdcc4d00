"""Mooncake Store's Python API over ecstore: switch with one import.

    # from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    from ecstore.mooncake import MooncakeDistributedStore, ReplicateConfig

    store = MooncakeDistributedStore()
    store.setup("10.0.0.5", "redis://10.0.0.9:6379", 0, 0, "tcp", "", "10.0.0.5:7700")
    store.batch_put_from(keys, ptrs, sizes)        # [0, ...] or Mooncake error codes
    store.batch_get_into(keys, ptrs, sizes)        # [bytes read, ...] or codes (-704: a miss)

The class has the method names, argument names (positional and keyword),
return values and error-code values of ``mooncake.store`` as released in
mooncake-transfer-engine 0.3.13.post1 (the version the tests run against),
for everything that does not need Mooncake-only machinery.  Calls return 0,
byte counts, objects or Mooncake's negative ``ErrorCode`` values; they do
not raise for store errors (a wrong argument *type* raises TypeError, as
pybind11 does in Mooncake).  Each failure is logged on the
``ecstore.mooncake`` logger with the C library's detail, as Mooncake logs
through glog.

How ``setup`` maps onto ecstore, and every difference from Mooncake with its
reason, are in docs/mooncake.md.  In short: ``metadata_server`` is the Redis
URL (``P2PHANDSHAKE`` or "" for none), ``master_server_addr`` the ecstore
server list, ``protocol`` the transport (tcp, rdma; also ecstore's shm and
auto), ``tenant_id`` the namespace; the segment and buffer sizes have no
meaning here (the pool is the server's) and are accepted.
"""

import ctypes
import logging
import os
import random
import re
import socket

from .. import _lib
from .. import codes as _c
from ..errors import EcstoreError
from ..store import Store, _keys
from .._mooncake_place import Placement
from .._mooncake_tensor import TensorCalls
from .._mooncake_base import (  # noqa: F401 - the public names are re-exported
    BUFFER_OVERFLOW,
    INTERNAL_ERROR,
    INVALID_KEY,
    INVALID_PARAMS,
    INVALID_READ,
    INVALID_REPLICA,
    LEASE_EXPIRED,
    NO_AVAILABLE_HANDLE,
    OBJECT_ALREADY_EXISTS,
    OBJECT_HAS_LEASE,
    OBJECT_NOT_FOUND,
    OK,
    ObjectDataType,
    REPLICA_IS_NOT_READY,
    RPC_FAIL,
    RPC_TIMEOUT,
    ReplicateConfig,
    SoftPinAction,
    TRANSFER_FAIL,
    mooncake_code,
    _ECS_TO_MC,
    _HDR,
    _Owned,
    _addr_of,
    _buffer_handle,
    _config_refusal,
    _encode_header,
    _redis_scan,
    parse_size,
)

log = logging.getLogger("ecstore.mooncake")

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "ObjectDataType", "mooncake_code",
           "OK", "INTERNAL_ERROR", "BUFFER_OVERFLOW", "NO_AVAILABLE_HANDLE", "INVALID_KEY", "INVALID_PARAMS",
           "INVALID_READ", "INVALID_REPLICA", "REPLICA_IS_NOT_READY", "OBJECT_NOT_FOUND", "OBJECT_ALREADY_EXISTS",
           "OBJECT_HAS_LEASE", "LEASE_EXPIRED", "TRANSFER_FAIL", "RPC_FAIL", "RPC_TIMEOUT"]

# ---- the store -------------------------------------------------------------------

_SETUP_ARGS = ("local_hostname", "metadata_server", "global_segment_size", "local_buffer_size", "protocol",
               "rdma_devices", "master_server_addr")
_SETUP_DEFAULTS = {"engine": None, "enable_ssd_offload": False, "ssd_offload_path": "", "tenant_id": "default",
                   "enable_client_http_server": False, "client_http_port": 9300}
# setup(config) keys beyond the positional ones: Mooncake's, then ecstore's own.
_DICT_EXTRA = {"ipc_socket_path"}
_ECSTORE_KEYS = {"namespace", "auth_token", "timeout_ms", "connect_timeout_ms", "verify_checksum", "compression",
                 "rdma_port", "rdma_gid_index", "shm_read_only", "max_object_size", "shm_server_uid"}
_PROTOCOLS = {"tcp": "tcp", "rdma": "rdma", "shm": "shm", "auto": "auto"}


# Statuses after which a list-placed get asks the holders Redis names.
_ASK_HOLDERS = (_c.ENOTFOUND, _c.ECONN, _c.ENOTCONN)
_MAX_KEY = 256  # ecstore's key limit (ECS_MAX_KEY)


def _key_bytes(k):
    return k.encode() if isinstance(k, str) else bytes(k)


def _readable(k):
    """Whether a key can name an ecstore object (1..256 bytes): others are
    misses on the read side, as in Mooncake where nothing is stored under
    them."""
    return 0 < len(_key_bytes(k)) <= _MAX_KEY


def _check_keys(what, keys):
    """TypeError unless keys is a sequence of str/bytes (as pybind11's
    List[str] argument)."""
    if isinstance(keys, (str, bytes)) or not hasattr(keys, "__len__"):
        raise TypeError("%s(): incompatible function arguments: keys are a list of str, not %s"
                        % (what, type(keys).__name__))
    for k in keys:
        if not isinstance(k, (str, bytes)):
            raise TypeError("%s(): incompatible function arguments: a key is a str, not %s" % (what, type(k).__name__))


def _check_uints(what, *seqs):
    """TypeError unless every value is an int >= 0 (Mooncake's pointers and
    sizes are unsigned: a negative one does not convert)."""
    for seq in seqs:
        for v in seq:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v >= 1 << 64:
                raise TypeError("%s(): incompatible function arguments: pointers and sizes are unsigned ints, "
                                "not %r" % (what, v))


def _is_tensor(desc):
    """A tensor object (what Mooncake stores with its 304-byte metadata):
    any description but ecstore's raw bytes (u8, one dimension)."""
    return desc.dtype in _ECS_TO_MC and not (desc.dtype == _lib.DTYPE_U8 and desc.ndim == 1)


def _shape(desc):
    return tuple(desc.shape[: desc.ndim])


_PIN_SOFT, _PIN_HARD = 1, 2  # ECS_PIN_* (ecs_client_set_pin)


def _pin_of(config):
    """(kind, soft TTL in ms) a ReplicateConfig asks for, or None: a hard pin
    for with_hard_pin (it wins over a soft pin, as the server's flags do);
    a soft pin for soft_pin_action ENABLE, for its soft_pin_ttl_ms (0 or
    None: the server's --soft-pin-ttl-ms).  A TTL without ENABLE was
    refused before (_config_refusal), as Mooncake refuses it."""
    if config is None:
        return None
    if getattr(config, "with_hard_pin", False):
        return _PIN_HARD, 0
    if int(getattr(config, "soft_pin_action", 0)) == 1:
        return _PIN_SOFT, int(getattr(config, "soft_pin_ttl_ms", None) or 0)
    return None


def _gather(ptrs, sizes):
    """(ptr, nbytes, keepalive) of the concatenation of the regions: the
    region itself when there is one, else one copy into a fresh block (not
    zeroed first: every byte is written)."""
    regions = [(p, z) for p, z in zip(ptrs, sizes) if z]
    if len(regions) == 1:
        return regions[0][0], regions[0][1], None
    import numpy as np

    total = sum(z for _, z in regions)
    block = np.empty(max(total, 1), np.uint8)
    base, off = block.ctypes.data, 0
    for p, z in regions:
        ctypes.memmove(base + off, p, z)
        off += z
    return base, total, block


class _BadConfig(ValueError):
    """A setup(config) value Mooncake refuses with INVALID_PARAMS."""


class MooncakeDistributedStore(TensorCalls):
    """``mooncake.store.MooncakeDistributedStore`` over ecstore (see the
    module doc and docs/mooncake.md)."""

    def __init__(self):
        self._store = None
        self._hostname = ""
        self._redis_url = None
        self._ns = "default"
        self._timeout_s = 10.0
        self._regions = {}  # register_buffer: start -> size (for get_into_ranges bounds)
        self._place = None  # the extra clients ReplicateConfig asks for (_mooncake_place)
        self._port_sock = None  # holds the port of get_hostname()
        self._local_buffer = 0  # setup()'s local_buffer_size (0: the staging calls fail, as Mooncake's)
        self.last_error = ""  # why the last setup() failed

    # ---- life cycle ----------------------------------------------------------

    def setup(self, *args, **kwargs):
        """setup(local_hostname, metadata_server, global_segment_size,
        local_buffer_size, protocol, rdma_devices, master_server_addr,
        engine=None, enable_ssd_offload=False, ssd_offload_path='',
        tenant_id='default', enable_client_http_server=False,
        client_http_port=9300) or setup(config: dict).  Returns 0, or -1
        (Mooncake's value) with the reason logged and in ``last_error``.
        ``device_name`` is taken as another name of ``rdma_devices``."""
        try:
            params = self._parse_setup(args, kwargs)
        except TypeError:
            raise
        except _BadConfig as e:  # setup(config) with a bad value: Mooncake's -600
            return self._setup_failed(str(e), INVALID_PARAMS)
        except ValueError as e:
            return self._setup_failed(str(e))
        if self._store is not None:
            self.close()
        try:
            self._store = Store(params)
        except EcstoreError as e:
            self._store = None
            return self._setup_failed(str(e))
        self._hostname = self._segment_name(self._hostname)
        self._place = Placement(self._store, params, self._hostname)
        return 0

    def _setup_failed(self, why, code=INTERNAL_ERROR):
        self.last_error = why
        log.error("setup failed: %s", why)
        return code

    def _segment_name(self, host):
        """local_hostname as Mooncake names the client's segment: with a
        port as given, else with a port of 12300..14300 held by a socket
        bound here until close(), as Mooncake's transfer engine holds its
        RPC port (so two clients on a host never share a name)."""
        h, sep, port = host.rpartition(":")
        if sep and port.isdigit() and (h.startswith("[") or ":" not in h):
            return host
        rng = random.Random()
        for _ in range(200):
            port = rng.randint(12300, 14300)
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            try:
                sock.bind(("", port))
            except OSError:
                sock.close()
                continue
            self._port_sock = sock
            return "%s:%d" % (host, port)
        log.warning("setup: no free port in 12300..14300 to name this client; get_hostname() has none")
        return host

    def _parse_setup(self, args, kwargs):
        if "device_name" in kwargs:  # the older name of rdma_devices
            if "rdma_devices" in kwargs:
                raise TypeError("setup(): rdma_devices and device_name both given")
            kwargs["rdma_devices"] = kwargs.pop("device_name")
        if (len(args) == 1 and not kwargs and isinstance(args[0], dict)) or (not args and set(kwargs) == {"config"}):
            cfg = dict(args[0] if args else kwargs["config"])
            for k in ("local_hostname", "metadata_server"):
                if k not in cfg:
                    raise _BadConfig("config dict lacks the required key %r" % k)
            for k in ("global_segment_size", "local_buffer_size"):
                if k in cfg:
                    try:
                        cfg[k] = parse_size(cfg[k])
                    except ValueError as e:
                        raise _BadConfig("%s: %s" % (k, e)) from None
            p = {"global_segment_size": 16 << 20, "local_buffer_size": 16 << 20, "protocol": "tcp",
                 "rdma_devices": "", "master_server_addr": ""}
            p.update(_SETUP_DEFAULTS)
            if "device_name" in cfg:
                cfg.setdefault("rdma_devices", cfg.pop("device_name"))
            for k, v in cfg.items():
                if k in p or k in _SETUP_ARGS or k in _DICT_EXTRA or k in _ECSTORE_KEYS:
                    p[k] = v
                else:
                    log.warning("setup: config key %r has no meaning in ecstore; ignored", k)
        else:
            names = _SETUP_ARGS + tuple(_SETUP_DEFAULTS)
            if len(args) > len(names):
                raise TypeError("setup() takes at most %d positional arguments" % len(names))
            p = dict(_SETUP_DEFAULTS)
            p.update(zip(names, args))
            for k, v in kwargs.items():
                if k not in names:
                    raise TypeError("setup() got an unexpected keyword argument %r" % k)
                if k in dict(zip(names, args)):
                    raise TypeError("setup() got multiple values for argument %r" % k)
                p[k] = v
            missing = [n for n in _SETUP_ARGS if n not in p]
            if missing:
                raise TypeError("setup() missing required arguments: %s" % ", ".join(missing))
        return self._map_setup(p)

    def _map_setup(self, p):
        for k in ("local_hostname", "metadata_server", "protocol", "rdma_devices", "master_server_addr"):
            if not isinstance(p.get(k, ""), str):
                raise TypeError("setup(): %s must be a str" % k)
        for k in ("global_segment_size", "local_buffer_size"):
            v = p[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise TypeError("setup(): %s must be an unsigned int, got %r" % (k, v))
        if p.get("engine") is not None:
            raise ValueError("engine: ecstore cannot share a Mooncake TransferEngine")
        if p.get("enable_ssd_offload"):
            raise ValueError("enable_ssd_offload: ecstore keeps objects in the server's memory pool only")
        if p.get("enable_client_http_server"):
            raise ValueError("enable_client_http_server: ecstore's metrics are the server's Prometheus endpoint")
        proto = p["protocol"].lower()
        if proto not in _PROTOCOLS:
            raise ValueError("protocol %r: ecstore speaks tcp, rdma (and its own shm, auto)" % p["protocol"])
        meta = p["metadata_server"].strip()
        if meta in ("", "P2PHANDSHAKE"):
            redis_url = None  # existence checks then ask the servers
        elif meta.startswith(("http://", "https://", "etcd://")) or "://" in meta and not meta.startswith("redis://"):
            raise ValueError("metadata_server %r: ecstore's metadata server is Redis (redis://host:port), "
                             "or P2PHANDSHAKE for none" % meta)
        else:
            redis_url = meta if meta.startswith("redis://") else "redis://" + meta
        servers = p["master_server_addr"].strip() or os.environ.get("ECSTORE_SERVERS", "")
        if servers.startswith("etcd://") or (not servers and not redis_url):
            raise ValueError("master_server_addr %r: give the ecstore servers as host:port[,host:port...], or a "
                             "Redis metadata_server to find them in its registry" % p["master_server_addr"])
        servers = servers or None  # none listed: the servers in Redis's registry (docs/multihost.md)
        ns = p.get("namespace")
        if ns is None:
            tenant = p.get("tenant_id", "default")
            ns = tenant if tenant != "default" else os.environ.get("ECSTORE_NS", "default")
        cfg = {"servers": servers, "redis_url": redis_url, "namespace": ns, "transport": _PROTOCOLS[proto]}
        devices = [d for d in p.get("rdma_devices", "").split(",") if d.strip()]
        if proto == "rdma":
            if len(devices) > 1:
                raise ValueError("rdma_devices %r: ecstore's client uses one device" % p["rdma_devices"])
            if devices:
                cfg["rdma_device"] = devices[0].strip()
        for k in _ECSTORE_KEYS - {"namespace"}:
            if k in p:
                cfg[k] = p[k]
        self._hostname = p["local_hostname"]
        self._local_buffer = p["local_buffer_size"]
        self._redis_url = redis_url
        self._ns = ns
        self._timeout_s = cfg.get("timeout_ms", 10000) / 1000.0
        return cfg

    def init_all(self, protocol, device_name, mount_segment_size):
        """Mooncake's legacy init: needs its own master; not supported."""
        log.error("init_all: not supported by ecstore; call setup()")
        return INVALID_PARAMS

    def close(self):
        """Closes the connections; returns 0.  setup() may be called again."""
        if self._store is not None:
            self._place.close()
            self._store.close()
            self._store = None
        if self._port_sock is not None:
            self._port_sock.close()
            self._port_sock = None
        self._regions = {}
        return 0

    def get_hostname(self):
        """This client's name, host:port: local_hostname as given to setup(),
        with the port held for it when it had none (as Mooncake's)."""
        return self._hostname

    def health_check(self):
        """0 healthy, 1 not set up or closed, 2 a server unreachable."""
        if self._store is None:
            return 1
        try:
            self._store.ping()
        except EcstoreError:
            return 2
        return 0

    # ---- plumbing --------------------------------------------------------------

    def _live(self, what):
        if self._store is None:
            log.error("%s: store not set up (or closed)", what)
            return False
        return True

    def _fail(self, what, e, n):
        """Per-item Mooncake codes after a whole-call EcstoreError."""
        log.error("%s: %s", what, e)
        whole = mooncake_code(e.code)
        st = e.statuses if e.statuses is not None and len(e.statuses) == n else None
        if st is None:
            return [whole] * n
        return [mooncake_code(s) for s in st]

    def _raw_put(self, what, keys, ptrs, sizes, config, upsert, descs=None, keep="last"):
        """Puts (or upserts) n raw regions; returns Mooncake codes.  A wrong
        argument type raises TypeError (as Mooncake's binding does); a key
        given twice is stored once (the occurrence Mooncake keeps: keep
        "last" or "first") and every occurrence gets its result."""
        n = len(keys)
        _check_keys(what, keys)
        _check_uints(what, ptrs, sizes)
        if not self._live(what):
            return [INTERNAL_ERROR] * n
        if len(ptrs) != n or len(sizes) != n or (descs is not None and len(descs) != n):
            log.error("%s: %d keys but %d pointers and %d sizes", what, n, len(ptrs), len(sizes))
            return [INVALID_PARAMS] * n
        why = _config_refusal(config)
        if why:
            log.error("%s: %s", what, why)
            return [INVALID_PARAMS] * n
        if n == 0:
            return []
        out = [None] * n
        todo, first = [], {}
        order = range(n) if keep == "first" else range(n - 1, -1, -1)
        for i in order:
            k = _key_bytes(keys[i])
            if k in first:  # a key given again in this batch: the kept one's result
                continue
            first[k] = i
            if (descs is None and sizes[i] <= 0) or (sizes[i] > 0 and ptrs[i] <= 0):
                log.error("%s: item %d: bad buffer (ptr %#x, size %d)", what, i, ptrs[i], sizes[i])
                out[i] = INVALID_PARAMS
            elif not k or len(k) > _MAX_KEY:
                log.error("%s: item %d: a key is 1 to %d bytes, got %d", what, i, _MAX_KEY, len(k))
                out[i] = INVALID_PARAMS
            else:
                todo.append(i)
        todo.sort()
        if todo:
            self._put_items(what, keys, ptrs, sizes, descs, todo, config, upsert, out)
        for i in range(n):
            if out[i] is None:
                out[i] = out[first[_key_bytes(keys[i])]]
        return out

    def _put_items(self, what, keys, ptrs, sizes, descs, todo, config, upsert, out):
        m = len(todo)
        karr = _keys([keys[i] for i in todo])
        tarr = (_lib.Tensor * m)()
        for j, i in enumerate(todo):
            t = tarr[j]
            t.data = ptrs[i] or ctypes.addressof(t)
            t.nbytes = sizes[i]
            if descs is None:
                t.desc.dtype, t.desc.ndim, t.desc.shape[0] = _lib.DTYPE_U8, 1, sizes[i]
            else:
                code, shape = descs[i]
                t.desc.dtype, t.desc.ndim = code, len(shape)
                for d, v in enumerate(shape):
                    t.desc.shape[d] = v
        st = (ctypes.c_int * m)()
        store = self._place.target(what, config)
        fn = getattr(store._lib, "ecs_upsert_batch", None) if upsert else store._lib.ecs_put_batch
        pin = _pin_of(config)
        set_pin = getattr(store._lib, "ecs_client_set_pin", None) if pin else None
        if fn is None or (pin and set_pin is None):
            log.error("%s: this libecstore has no %s (older than %s)", what,
                      *(("ecs_upsert_batch", "upserts") if fn is None else ("ecs_client_set_pin", "hard pins")))
            for i in todo:
                out[i] = INVALID_PARAMS
            return
        try:
            if pin:  # on this thread's handle, for this call only
                store._call(set_pin, *pin)
            try:
                rc, detail = store._call(fn, karr, tarr, m, st)
            finally:
                if pin:
                    store._call(set_pin, 0, 0)
        except EcstoreError as e:  # closed meanwhile
            rc, detail = e.code, str(e)
        for j, i in enumerate(todo):
            s = st[j] if st[j] != 0 or rc == 0 else rc
            if s:
                log.error("%s %r: %s", what, keys[i], _err_text(s, detail))
            out[i] = mooncake_code(s)

    def _get_batch_call(self, what, keys, bufs, fn_name):
        """ecs_get_batch / ecs_get_batch_alloc of keys into bufs on the
        store the keys hash to; the items that miss there (or whose server
        failed) are asked again of the servers Redis names as holders (a
        copy placed by replicas or a preferred segment: docs/mooncake.md).
        Returns per item (status, detail)."""
        n = len(keys)
        karr = _keys(keys)
        try:
            rc, detail = self._store._call(getattr(self._store._lib, fn_name), karr, bufs, n)
        except EcstoreError as e:
            rc, detail = e.code, str(e)
        st = [(b.status if (b.status != 0 or rc == 0) else rc, detail) for b in bufs]
        again = [i for i in range(n) if st[i][0] in _ASK_HOLDERS]
        located = self._place.located() if again else None
        if located is not None:
            m = len(again)
            sub = (_lib.GetBuf * m)()
            for j, i in enumerate(again):
                sub[j].data, sub[j].capacity = bufs[i].data, bufs[i].capacity
            try:
                rc2, detail2 = located._call(getattr(located._lib, fn_name), _keys([keys[i] for i in again]), sub, m)
            except EcstoreError as e:
                rc2, detail2 = e.code, str(e)
            for j, i in enumerate(again):
                s2 = sub[j].status if (sub[j].status != 0 or rc2 == 0) else rc2
                if s2 == 0 or s2 not in _ASK_HOLDERS:
                    ctypes.memmove(ctypes.addressof(bufs[i]), ctypes.addressof(sub[j]), ctypes.sizeof(_lib.GetBuf))
                    st[i] = (s2, detail2)
        return st

    def _raw_get(self, what, keys, ptrs, sizes, quiet=(), present=True):
        """Reads objects into caller buffers; returns Mooncake results and
        the GetBuf array (for descriptions).  present: a tensor object is
        given as Mooncake's [304-byte metadata][data] (its get_into does)."""
        n = len(keys)
        _check_keys(what, keys)
        _check_uints(what, ptrs, sizes)
        if not self._live(what):
            return [INTERNAL_ERROR] * n, None
        if len(ptrs) != n or len(sizes) != n:
            log.error("%s: %d keys but %d pointers and %d sizes", what, n, len(ptrs), len(sizes))
            return [INVALID_PARAMS] * n, None
        if n == 0:
            return [], None
        bufs = (_lib.GetBuf * n)()
        out = [None] * n
        ask = []
        for i in range(n):
            bufs[i].data = ptrs[i] if sizes[i] > 0 else None
            bufs[i].capacity = sizes[i]
            if _readable(keys[i]):
                ask.append(i)
            else:  # "" or longer than ecstore keys: nothing is stored under it
                bufs[i].status = _c.ENOTFOUND
                out[i] = OBJECT_NOT_FOUND
        if ask:
            sub = bufs if len(ask) == n else (_lib.GetBuf * len(ask))()
            if sub is not bufs:
                for j, i in enumerate(ask):
                    sub[j].data, sub[j].capacity = bufs[i].data, bufs[i].capacity
            st = self._get_batch_call(what, [keys[i] for i in ask], sub, "ecs_get_batch")
            for j, i in enumerate(ask):
                if sub is not bufs:
                    ctypes.memmove(ctypes.addressof(bufs[i]), ctypes.addressof(sub[j]), ctypes.sizeof(_lib.GetBuf))
                s, detail = st[j]
                b = bufs[i]
                if s == 0 and present and _is_tensor(b.desc):
                    if b.nbytes + _HDR > sizes[i]:
                        log.error("%s %r: a tensor of %d bytes and its %d-byte metadata do not fit in %d", what,
                                  keys[i], b.nbytes, _HDR, sizes[i])
                        s = _c.EBUFSMALL
                    else:
                        if b.nbytes:
                            ctypes.memmove(ptrs[i] + _HDR, ptrs[i], b.nbytes)
                        ctypes.memmove(ptrs[i], _encode_header(b.desc.dtype, _shape(b.desc), b.nbytes), _HDR)
                        b.nbytes += _HDR
                if s == 0:
                    out[i] = b.nbytes
                else:
                    if s != _c.ENOTFOUND and s not in quiet:
                        log.error("%s %r: %s", what, keys[i], _err_text(s, detail))
                    out[i] = mooncake_code(s)
        return out, bufs

    def _alloc_get(self, what, keys, present=True):
        """[(status, owner, ptr, nbytes, desc)] with ecs_get_batch_alloc;
        present: a tensor object as [304-byte metadata][data] (one copy)."""
        _check_keys(what, keys)
        n = len(keys)
        ask = [i for i in range(n) if _readable(keys[i])]
        res = [(_c.ENOTFOUND, None, 0, 0, _lib.TensorDesc())] * n
        if not ask:
            return res
        bufs = (_lib.GetBuf * len(ask))()
        st = self._get_batch_call(what, [keys[i] for i in ask], bufs, "ecs_get_batch_alloc")
        for j, i in enumerate(ask):
            b = bufs[j]
            s, detail = st[j]
            owner = _Owned(b.data) if s == 0 and b.data else None
            if s and s != _c.ENOTFOUND:
                log.error("%s %r: %s", what, keys[i], _err_text(s, detail))
            ptr, nb = (b.data or 0), (b.nbytes if s == 0 else 0)
            if s == 0 and present and _is_tensor(b.desc):
                joined = ctypes.create_string_buffer(_HDR + nb)
                joined[:_HDR] = _encode_header(b.desc.dtype, _shape(b.desc), nb)
                if nb:
                    ctypes.memmove(ctypes.addressof(joined) + _HDR, ptr, nb)
                owner, ptr, nb = joined, ctypes.addressof(joined), _HDR + nb
            res[i] = (s, owner, ptr, nb, b.desc)
        return res

    # ---- bytes -------------------------------------------------------------------

    def _no_staging(self, what):
        """Mooncake's put/get of Python values (not put_from/get_into)
        stage through the local buffer: with local_buffer_size 0 they fail,
        and so they do here (docs/mooncake.md)."""
        if self._local_buffer == 0 and self._store is not None:
            log.error("%s: local_buffer_size is 0: no local buffer to stage the value through "
                      "(use put_from/get_into, or set a local_buffer_size)", what)
            return True
        return False

    def put(self, key, value, config=None):
        """Stores the bytes of a buffer-protocol value.  0 or a code."""
        _check_keys("put", [key])
        ptr, n, keep = _addr_of(value)
        if self._no_staging("put"):
            return INVALID_PARAMS
        rc = self._raw_put("put", [key], [ptr], [n], config, False)[0]
        del keep
        return rc

    def upsert(self, key, value, config=None):
        """put, replacing what the key holds (insert or update)."""
        _check_keys("upsert", [key])
        ptr, n, keep = _addr_of(value)
        if self._no_staging("upsert"):
            return INVALID_PARAMS
        rc = self._raw_put("upsert", [key], [ptr], [n], config, True)[0]
        del keep
        return rc

    def _values(self, what, keys, values, config, upsert):
        """put_batch / upsert_batch: all or nothing, as Mooncake's: an empty
        value stores no item; a key given twice is stored once (its first
        value)."""
        _check_keys(what, keys)
        if len(keys) != len(values):
            log.error("%s: %d keys but %d values", what, len(keys), len(values))
            return INVALID_PARAMS
        held = [_addr_of(v) for v in values]
        if self._no_staging(what):
            return INVALID_PARAMS
        empty = [i for i, h in enumerate(held) if h[1] == 0]
        if empty:
            log.error("%s: item %d has an empty value; nothing stored", what, empty[0])
            return INVALID_PARAMS
        st = self._raw_put(what, keys, [h[0] for h in held], [h[1] for h in held], config, upsert, keep="first")
        bad = [s for s in st if s != 0]
        return bad[0] if bad else 0

    def put_batch(self, keys, values, config=None):
        """Stores several values; returns 0 or the first item's error code."""
        return self._values("put_batch", keys, values, config, False)

    def upsert_batch(self, keys, values, config=None):
        return self._values("upsert_batch", keys, values, config, True)

    def _parts(self, what, key, parts, config, upsert):
        _check_keys(what, [key])
        if self._no_staging(what):
            return INVALID_PARAMS
        if not parts:  # Mooncake: 0, nothing stored
            return 0
        held = [_addr_of(p) for p in parts]
        ptr, n, keep = _gather([h[0] for h in held], [h[1] for h in held])
        rc = self._raw_put(what, [key], [ptr], [n], config, upsert)[0]
        del keep, held
        return rc

    def put_parts(self, key, *args, config=None):
        """Stores the concatenation of the parts (args) as one object (one
        copy here).  No parts: 0 and nothing stored, as Mooncake."""
        return self._parts("put_parts", key, args, config, False)

    def upsert_parts(self, key, *args, config=None):
        return self._parts("upsert_parts", key, args, config, True)

    def get(self, key):
        """The object's bytes (a tensor's with Mooncake's 304-byte metadata
        first), or b"" for a miss or an error."""
        _check_keys("get", [key])
        if not self._live("get") or self._no_staging("get"):
            return b""
        s, owner, ptr, n, _ = self._alloc_get("get", [key])[0]
        return ctypes.string_at(ptr, n) if s == 0 and n else b""

    def get_batch(self, keys):
        """[bytes] per key (b"" for a miss or an error).  An empty list gives
        [b""], as Mooncake's."""
        _check_keys("get_batch", keys)
        if not keys:
            return [b""]
        if not self._live("get_batch") or self._no_staging("get_batch"):
            return [b""] * len(keys)
        return [ctypes.string_at(p, n) if s == 0 and n else b"" for s, o, p, n, _ in self._alloc_get("get_batch", keys)]

    def get_buffer(self, key):
        """A BufferHandle (buffer protocol, ptr(), size()) over the object's
        bytes, or None."""
        return self.batch_get_buffer([key])[0]

    def batch_get_buffer(self, keys):
        _check_keys("batch_get_buffer", keys)
        if not self._live("batch_get_buffer") or self._no_staging("batch_get_buffer"):
            return [None] * len(keys)
        if not keys:
            return []
        got = self._alloc_get("batch_get_buffer", keys)
        return [_buffer_handle(o, p, n) if s == 0 else None for s, o, p, n, _ in got]

    def get_size(self, key):
        """The object's byte count as get() gives it (a tensor's with its
        304-byte metadata, as Mooncake's), or a code (OBJECT_NOT_FOUND)."""
        res, bufs = self._raw_get("get_size", [key], [0], [0], quiet=(_c.EBUFSMALL,), present=False)
        if bufs is not None and bufs[0].status in (0, _c.EBUFSMALL):
            return bufs[0].nbytes + (_HDR if _is_tensor(bufs[0].desc) else 0)
        return res[0]

    def is_exist(self, key):
        """1, 0, or a negative code."""
        return self.batch_is_exist([key])[0]

    def batch_is_exist(self, keys):
        _check_keys("batch_is_exist", keys)
        if not self._live("batch_is_exist"):
            return [INTERNAL_ERROR] * len(keys)
        out = [0] * len(keys)
        ask = [i for i, k in enumerate(keys) if _readable(k)]
        if not ask:
            return out
        try:
            got = self._store.batch_is_exist([keys[i] for i in ask])
        except EcstoreError as e:
            log.error("batch_is_exist: %s", e)
            return [mooncake_code(e.code)] * len(keys)
        for i, r in zip(ask, got):
            out[i] = r
        return out

    def remove(self, key, force=False):
        """0 or OBJECT_NOT_FOUND.  force has nothing to skip here (ecstore
        leases never block a remove)."""
        return self.batch_remove([key], force)[0]

    def batch_remove(self, keys, force=False):
        """Per key 0 or a code; every copy goes (replicas, a copy placed on
        a preferred segment: through Redis's holder records)."""
        _check_keys("batch_remove", keys)
        if not self._live("batch_remove"):
            return [INTERNAL_ERROR] * len(keys)
        out = [OBJECT_NOT_FOUND] * len(keys)
        ask = [i for i, k in enumerate(keys) if _readable(k)]
        if not ask:
            return out
        try:
            got = [mooncake_code(s) for s in self._place.remover().batch_remove([keys[i] for i in ask])]
        except EcstoreError as e:
            got = self._fail("batch_remove", e, len(ask))
        for i, r in zip(ask, got):
            out[i] = r
        return out

    def remove_all(self, force=False):
        """Removes every object of this store's namespace; returns how many,
        or a code.  Finds them through Redis (a SCAN of the object records),
        so it needs a metadata_server."""
        return self._remove_matching("remove_all", lambda k: True)

    def remove_by_regex(self, regex_pattern, force=False):
        """Removes the objects of this namespace whose key contains a match
        of regex_pattern (a search, as Mooncake's); returns how many, or
        INVALID_PARAMS for a bad pattern.  Lists keys through Redis, as
        remove_all."""
        try:
            rx = re.compile(regex_pattern)
        except re.error as e:
            log.error("remove_by_regex: bad pattern %r: %s", regex_pattern, e)
            return INVALID_PARAMS
        return self._remove_matching("remove_by_regex", lambda k: rx.search(k.decode(errors="replace")))

    def _remove_matching(self, what, keep):
        if not self._live(what):
            return INTERNAL_ERROR
        if not self._redis_url:
            log.error("%s: needs the Redis metadata server to list the objects", what)
            return INVALID_PARAMS
        prefix = ("ecs:{%s}:obj:" % self._ns).encode()
        try:
            names = _redis_scan(self._redis_url, prefix + b"*", self._timeout_s)
        except (OSError, ValueError) as e:
            log.error("%s: listing objects in Redis: %s", what, e)
            return RPC_FAIL
        keys = [k[len(prefix):] for k in names if k.startswith(prefix) and len(k) > len(prefix)]
        keys = [k for k in keys if keep(k)]
        removed = 0
        for i in range(0, len(keys), 1024):
            st = self.batch_remove(keys[i:i + 1024])
            removed += sum(1 for s in st if s == 0)
        return removed

    def put_from_with_metadata(self, key, buffer_ptr, metadata_buffer_ptr, size, metadata_size, config=None):
        """Stores metadata_size bytes at metadata_buffer_ptr followed by size
        bytes at buffer_ptr as one object (joined here with one copy)."""
        return self.batch_put_from_multi_buffers([key], [[metadata_buffer_ptr, buffer_ptr]],
                                                 [[metadata_size, size]], config)[0]

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node=False):
        """Reads each object and spreads its bytes over its buffers in order;
        per key the bytes read, OBJECT_NOT_FOUND, or INVALID_PARAMS when the
        buffers together are too small (nothing written).  One copy here:
        the object is fetched whole, then scattered."""
        n = len(keys)
        if len(all_buffer_ptrs) != n or len(all_sizes) != n:
            log.error("batch_get_into_multi_buffers: mismatched list lengths")
            return [INVALID_PARAMS] * n
        if not self._live("batch_get_into_multi_buffers"):
            return [INTERNAL_ERROR] * n
        out = [None] * n
        for i in range(n):
            if len(all_buffer_ptrs[i]) != len(all_sizes[i]) or any(
                    (not isinstance(z, int)) or z < 0 for z in all_sizes[i]):
                out[i] = INVALID_PARAMS
        todo = [i for i in range(n) if out[i] is None]
        got = self._alloc_get("batch_get_into_multi_buffers", [keys[i] for i in todo]) if todo else []
        for (s, owner, ptr, nb, _), i in zip(got, todo):
            if s != 0:
                out[i] = mooncake_code(s)
                continue
            if sum(all_sizes[i]) < nb:
                log.error("batch_get_into_multi_buffers %r: %d bytes do not fit in %d", keys[i], nb,
                          sum(all_sizes[i]))
                out[i] = INVALID_PARAMS
                continue
            off = 0
            for p, z in zip(all_buffer_ptrs[i], all_sizes[i]):
                take = min(z, nb - off)
                if take <= 0:
                    break
                ctypes.memmove(p, ptr + off, take)
                off += take
            out[i] = nb
        return out

    def put_from(self, key, buffer_ptr, size, config=None):
        """Stores size bytes at buffer_ptr.  0 or a code; size 0 stores
        nothing and returns 0, as Mooncake's."""
        return self._one_from("put_from", key, buffer_ptr, size, config, False)

    def upsert_from(self, key, buffer_ptr, size, config=None):
        return self._one_from("upsert_from", key, buffer_ptr, size, config, True)

    def _one_from(self, what, key, ptr, size, config, upsert):
        _check_keys(what, [key])
        _check_uints(what, [ptr], [size])
        if size == 0 and self._store is not None:
            log.warning("%s %r: 0 bytes: nothing stored (Mooncake returns 0 too)", what, key)
            return 0
        return self._raw_put(what, [key], [ptr], [size], config, upsert)[0]

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        """Per item 0 or a code (mismatched list lengths: INVALID_PARAMS for
        every item)."""
        return self._raw_put("batch_put_from", keys, buffer_ptrs, sizes, config, False)

    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config=None):
        return self._raw_put("batch_upsert_from", keys, buffer_ptrs, sizes, config, True)

    def get_into(self, key, buffer_ptr, size):
        """Reads the object into the buffer: its byte count, or a code
        (INVALID_PARAMS when the buffer is too small: nothing written)."""
        return self._raw_get("get_into", [key], [buffer_ptr], [size])[0][0]

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        return self._raw_get("batch_get_into", keys, buffer_ptrs, sizes)[0]

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        """Stores, per key, the concatenation of several regions: one region
        straight from the caller's memory, several gathered with one copy
        (an ecstore object is one region)."""
        _check_keys("batch_put_from_multi_buffers", keys)
        for ptrs, sizes in zip(all_buffer_ptrs, all_sizes):
            _check_uints("batch_put_from_multi_buffers", ptrs, sizes)
        n = len(keys)
        if len(all_buffer_ptrs) != n or len(all_sizes) != n:
            log.error("batch_put_from_multi_buffers: mismatched list lengths")
            return [INVALID_PARAMS] * n
        held, out = [None] * n, [None] * n
        for i in range(n):
            if len(all_buffer_ptrs[i]) != len(all_sizes[i]):
                out[i] = INVALID_PARAMS
            else:
                held[i] = _gather(all_buffer_ptrs[i], all_sizes[i])
        todo = [i for i in range(n) if out[i] is None]
        st = self._raw_put("batch_put_from_multi_buffers", [keys[i] for i in todo], [held[i][0] for i in todo],
                           [held[i][1] for i in todo], config, False)
        for j, i in enumerate(todo):
            out[i] = st[j]
        return out

    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes):
        """For buffer i, key j, range k: copies all_sizes[i][j][k] bytes from
        offset all_src_offsets[i][j][k] of the object to buffer_ptrs[i] +
        all_dst_offsets[i][j][k].  Every destination range must lie inside a
        region given to register_buffer (as Mooncake requires).  Returns
        the bytes copied or a code per range, in the arguments' shape.
        Each object is fetched whole once, then its ranges are copied."""
        nb = len(buffer_ptrs)
        for lst in (all_keys, all_dst_offsets, all_src_offsets, all_sizes):
            for x in lst:
                for y in x:
                    if isinstance(y, (list, tuple)) and any((not isinstance(v, int)) or v < 0 for v in y):
                        raise TypeError("get_into_ranges(): offsets and sizes are non-negative ints")
        if not (len(all_keys) == len(all_dst_offsets) == len(all_src_offsets) == len(all_sizes) == nb):
            log.error("get_into_ranges: top-level size mismatch")
            return [[[INVALID_PARAMS]] for _ in range(nb)]
        if not self._live("get_into_ranges"):
            return [[[INTERNAL_ERROR] for _ in ks] for ks in all_keys]
        out = []
        wanted = sorted({k for ks in all_keys for k in ks}, key=str)
        got = dict(zip(wanted, self._alloc_get("get_into_ranges", wanted))) if wanted else {}
        for i in range(nb):
            ks = all_keys[i]
            row = []
            if not (len(all_dst_offsets[i]) == len(all_src_offsets[i]) == len(all_sizes[i]) == len(ks)):
                out.append([[INVALID_PARAMS] for _ in ks])
                continue
            for j, k in enumerate(ks):
                dst, src, sz = all_dst_offsets[i][j], all_src_offsets[i][j], all_sizes[i][j]
                if not (len(dst) == len(src) == len(sz)):
                    row.append([INVALID_PARAMS])
                    continue
                s, owner, ptr, n, _ = got[k]
                cell = []
                for d, o, z in zip(dst, src, sz):
                    if s != 0:
                        cell.append(mooncake_code(s))
                    elif o + z > n or not self._inside(buffer_ptrs[i] + d, z):
                        cell.append(INVALID_PARAMS)
                    else:
                        if z:
                            ctypes.memmove(buffer_ptrs[i] + d, ptr + o, z)
                        cell.append(z)
                row.append(cell)
            out.append(row)
        return out

    def _inside(self, addr, n):
        for p, s in self._regions.items():
            if p <= addr and addr + n <= p + s:
                return True
        return False

    def register_buffer(self, buffer_ptr, size):
        """Registers a region (with the NIC over RDMA; recorded otherwise).
        0 or INVALID_PARAMS."""
        if not self._live("register_buffer"):
            return INTERNAL_ERROR
        try:
            self._store.register_buffer(buffer_ptr, size)
        except EcstoreError as e:
            log.error("register_buffer: %s", e)
            return mooncake_code(e.code)
        self._regions[buffer_ptr] = size
        return 0

    def unregister_buffer(self, buffer_ptr):
        """0, or INVALID_PARAMS when no region starts there."""
        if not self._live("unregister_buffer"):
            return INTERNAL_ERROR
        try:
            self._store.unregister_buffer(buffer_ptr)
        except EcstoreError as e:
            log.error("unregister_buffer: %s", e)
            return INVALID_PARAMS
        self._regions.pop(buffer_ptr, None)
        return 0


def _err_text(code, detail):
    from ..errors import err_name, strerror

    return "%s (%s)%s" % (strerror(code), err_name(code), ": " + detail if detail else "")
