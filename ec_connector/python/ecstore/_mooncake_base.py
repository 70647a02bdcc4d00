"""The parts of ecstore.mooncake that are not the store class: Mooncake's
error-code values and their mapping from ecstore's, ReplicateConfig and its
enums, the BufferHandle of get_buffer, Mooncake's 304-byte tensor metadata
(encode and checked decode), and the Redis listing behind remove_all.
Import them from ecstore.mooncake, which re-exports the public ones.
"""

import ctypes
import enum
import functools
import logging
import os
import re
import socket
import struct
import urllib.parse

from . import _lib
from . import codes as _c
from . import tensors as _t

log = logging.getLogger("ecstore.mooncake")
# ---- Mooncake's ErrorCode values (its types.h), as its binding returns them

OK = 0
INTERNAL_ERROR = -1
BUFFER_OVERFLOW = -10
NO_AVAILABLE_HANDLE = -200
INVALID_KEY = -400
INVALID_PARAMS = -600
INVALID_READ = -701
INVALID_REPLICA = -702
REPLICA_IS_NOT_READY = -703
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
OBJECT_HAS_LEASE = -706
LEASE_EXPIRED = -707
TRANSFER_FAIL = -800
RPC_FAIL = -900
RPC_TIMEOUT = -901

# ecstore code -> Mooncake code.  Chosen so that an integration's handling
# stays right: a miss is Mooncake's miss, "no room" its allocation failure,
# a bad buffer or argument its INVALID_PARAMS (what it returns for a buffer
# too small), and every failure that happens before or after complete I/O
# one of the codes vLLM's Mooncake clients treat as safe to retry.
_CODE = {
    _c.ENOTFOUND: OBJECT_NOT_FOUND,
    _c.EBUFSMALL: INVALID_PARAMS,
    _c.EINVAL: INVALID_PARAMS,
    _c.EKEY: INVALID_PARAMS,
    _c.EDTYPE: INVALID_PARAMS,
    _c.EOVERFLOW: INVALID_PARAMS,
    _c.ENOTSUP: INVALID_PARAMS,
    _c.ECONFLICT: OBJECT_ALREADY_EXISTS,
    _c.ENOSPC: NO_AVAILABLE_HANDLE,
    _c.ETOOBIG: NO_AVAILABLE_HANDLE,
    _c.EQUOTA: NO_AVAILABLE_HANDLE,
    _c.EPINQUOTA: NO_AVAILABLE_HANDLE,
    _c.EBUSY: REPLICA_IS_NOT_READY,
    _c.ETIMEDOUT: RPC_TIMEOUT,
    _c.ECONN: RPC_FAIL,
    _c.ENOTCONN: RPC_FAIL,
    _c.EREDIS: RPC_FAIL,
    _c.EAUTH: RPC_FAIL,
    _c.EPERM: RPC_FAIL,
    _c.ECHECKSUM: INVALID_READ,
    _c.ECORRUPT: INVALID_READ,
    _c.ESTALE: INVALID_READ,
}


def mooncake_code(ecs_code):
    """The Mooncake ErrorCode for an ecstore code (0 stays 0)."""
    if ecs_code == 0:
        return OK
    return _CODE.get(ecs_code, INTERNAL_ERROR)


# ---- ReplicateConfig and its enums ------------------------------------------


class SoftPinAction(enum.IntEnum):
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ObjectDataType(enum.IntEnum):
    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


class _Field:
    """A ReplicateConfig attribute whose setter checks the type as
    Mooncake's pybind11 property does (a wrong type, or a negative count
    where Mooncake's field is unsigned, raises TypeError)."""

    def __init__(self, name, check, default):
        self.name, self.check, self.default = "_" + name, check, default

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        v = getattr(obj, self.name, self.default)
        return list(v) if isinstance(v, list) else v

    def __set__(self, obj, value):
        object.__setattr__(obj, self.name, self.check(self.name[1:], value))


def _uint(name, v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v >= 1 << 64:
        raise TypeError("ReplicateConfig.%s: incompatible value %r (an unsigned int)" % (name, v))
    return v


def _opt_uint(name, v):
    return None if v is None else _uint(name, v)


def _boolean(name, v):
    if not isinstance(v, bool):
        raise TypeError("ReplicateConfig.%s: incompatible value %r (a bool)" % (name, v))
    return v


def _text(name, v):
    if not isinstance(v, str):
        raise TypeError("ReplicateConfig.%s: incompatible value %r (a str)" % (name, v))
    return v


def _texts(name, v):
    if isinstance(v, (str, bytes)) or not all(isinstance(x, str) for x in v):
        raise TypeError("ReplicateConfig.%s: incompatible value %r (a list of str)" % (name, v))
    return list(v)


def _enum(cls):
    def check(name, v):
        if isinstance(v, cls):
            return v
        raise TypeError("ReplicateConfig.%s: incompatible value %r (a %s)" % (name, v, cls.__name__))

    return check


def _ints(name, v):
    if isinstance(v, (str, bytes)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise TypeError("ReplicateConfig.%s: incompatible value %r (a list of int)" % (name, v))
    return list(v)


class ReplicateConfig:
    """Mooncake's placement options, with its field names, defaults and type
    checks (a wrong type raises TypeError, as Mooncake's binding does; an
    unknown attribute raises AttributeError).  How each is honoured on
    ecstore is in docs/mooncake.md ("ReplicateConfig")."""

    __slots__ = ("_replica_num", "_nof_replica_num", "_dfs_replica_num", "_soft_pin_action", "_soft_pin_ttl_ms",
                 "_with_hard_pin", "_preferred_segment", "_preferred_segments", "_preferred_nof_segments",
                 "_prefer_alloc_in_same_node", "_data_type", "_group_ids")

    replica_num = _Field("replica_num", _uint, 1)
    nof_replica_num = _Field("nof_replica_num", _uint, 0)
    dfs_replica_num = _Field("dfs_replica_num", _uint, 0)
    soft_pin_action = _Field("soft_pin_action", _enum(SoftPinAction), SoftPinAction.PRESERVE)
    soft_pin_ttl_ms = _Field("soft_pin_ttl_ms", _opt_uint, None)
    with_hard_pin = _Field("with_hard_pin", _boolean, False)
    preferred_segment = _Field("preferred_segment", _text, "")
    preferred_segments = _Field("preferred_segments", _texts, [])
    preferred_nof_segments = _Field("preferred_nof_segments", _texts, [])
    prefer_alloc_in_same_node = _Field("prefer_alloc_in_same_node", _boolean, False)
    data_type = _Field("data_type", _enum(ObjectDataType), ObjectDataType.UNKNOWN)
    group_ids = _Field("group_ids", _ints, [])

    def __str__(self):
        ttl = "default" if self.soft_pin_ttl_ms is None else str(self.soft_pin_ttl_ms)
        segs = list(self.preferred_segments) or ([self.preferred_segment] if self.preferred_segment else [])
        return ("ReplicateConfig: { replica_num: %d, nof_replica_num: %d, dfs_replica_num: %d, soft_pin_action: %s, "
                "soft_pin_ttl_ms: %s, with_hard_pin: %d, preferred_segments: [%s], preferred_nof_segments: [%s], "
                "prefer_alloc_in_same_node: %d, data_type: %s }"
                % (self.replica_num, self.nof_replica_num, self.dfs_replica_num, self.soft_pin_action.name, ttl,
                   self.with_hard_pin, ", ".join(segs), ", ".join(self.preferred_nof_segments),
                   self.prefer_alloc_in_same_node, self.data_type.name))

    __repr__ = __str__


def _config_refusal(config):
    """Why ecstore cannot honour config (a ReplicateConfig of ours or of
    Mooncake's), or None.  replica_num, preferred segments and pins are
    honoured by the store class (docs/mooncake.md); what is left here is
    what no ecstore deployment has: replicas on other tiers."""
    if config is None:
        return None
    g = functools.partial(getattr, config)
    if g("replica_num", 1) == 0:
        return "replica_num=0: no copy to store"
    if g("nof_replica_num", 0) or g("dfs_replica_num", 0):
        return "replicas on other tiers (nof/dfs) are not supported: ecstore keeps objects in server memory"
    if g("preferred_nof_segments", []):
        return "preferred_nof_segments: ecstore has no NoF tier"
    if g("soft_pin_ttl_ms", None) is not None and int(g("soft_pin_action", 0)) != 1:
        return "soft_pin_ttl_ms without soft_pin_action ENABLE (Mooncake refuses it too)"
    return None


# ---- setup(config) sizes ----------------------------------------------------------

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kmgKMG]?)(?:[bB])?\s*$")
_SIZE_UNIT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(v):
    """A setup(config) size: an int >= 0, or a string as Mooncake's config
    takes it ("16MB", "16 MB", "1.5GB", "2 G", "512K", "1024"); anything
    else ("50%", "16MiB", negative, a bool or a float) raises ValueError."""
    if isinstance(v, bool) or v is None:
        raise ValueError("size %r: an integer or a string such as \"16MB\"" % (v,))
    if isinstance(v, int):
        if v < 0:
            raise ValueError("size %r is negative" % v)
        return v
    if not isinstance(v, str):
        raise ValueError("size %r: an integer or a string such as \"16MB\"" % (v,))
    m = _SIZE_RE.match(v)
    if not m or (not m.group(2) and v.strip()[-1:] in "bB"):
        raise ValueError("size %r: a number with an optional K/KB, M/MB or G/GB unit" % v)
    return int(float(m.group(1)) * _SIZE_UNIT[m.group(2).lower()])


# ---- buffers ------------------------------------------------------------------


class _Owned:
    """A block from ecs_get_batch_alloc, freed with the last object using it."""

    __slots__ = ("ptr", "_free")

    def __init__(self, ptr):
        self.ptr = ptr
        self._free = _lib.lib().ecs_free  # bound now: at exit module globals may be gone

    def __del__(self):
        if self.ptr:
            self._free(self.ptr)
            self.ptr = None


def _handle_methods(cls_name):
    def ptr(self):
        """The address of the bytes (valid while this handle lives)."""
        return self._addr

    def size(self):
        """The byte count."""
        return self._n

    return {"ptr": ptr, "size": size, "__slots__": ("_owner", "_addr", "_n"), "__module__": __name__,
            "__qualname__": cls_name}


@functools.lru_cache(maxsize=64)
def _handle_class(n):
    # A ctypes array gives the buffer protocol (format "<b", signed bytes as
    # Mooncake's handle has) without a copy; one small class per size.
    return type("BufferHandle", (ctypes.c_byte * n,), _handle_methods("BufferHandle"))


_EMPTY = (ctypes.c_byte * 1)()


def _buffer_handle(owner, ptr, n):
    h = _handle_class(n).from_address(ptr if n else ctypes.addressof(_EMPTY))
    h._owner, h._addr, h._n = owner, ptr, n
    return h


def _addr_of(value):
    """(address, nbytes, keepalive) of a contiguous buffer-protocol object."""
    try:
        mv = memoryview(value)
    except TypeError:
        raise TypeError("value must support the buffer protocol (bytes, bytearray, memoryview, ...), not %s"
                        % type(value).__name__) from None
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())  # Mooncake copies such a buffer too
    n = mv.nbytes
    if n == 0:
        return 0, 0, mv
    if mv.readonly:
        # ctypes cannot take the address of a read-only buffer directly;
        # numpy can, without a copy.
        import numpy as np

        arr = np.frombuffer(mv.cast("B"), dtype=np.uint8)
        return arr.ctypes.data, n, (mv, arr)
    c = (ctypes.c_char * n).from_buffer(mv.cast("B"))
    return ctypes.addressof(c), n, (mv, c)


# ---- Mooncake's tensor metadata (the [header][data] layout of *_tensor_into/from)
#
# 304 bytes, little-endian: magic "NOOM" (u32 0x4D4F4F4E), u16 version 1,
# u16 header size 304, i32 dtype, i32 ndim, i64 0, i64 data offset (304),
# i64 data bytes, i64 shape[8] (-1 past ndim), i64 shape[8] again, and 17
# zero i64 words (Mooncake's parallelism fields; no split here).  Observed
# from mooncake-transfer-engine 0.3.13.post1 (tests/python/test_mooncake.py
# checks both directions against it).

_MAGIC = 0x4D4F4F4E
_HDR = 304
_HDR_HEAD = struct.Struct("<IHHiiqqq")  # 40 bytes
_MAX_DIMS = 8

# Mooncake dtype number -> ecstore dtype code.
_MC_DTYPES = {
    0: _lib.DTYPE_F32, 1: _lib.DTYPE_F64, 2: _lib.DTYPE_I8, 3: _lib.DTYPE_U8, 4: _lib.DTYPE_I16,
    5: _lib.DTYPE_U16, 6: _lib.DTYPE_I32, 7: _lib.DTYPE_U32, 8: _lib.DTYPE_I64, 9: _lib.DTYPE_U64,
    10: _lib.DTYPE_BOOL, 11: _lib.DTYPE_F16, 12: _lib.DTYPE_BF16, 13: _lib.DTYPE_F8E4M3,
    14: _lib.DTYPE_F8E5M2,
}
_ECS_TO_MC = {v: k for k, v in _MC_DTYPES.items()}

# The torch dtypes Mooncake's put_tensor takes (others: INVALID_PARAMS).
_TORCH_NAMES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "uint16", "int32",
                "uint32", "int64", "uint64", "bool", "float8_e4m3fn", "float8_e5m2")


def _encode_header(code, shape, nbytes):
    dims = list(shape) + [-1] * (_MAX_DIMS - len(shape))
    out = bytearray(_HDR)
    _HDR_HEAD.pack_into(out, 0, _MAGIC, 1, _HDR, _ECS_TO_MC[code], len(shape), 0, _HDR, nbytes)
    struct.pack_into("<8q", out, 40, *dims)
    struct.pack_into("<8q", out, 104, *dims)
    return bytes(out)


def _decode_header(ptr, size):
    """(ecstore dtype code, shape, data bytes) of a [header][data] buffer of
    size bytes, every field checked against size; raises ValueError."""
    if size < _HDR:
        raise ValueError("buffer of %d bytes is smaller than the %d-byte tensor metadata" % (size, _HDR))
    raw = ctypes.string_at(ptr, _HDR)
    magic, version, hsize, mdt, ndim, _, off, nbytes = _HDR_HEAD.unpack_from(raw, 0)
    if magic != _MAGIC or version != 1 or hsize != _HDR or off != _HDR:
        raise ValueError("not Mooncake tensor metadata (magic %#x version %d size %d offset %d)"
                         % (magic, version, hsize, off))
    if mdt not in _MC_DTYPES:
        raise ValueError("unknown Mooncake dtype %d" % mdt)
    if not 0 <= ndim <= _MAX_DIMS:
        raise ValueError("ndim %d out of 0..%d" % (ndim, _MAX_DIMS))
    # The second shape is the tensor's own (the first, for a part of a
    # tensor-parallel split, is the whole tensor's; otherwise they agree).
    shape = struct.unpack_from("<8q", raw, 104)[:ndim]
    if any(d < 0 for d in shape):
        raise ValueError("negative dimension in %r" % (shape,))
    code = _MC_DTYPES[mdt]
    want = _t.dtype_size(code)
    for d in shape:
        want *= d
    if nbytes != want or nbytes > size - _HDR or nbytes != size - _HDR:
        raise ValueError("metadata says %d data bytes, shape %r needs %d, the buffer holds %d"
                         % (nbytes, shape, want, size - _HDR))
    return code, tuple(shape), nbytes


def _torch_view(ptr, code, shape, nbytes):
    """A torch tensor over nbytes at ptr (not owned: the caller's buffer)."""
    import numpy as np
    import torch

    if nbytes == 0:
        return torch.empty(shape, dtype=_t.torch_dtype(code))
    arr = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))
    return torch.from_numpy(arr).view(_t.torch_dtype(code)).view(shape)


# ---- Redis, for remove_all ------------------------------------------------------


_REDIS_MAX_ELEMENTS = 1 << 20  # one reply's elements (ECS_RDS_MAX_ELEMENTS)
_REDIS_MAX_STRING = 1 << 20  # one string: keys and cursors (ECS_RDS_MAX_STRING_SMALL)
_REDIS_MAX_KEYS = 1 << 24  # keys one listing gathers


class RedisReplyError(ConnectionError):
    """An error reply (-ERR ...): the connection stays in step."""


class _Resp:
    """One Redis connection speaking RESP over a plain socket."""

    def __init__(self, host, port, timeout):
        self.host, self.port = host, port
        self.sock = socket.create_connection((host or "127.0.0.1", port), timeout=timeout)
        self.f = self.sock.makefile("rb")

    def close(self):
        self.f.close()
        self.sock.close()

    @staticmethod
    def _encode(args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def cmd(self, *args):
        self.sock.sendall(self._encode(args))
        return self.read()

    def pipeline(self, cmds):
        """Sends every command in one write, then reads one reply each: one
        round trip.  An error reply is returned as a RedisReplyError in its
        slot; anything else that goes wrong raises (drop the connection)."""
        self.sock.sendall(b"".join(self._encode(c) for c in cmds))
        out = []
        for _ in cmds:
            try:
                out.append(self.read())
            except RedisReplyError as e:
                out.append(e)
        return out

    def read(self, depth=0, budget=None):
        # Every length is bounded before it is believed, as the C link
        # does (store/redis/rds.h, "Bounds"): a hostile Redis announcing a 1 GB
        # string or 300M elements is refused at the header.
        budget = budget if budget is not None else [_REDIS_MAX_ELEMENTS]
        line = self.f.readline(_REDIS_MAX_STRING + 3)
        if not line.endswith(b"\r\n"):
            if len(line) > _REDIS_MAX_STRING:
                raise ConnectionError("Redis reply too large (a line of more than %d bytes)" % _REDIS_MAX_STRING)
            raise ConnectionError("Redis closed the connection")
        t, body = line[:1], line[1:-2]
        if t == b"-":
            raise RedisReplyError(body.decode(errors="replace"))
        if t in (b"+", b":"):
            return body
        if t == b"$":
            n = int(body)
            if n < 0:
                return None
            if n > _REDIS_MAX_STRING:
                raise ConnectionError("Redis reply too large (%d-byte string, limit %d)" % (n, _REDIS_MAX_STRING))
            data = self.f.read(n + 2)
            if len(data) != n + 2:
                raise ConnectionError("Redis closed the connection")
            return data[:-2]
        if t == b"*":
            n = int(body)
            if n < 0:
                return None
            if n > budget[0]:
                raise ConnectionError("Redis reply too large (%d elements, limit %d)" % (n, _REDIS_MAX_ELEMENTS))
            if depth >= 7:
                raise ConnectionError("Redis reply nested deeper than 7")
            budget[0] -= n
            return [self.read(depth + 1, budget) for _ in range(n)]
        raise ConnectionError("unexpected Redis reply %r" % line[:40])


def _hostport(s):
    host, _, port = s.rpartition(":")
    if not host:
        host, port = s, ""
    return host.strip("[]"), int(port or 6379)


def _sentinel_master(sentinels, name, timeout, suser="", spass=""):
    """The master's address from the first sentinel that knows it (as
    store/redis/rds.c: SENTINEL get-master-addr-by-name, in the order listed),
    after AUTH [suser] spass when the sentinels have a password."""
    why, auth_failed = [], False
    for hp in sentinels.split(","):
        host, port = _hostport(hp)
        try:
            r = _Resp(host, port, timeout)
            try:
                if spass:
                    try:
                        r.cmd("AUTH", *((suser, spass) if suser else (spass,)))
                    except ConnectionError as e:  # the sentinel's words, never the password
                        auth_failed = True
                        why.append("sentinel %s:%d: authentication failed: %s" % (host, port, e))
                        continue
                try:
                    rep = r.cmd("SENTINEL", "get-master-addr-by-name", name)
                except ConnectionError as e:
                    if not str(e).startswith("NOAUTH"):
                        raise
                    auth_failed = True
                    why.append("sentinel %s:%d: %s (this sentinel requires a password: "
                               "ECSTORE_SENTINEL_PASSWORD or the URL's sentinel_password)" % (host, port, e))
                    continue
            finally:
                r.close()
            if isinstance(rep, list) and len(rep) == 2 and all(isinstance(x, bytes) for x in rep):
                return rep[0].decode(), int(rep[1])
            why.append("sentinel %s:%d: unknown master" % (host, port))
        except (OSError, ValueError, ConnectionError) as e:
            why.append("sentinel %s:%d: %s" % (host, port, e))
    if auth_failed:
        raise PermissionError("redis-sentinel: authentication to the sentinels failed (master '%s'): %s"
                              % (name, "; ".join(why)))
    raise ConnectionError("redis-sentinel: no sentinel knows master '%s': %s" % (name, "; ".join(why)))


def _first_seed(seeds, timeout):
    """The first of a redis-cluster:// URL's seeds that accepts a
    connection, in the order listed (as store/redis/rds.c)."""
    why = []
    for host, port in seeds:
        try:
            _Resp(host, port, timeout).close()
            return host, port
        except OSError as e:
            why.append("%s:%d: %s" % (host, port, e))
    raise ConnectionError("redis-cluster: no seed node answered: %s" % "; ".join(why))


def _sentinel_query(rest):
    """(rest without its query, sentinel user, sentinel password) of a
    redis-sentinel:// URL's remainder: the query after the last '?' when
    it holds only sentinel_user / sentinel_password (as store/redis/rds.c)."""
    head, sep, query = rest.rpartition("?")
    if not sep:
        return rest, "", ""
    got = {}
    for part in query.split("&"):
        k, eq, v = part.partition("=")
        if not eq or not v or k not in ("sentinel_user", "sentinel_password"):
            return rest, "", ""  # no query: a '?' of the master's password
        got[k] = urllib.parse.unquote(v)
    return head, got.get("sentinel_user", ""), got.get("sentinel_password", "")


def redis_endpoint(url, timeout):
    """(host, port, user, password, db) of the Redis a URL names, as the C
    link resolves it (store/redis/rds.h): redis://, redis-sentinel:// (the
    sentinels are asked for the master, with the sentinels' own password:
    the URL's sentinel_password, else ECSTORE_SENTINEL_PASSWORD; never the
    master's) and redis-cluster:// (the first seed that answers).  The
    password: USER:PASS@ or :PASS@ in the URL (%XX-escaped), else
    ECSTORE_REDIS_PASSWORD."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    suser = spass = ""
    if scheme == "redis-sentinel":
        rest, suser, spass = _sentinel_query(rest)
        spass = spass or os.environ.get("ECSTORE_SENTINEL_PASSWORD", "")
    user = password = ""
    if "@" in rest:
        userinfo, _, rest = rest.rpartition("@")
        user, _, password = userinfo.partition(":")
        user, password = urllib.parse.unquote(user), urllib.parse.unquote(password)
    password = password or os.environ.get("ECSTORE_REDIS_PASSWORD", "")
    db = 0
    if scheme == "redis-sentinel":
        sentinels, _, tail = rest.partition("/")
        name, _, dbs = tail.partition("/")
        db = int(dbs or 0)
        host, port = _sentinel_master(sentinels, name, timeout, suser, spass)
    else:
        if "/" in rest:
            rest, dbs = rest.split("/", 1)
            db = int(dbs or 0)
        if scheme == "redis-cluster" and "," in rest:
            host, port = _first_seed([_hostport(hp) for hp in rest.split(",")], timeout)
        else:
            host, port = _hostport(rest)
    return host, port, user, password, db


def redis_login(host, port, user, password, db, timeout):
    """A _Resp to host:port after AUTH and SELECT."""
    r = _Resp(host, port, timeout)
    try:
        if password:
            try:
                r.cmd("AUTH", *((user, password) if user else (password,)))
            except ConnectionError as e:  # Redis's words, never the password
                raise PermissionError("redis %s:%s: authentication failed: %s" % (host, port, e)) from None
        if db:
            r.cmd("SELECT", db)
    except BaseException:
        r.close()
        raise
    return r


def _redis_scan(url, pattern, timeout):
    """Every key matching pattern (bytes), with SCAN over a plain socket: no
    Redis package is needed for this one call.  The URL and the password
    as redis_endpoint() says; on a Redis Cluster (redis-cluster://, or a
    MOVED reply) the scan goes to the node of the pattern's hash tag (a
    namespace's keys share one slot: docs/redis-ha.md)."""
    host, port, user, password, db = redis_endpoint(url, timeout)
    for _hop in range(4):
        r = redis_login(host, port, user, password, db, timeout)
        try:
            try:  # a key of the pattern's slot: MOVED names the node that scans it
                r.cmd("EXISTS", pattern)
            except ConnectionError as e:
                if not str(e).startswith("MOVED "):
                    raise
                host, port = _hostport(str(e).split()[2])
                continue
            keys, cursor = [], b"0"
            while True:
                reply = r.cmd("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
                if not isinstance(reply, list) or len(reply) != 2 or not isinstance(reply[1], list):
                    raise ConnectionError("unexpected Redis reply to SCAN")
                cursor, batch = reply
                keys.extend(batch)
                if len(keys) > _REDIS_MAX_KEYS:  # a SCAN that never ends
                    raise ConnectionError("Redis SCAN listed more than %d keys" % _REDIS_MAX_KEYS)
                if cursor == b"0":
                    return keys
        finally:
            r.close()
    raise ConnectionError("redis %s:%d: more than 3 cluster redirections" % (host, port))
