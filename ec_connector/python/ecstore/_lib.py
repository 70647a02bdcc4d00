"""Loading libecstore and declaring its C interface for ctypes.

Nothing here is compiled: the shared library built by CMake
(``build/lib/libecstore.so``) is opened with :class:`ctypes.CDLL`, and the
structs of ``include/ecstore/ecstore.h``, ``tensor.h`` and
``ec_connector.h`` are mirrored below.  ``tests/python/abi_check.c`` prints
the C sizes and offsets so that the test suite catches a header that
changed without this file.

Where the library comes from, first match wins:

1. the ``ECSTORE_LIB`` environment variable (a path to the ``.so``);
2. the ``libecstore.so`` shipped inside the package (``pip install
   ./ec_connector/python`` builds it with CMake and puts it next to this
   file; see ``ec_connector/python/setup.py``);
3. ``build/lib/libecstore.so`` of the repository this package sits in
   (``<repo>/ec_connector/python/ecstore/``), for runs from a source tree;
4. the system loader (``libecstore.so.0``, then ``libecstore.so``), for an
   installed library (``cmake --install``).

The GIL: ``ctypes.CDLL`` releases the global interpreter lock around every
foreign call (only ``ctypes.PyDLL`` keeps it), so a thread blocked in a
network call of libecstore never stops the other Python threads.  The test
suite checks this (``test_gil_released_during_io``).
"""

import ctypes
import ctypes.util
import os
import pathlib
import threading

ECS_MAX_DIMS = 8
ECS_MAX_KEY = 256

# Wire values of ecs_dtype_t (include/ecstore/tensor.h): stable.
DTYPE_F32 = 1
DTYPE_F16 = 2
DTYPE_BF16 = 3
DTYPE_F8E4M3 = 4
DTYPE_F8E5M2 = 5
DTYPE_I8 = 6
DTYPE_U8 = 7
DTYPE_I32 = 8
DTYPE_I64 = 9
DTYPE_F64 = 10
DTYPE_I16 = 11
DTYPE_U16 = 12
DTYPE_U32 = 13
DTYPE_U64 = 14
DTYPE_BOOL = 15

c_int_p = ctypes.POINTER(ctypes.c_int)


class TensorDesc(ctypes.Structure):
    """ecs_tensor_desc_t: dtype, ndim and shape[ECS_MAX_DIMS]."""

    _fields_ = [
        ("dtype", ctypes.c_uint8),
        ("ndim", ctypes.c_uint8),
        ("shape", ctypes.c_uint64 * ECS_MAX_DIMS),
    ]


class Key(ctypes.Structure):
    """ecs_key_t.  ``data`` is declared c_char_p so that assigning a bytes
    object keeps it alive for as long as the struct (same ABI as void *)."""

    _fields_ = [("data", ctypes.c_char_p), ("len", ctypes.c_size_t)]


class Tensor(ctypes.Structure):
    """ecs_tensor_t: borrowed bytes plus their description."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_uint64),
        ("desc", TensorDesc),
    ]


class GetBuf(ctypes.Structure):
    """ecs_get_buf_t: destination in, status/size/description out."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("capacity", ctypes.c_uint64),
        ("status", ctypes.c_int),
        ("nbytes", ctypes.c_uint64),
        ("desc", TensorDesc),
    ]


class View(ctypes.Structure):
    """ecs_view_t: a zero-copy view of an object in a server's shared pool."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_uint64),
        ("desc", TensorDesc),
        ("status", ctypes.c_int),
        ("lease_", ctypes.c_uint64),
        ("map_", ctypes.c_void_p),
        ("srv_", ctypes.c_uint32),
    ]


class ClientConfig(ctypes.Structure):
    """ecs_client_config_t."""

    _fields_ = [
        ("servers", ctypes.c_char_p),
        ("redis_url", ctypes.c_char_p),
        ("ns", ctypes.c_char_p),
        ("auth_token", ctypes.c_char_p),
        ("connect_timeout_ms", ctypes.c_int),
        ("timeout_ms", ctypes.c_int),
        ("verify_checksum", ctypes.c_int),
        ("transport", ctypes.c_char_p),
        ("rdma_device", ctypes.c_char_p),
        ("rdma_port", ctypes.c_int),
        ("rdma_gid_index", ctypes.c_int),
        ("compression", ctypes.c_char_p),
        ("shm_read_only", ctypes.c_int),
        ("max_object_size", ctypes.c_uint64),
        ("shm_server_uid", ctypes.c_int),
        ("placement", ctypes.c_char_p),
        ("registry_refresh_ms", ctypes.c_int),
        ("replicas", ctypes.c_int),
    ]


class ServerStat(ctypes.Structure):
    """ecs_server_stat_t."""

    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "pool_size", "bytes_in_use", "bytes_free", "largest_free", "bytes_requested",
            "objects", "puts", "gets", "hits", "misses", "evictions", "removes",
            "connections", "epoch", "redis_ok", "pool_locked",
        )
    ] + [("node_id", ctypes.c_char * 64), ("address", ctypes.c_char * 160)]


class ServerStatExt(ctypes.Structure):
    """ecs_server_stat_ext_t: the STAT counters added after ecs_server_stat_t."""

    _fields_ = [("pool_cuda_registered", ctypes.c_uint64), ("reserved", ctypes.c_uint64 * 15)]


STAT_UNKNOWN = 2**64 - 1  # ECS_STAT_UNKNOWN: a counter an older server does not send


class Holder(ctypes.Structure):
    """ecs_holder_t."""

    _fields_ = [
        ("status", ctypes.c_int),
        ("node_id", ctypes.c_char * 64),
        ("addr", ctypes.c_char * 160),
        ("local", ctypes.c_int),
    ]


# ---- ec_connector.h ----------------------------------------------------

class EcSaveResult(ctypes.Structure):
    """ecs_ec_save_result_t."""

    _fields_ = [("mm_hash", ctypes.c_char * (ECS_MAX_KEY + 1)), ("status", ctypes.c_int)]


class EcLoadItem(ctypes.Structure):
    """ecs_ec_load_item_t (mm_hash as c_char_p keeps the bytes alive)."""

    _fields_ = [
        ("mm_hash", ctypes.c_char_p),
        ("dst", ctypes.c_void_p),
        ("capacity", ctypes.c_uint64),
        ("expected_nbytes", ctypes.c_uint64),
    ]


class EcLoadResult(ctypes.Structure):
    """ecs_ec_load_result_t."""

    _fields_ = [("status", ctypes.c_int), ("nbytes", ctypes.c_uint64), ("desc", TensorDesc)]


class EcStats(ctypes.Structure):
    """ecs_ec_stats_t."""

    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "saves", "saves_stored", "saves_failed", "save_bytes",
            "has_calls", "has_errors",
            "loads", "load_hits", "load_misses", "load_bytes",
            "staging_in_use",
        )
    ]


class PoolOpts(ctypes.Structure):
    """ecs_pool_opts_t (include/ecstore/pool.h)."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("min_block", ctypes.c_size_t),
        ("huge", ctypes.c_int),
        ("lock", ctypes.c_int),
        ("cuda_register", ctypes.c_int),
        ("name", ctypes.c_char_p),
        ("on_populate", ctypes.c_void_p),  # a C callback; left NULL here
        ("populate_ctx", ctypes.c_void_p),
    ]


class PoolStats(ctypes.Structure):
    """ecs_pool_stats_t (include/ecstore/pool.h)."""

    _fields_ = [(n, ctypes.c_uint64) for n in (
        "size", "min_block", "bytes_in_use", "bytes_free", "largest_free", "bytes_requested",
        "bytes_granted", "live_allocs", "alloc_calls", "alloc_failures")] + [
        ("orders", ctypes.c_uint32),
        ("free_count", ctypes.c_uint32 * 48),
        ("locked", ctypes.c_int),
        ("hugepages", ctypes.c_int),
        ("cuda_registered", ctypes.c_int),
    ]


# The structs the ABI check compares with the C compiler's view.
ABI_STRUCTS = {
    "ecs_tensor_desc_t": TensorDesc,
    "ecs_key_t": Key,
    "ecs_tensor_t": Tensor,
    "ecs_get_buf_t": GetBuf,
    "ecs_view_t": View,
    "ecs_client_config_t": ClientConfig,
    "ecs_server_stat_t": ServerStat,
    "ecs_server_stat_ext_t": ServerStatExt,
    "ecs_holder_t": Holder,
    "ecs_ec_save_result_t": EcSaveResult,
    "ecs_ec_load_item_t": EcLoadItem,
    "ecs_ec_load_result_t": EcLoadResult,
    "ecs_ec_stats_t": EcStats,
    "ecs_pool_opts_t": PoolOpts,
    "ecs_pool_stats_t": PoolStats,
}

_P = ctypes.c_void_p
_S = ctypes.c_size_t

# name: (restype, argtypes).  Every symbol of the store client is required;
# the connector's are bound when present (see has_connector()).
_CLIENT_PROTOS = {
    "ecs_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "ecs_err_name": (ctypes.c_char_p, [ctypes.c_int]),
    "ecs_dtype_size": (_S, [ctypes.c_int]),
    "ecs_dtype_name": (ctypes.c_char_p, [ctypes.c_int]),
    "ecs_dtype_parse": (ctypes.c_int, [ctypes.c_char_p, c_int_p]),
    "ecs_client_config_init": (None, [ctypes.POINTER(ClientConfig)]),
    "ecs_client_connect": (ctypes.c_int, [ctypes.POINTER(ClientConfig), ctypes.POINTER(_P), ctypes.c_char_p, _S]),
    "ecs_client_close": (None, [_P]),
    "ecs_client_errmsg": (ctypes.c_char_p, [_P]),
    "ecs_put_batch": (ctypes.c_int, [_P, ctypes.POINTER(Key), ctypes.POINTER(Tensor), _S, c_int_p]),
    "ecs_get_batch": (ctypes.c_int, [_P, ctypes.POINTER(Key), ctypes.POINTER(GetBuf), _S]),
    "ecs_get_batch_alloc": (ctypes.c_int, [_P, ctypes.POINTER(Key), ctypes.POINTER(GetBuf), _S]),
    "ecs_free": (None, [_P]),
    "ecs_exists_batch": (ctypes.c_int, [_P, ctypes.POINTER(Key), _S, c_int_p]),
    "ecs_remove_batch": (ctypes.c_int, [_P, ctypes.POINTER(Key), _S, c_int_p]),
    "ecs_client_server_count": (_S, [_P]),
    "ecs_stat": (ctypes.c_int, [_P, _S, ctypes.POINTER(ServerStat)]),
    "ecs_ping": (ctypes.c_int, [_P]),
}

# Newer than the first client: bound when the library has them.
_OPTIONAL_PROTOS = {
    "ecs_client_transport": (ctypes.c_char_p, [_P]),
    "ecs_register_buffer": (ctypes.c_int, [_P, ctypes.c_void_p, _S]),
    "ecs_unregister_buffer": (ctypes.c_int, [_P, ctypes.c_void_p]),
    "ecs_upsert_batch": (ctypes.c_int, [_P, ctypes.POINTER(Key), ctypes.POINTER(Tensor), _S, c_int_p]),
    "ecs_client_put_copies": (None, [_P, ctypes.POINTER(_S), ctypes.POINTER(_S)]),
    "ecs_client_set_soft_pin": (ctypes.c_int, [_P, ctypes.c_int]),
    "ecs_client_set_pin": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_uint64]),
    "ecs_get_view_batch": (ctypes.c_int, [_P, ctypes.POINTER(Key), ctypes.POINTER(View), _S]),
    "ecs_view_release": (ctypes.c_int, [_P, ctypes.POINTER(View), _S]),
    "ecs_dlbox_new": (ctypes.c_int, [ctypes.POINTER(_P)]),
    "ecs_dlbox_wrap": (ctypes.c_int, [_P, ctypes.POINTER(View), _S, ctypes.c_uint64, ctypes.POINTER(_P)]),
    "ecs_dlbox_drain": (_S, [_P, ctypes.POINTER(ctypes.c_uint64), _S]),
    "ecs_dlbox_close": (None, [_P]),
    "ecs_stat_ext": (ctypes.c_int, [_P, _S, ctypes.POINTER(ServerStat), ctypes.POINTER(ServerStatExt)]),
    "ecs_locate_batch": (ctypes.c_int, [_P, ctypes.POINTER(Key), _S, ctypes.POINTER(Holder)]),
    "ecs_pull_batch": (ctypes.c_int, [_P, _S, ctypes.POINTER(Key), ctypes.POINTER(ctypes.c_char_p), _S, c_int_p]),
    # the pinned pool (include/ecstore/pool.h), for ecstore.pinned
    "ecs_pool_opts_init": (None, [ctypes.POINTER(PoolOpts)]),
    "ecs_pool_create": (ctypes.c_int, [ctypes.POINTER(PoolOpts), ctypes.POINTER(_P)]),
    "ecs_pool_destroy": (None, [_P]),
    "ecs_pool_alloc": (ctypes.c_int, [_P, _S, ctypes.POINTER(ctypes.c_uint64)]),
    "ecs_pool_free": (ctypes.c_int, [_P, ctypes.c_uint64, _S]),
    "ecs_pool_ptr": (ctypes.c_void_p, [_P, ctypes.c_uint64]),
    "ecs_pool_stats": (None, [_P, ctypes.POINTER(PoolStats)]),
}

_CONNECTOR_PROTOS = {
    "ecs_ec_open_json": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(_P), ctypes.c_char_p, _S]),
    "ecs_ec_close": (None, [_P]),
    "ecs_ec_describe": (ctypes.c_char_p, [_P]),
    "ecs_ec_save": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(Tensor)]),
    "ecs_ec_wait_for_save": (ctypes.c_int, [_P, ctypes.c_int, ctypes.POINTER(EcSaveResult), _S, ctypes.POINTER(_S)]),
    "ecs_ec_save_pending": (_S, [_P]),
    "ecs_ec_has": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_char_p), _S, c_int_p]),
    "ecs_ec_start_load": (ctypes.c_int, [_P, ctypes.POINTER(EcLoadItem), _S, ctypes.POINTER(_P)]),
    "ecs_ec_wait_for_load": (ctypes.c_int, [_P, ctypes.c_int, ctypes.POINTER(EcLoadResult)]),
    "ecs_ec_poll_load": (ctypes.c_int, [_P, ctypes.POINTER(EcLoadResult)]),
    "ecs_ec_load_size": (_S, [_P]),
    "ecs_ec_load_release": (None, [_P]),
    "ecs_ec_stats": (None, [_P, ctypes.POINTER(EcStats)]),
}

_lock = threading.Lock()
_lib = None
_lib_path = None


def _candidates():
    env = os.environ.get("ECSTORE_LIB")
    if env:
        # An explicit choice is the only candidate: falling back to another
        # library would hide a typo.
        return [env]
    out = []
    shipped = pathlib.Path(__file__).resolve().parent / "libecstore.so"
    if shipped.exists():
        out.append(str(shipped))
    repo = pathlib.Path(__file__).resolve().parents[3]
    local = repo / "build" / "lib" / "libecstore.so"
    if local.exists():
        out.append(str(local))
    out.append("libecstore.so.0")
    found = ctypes.util.find_library("ecstore")
    if found:
        out.append(found)
    out.append("libecstore.so")
    return out


def _bind(lib, protos, required):
    for name, (res, args) in protos.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            if required:
                raise OSError("libecstore at %s lacks %s: a library older than this binding?" % (_lib_path, name))
            continue
        fn.restype = res
        fn.argtypes = args


def lib():
    """The loaded libecstore (a ctypes.CDLL), loading it on first use.

    Raises OSError naming every place tried when no library loads."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        errors = []
        for cand in _candidates():
            try:
                handle = ctypes.CDLL(cand)
            except OSError as e:
                errors.append("%s: %s" % (cand, e))
                continue
            _lib_path = cand
            _bind(handle, _CLIENT_PROTOS, True)
            _bind(handle, _OPTIONAL_PROTOS, False)
            _bind(handle, _CONNECTOR_PROTOS, False)
            _lib = handle
            return _lib
        raise OSError("cannot load libecstore (set ECSTORE_LIB to its path); tried:\n  " + "\n  ".join(errors))


def lib_path():
    """The path or name libecstore was loaded from (loads it if needed)."""
    lib()
    return _lib_path


def has_connector():
    """True when the loaded library carries the C ec_connector."""
    return all(hasattr(lib(), name) for name in _CONNECTOR_PROTOS)
