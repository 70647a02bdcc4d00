"""numpy arrays and torch CPU tensors as ecstore tensors, without copies.

A put passes the C library the array's own data pointer; a get writes into
the array's own memory (a caller's ``out``, a freshly allocated array, or the
buffer libecstore allocated, wrapped in place).  No byte ever passes through
a Python ``bytes`` object.

dtypes (ecstore name: numpy / torch):

=========  ===================  =======================================
ecstore    numpy                torch
=========  ===================  =======================================
f32        float32              float32
f16        float16              float16
bf16       uint16 (raw bits)    bfloat16
f8e4m3     uint8 (raw bits)     float8_e4m3fn when torch has it, else uint8
f8e5m2     uint8 (raw bits)     float8_e5m2 when torch has it, else uint8
i8         int8                 int8
u8         uint8                uint8
i32        int32                int32
i64        int64                int64
f64        float64              float64
i16        int16                int16
u16        uint16               uint16 where torch has it, else int16 bits
u32        uint32               uint32 where torch has it, else int32 bits
u64        uint64               uint64 where torch has it, else int64 bits
bool       bool                 bool
=========  ===================  =======================================

numpy has no bfloat16 and no float8: a numpy get of a bf16 object gives a
``uint16`` array of the raw bits (``torch.from_numpy(a.view('int16'))
.view(torch.bfloat16)`` turns it into a torch bf16 tensor), and a numpy put
of such bits must say ``dtype="bf16"``: a plain uint16 array is stored as
``u16``.  The same holds for the float8 types with uint8 carriers (torch
1.13, Debian 12's, has no float8 either).  Other dtypes (complex, float128,
strings, objects, ...) are refused with EDTYPE.
"""

import ctypes
import sys

from . import _lib
from . import codes
from .errors import make_error

# code -> (numpy dtype name of a numpy result, torch dtype name, torch fallback name)
_TABLE = {
    _lib.DTYPE_F32: ("float32", "float32", None),
    _lib.DTYPE_F16: ("float16", "float16", None),
    _lib.DTYPE_BF16: ("uint16", "bfloat16", None),
    _lib.DTYPE_F8E4M3: ("uint8", "float8_e4m3fn", "uint8"),
    _lib.DTYPE_F8E5M2: ("uint8", "float8_e5m2", "uint8"),
    _lib.DTYPE_I8: ("int8", "int8", None),
    _lib.DTYPE_U8: ("uint8", "uint8", None),
    _lib.DTYPE_I32: ("int32", "int32", None),
    _lib.DTYPE_I64: ("int64", "int64", None),
    _lib.DTYPE_F64: ("float64", "float64", None),
    _lib.DTYPE_I16: ("int16", "int16", None),
    _lib.DTYPE_U16: ("uint16", "uint16", "int16"),
    _lib.DTYPE_U32: ("uint32", "uint32", "int32"),
    _lib.DTYPE_U64: ("uint64", "uint64", "int64"),
    _lib.DTYPE_BOOL: ("bool", "bool", None),
}

# A get into torch goes through numpy; torch.from_numpy knows no uint16 (nor
# uint32/uint64 before torch 2.3): those travel as the signed type of the same
# size and are viewed as the stored dtype afterwards.
_TORCH_CARRIER = {_lib.DTYPE_BF16: "int16", _lib.DTYPE_U16: "int16", _lib.DTYPE_U32: "int32",
                  _lib.DTYPE_U64: "int64"}

# numpy dtype name -> code, for arrays put without an explicit dtype.
_NUMPY_IN = {"float32": _lib.DTYPE_F32, "float16": _lib.DTYPE_F16, "int8": _lib.DTYPE_I8,
             "uint8": _lib.DTYPE_U8, "int32": _lib.DTYPE_I32, "int64": _lib.DTYPE_I64,
             "float64": _lib.DTYPE_F64, "int16": _lib.DTYPE_I16, "uint16": _lib.DTYPE_U16,
             "uint32": _lib.DTYPE_U32, "uint64": _lib.DTYPE_U64, "bool": _lib.DTYPE_BOOL}

# torch dtype name -> code, for tensors put without an explicit dtype.
_TORCH_IN = {"float32": _lib.DTYPE_F32, "float16": _lib.DTYPE_F16, "bfloat16": _lib.DTYPE_BF16,
             "float8_e4m3fn": _lib.DTYPE_F8E4M3, "float8_e5m2": _lib.DTYPE_F8E5M2, "int8": _lib.DTYPE_I8,
             "uint8": _lib.DTYPE_U8, "int32": _lib.DTYPE_I32, "int64": _lib.DTYPE_I64,
             "float64": _lib.DTYPE_F64, "int16": _lib.DTYPE_I16, "uint16": _lib.DTYPE_U16,
             "uint32": _lib.DTYPE_U32, "uint64": _lib.DTYPE_U64, "bool": _lib.DTYPE_BOOL}


def _err(code, detail):
    return make_error(code, detail)


def dtype_name(code):
    """The ecstore name of a dtype code ("bf16", ...)."""
    return _lib.lib().ecs_dtype_name(int(code)).decode()


def dtype_size(code):
    """Bytes per element of a dtype code (ecs_dtype_size; 0 if unknown)."""
    return _lib.lib().ecs_dtype_size(int(code))


def parse_dtype(dtype):
    """A dtype code from an int code, a name ecs_dtype_parse takes ("bf16",
    "bfloat16", "f8e4m3", "float8_e4m3fn", ...), or a numpy/torch dtype;
    raises InvalidArgumentError (EDTYPE)."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        if dtype_size(dtype) == 0:
            raise _err(codes.EDTYPE, "unknown dtype code %d" % dtype)
        return dtype
    name = dtype if isinstance(dtype, str) else str(dtype).replace("torch.", "")
    out = ctypes.c_int(0)
    rc = _lib.lib().ecs_dtype_parse(name.encode(), ctypes.byref(out))
    if rc != 0:
        raise _err(rc, "unknown dtype %r" % (dtype,))
    return out.value


def _torch():
    # Never imports torch: a tensor can only exist when torch is loaded.
    return sys.modules.get("torch")


def is_torch(obj):
    t = _torch()
    return t is not None and isinstance(obj, t.Tensor)


def torch_dtype(code):
    """The torch dtype a get of an object of dtype code returns."""
    import torch

    _, name, fallback = _TABLE[code]
    dt = getattr(torch, name, None)
    return dt if dt is not None else getattr(torch, fallback)


def numpy_dtype(code):
    import numpy as np

    return np.dtype(_TABLE[code][0])


def describe(obj, dtype=None):
    """(data pointer, nbytes, dtype code, shape) of a contiguous numpy array
    or torch CPU tensor, for a put.  dtype overrides the element type when
    its size matches (e.g. "bf16" for a uint16 array of bf16 bits)."""
    if is_torch(obj):
        if obj.device.type != "cpu":
            raise _err(codes.EINVAL, "tensor on %s: only CPU tensors (pinned or not) can be put" % obj.device)
        if not obj.is_contiguous():
            raise _err(codes.EINVAL, "tensor is not contiguous: call .contiguous() first (no hidden copies)")
        itemsize = obj.element_size()
        name = str(obj.dtype).replace("torch.", "")
        natural = _TORCH_IN.get(name)
        ptr, nbytes, shape = obj.data_ptr(), obj.numel() * itemsize, tuple(obj.shape)
    else:
        try:
            import numpy as np
        except ImportError:  # pragma: no cover - numpy is required for tensors
            raise TypeError("put_tensor needs numpy arrays or torch tensors (numpy is not installed)")
        if not isinstance(obj, np.ndarray):
            raise TypeError("expected a numpy array or a torch tensor, got %s" % type(obj).__name__)
        if not obj.flags.c_contiguous:
            raise _err(codes.EINVAL, "array is not C-contiguous: use numpy.ascontiguousarray() first (no hidden copies)")
        if not obj.dtype.isnative:
            raise _err(codes.EDTYPE, "array has non-native byte order %s" % obj.dtype.str)
        itemsize = obj.dtype.itemsize
        name = obj.dtype.name
        natural = _NUMPY_IN.get(name)
        ptr, nbytes, shape = obj.ctypes.data, obj.nbytes, obj.shape
    if dtype is not None:
        code = parse_dtype(dtype)
        if dtype_size(code) != itemsize:
            raise _err(codes.EDTYPE, "dtype %s has %d-byte elements but the %s has %d-byte %s elements"
                       % (dtype_name(code), dtype_size(code), "tensor" if is_torch(obj) else "array", itemsize, name))
    elif natural is None:
        raise _err(codes.EDTYPE, "%s has no ecstore dtype; supported: f32 f16 bf16 f8e4m3 f8e5m2 i8 u8 i32 i64 "
                   "f64 i16 u16 u32 u64 bool" % name)
    else:
        code = natural
    if len(shape) > _lib.ECS_MAX_DIMS:
        raise _err(codes.EDTYPE, "%d dimensions; at most %d" % (len(shape), _lib.ECS_MAX_DIMS))
    return ptr, nbytes, code, shape


def describe_out(out):
    """(data pointer, capacity in bytes) of a destination for a get; it must
    be contiguous, writable, and on the CPU."""
    if is_torch(out):
        if out.device.type != "cpu":
            raise _err(codes.EINVAL, "out tensor on %s: only CPU tensors" % out.device)
        if not out.is_contiguous():
            raise _err(codes.EINVAL, "out tensor is not contiguous")
        return out.data_ptr(), out.numel() * out.element_size()
    import numpy as np

    if not isinstance(out, np.ndarray):
        raise TypeError("out must be a numpy array or a torch tensor, got %s" % type(out).__name__)
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise _err(codes.EINVAL, "out array must be C-contiguous and writable")
    return out.ctypes.data, out.nbytes


def view_out(out, code, shape):
    """out's first bytes as the stored tensor: a view (no copy) of dtype code
    and the stored shape.  Raises InvalidArgumentError (EDTYPE) when out's
    dtype is not the one a get of that object returns (see the table)."""
    if is_torch(out):
        want = torch_dtype(code)
        have = out.dtype
    else:
        want = numpy_dtype(code)
        have = out.dtype
    if have != want:
        raise _err(codes.EDTYPE, "object is %s %s but out is %s (want %s)"
                   % (dtype_name(code), list(shape), have, want))
    count = 1
    for d in shape:
        count *= d
    flat = out.reshape(-1)[:count]
    return flat.view(tuple(shape)) if is_torch(out) else flat.reshape(tuple(shape))


def alloc(framework, code, shape, pin_memory=False):
    """An uninitialised array/tensor for an object of dtype code and shape."""
    if framework == "torch":
        import torch

        return torch.empty(tuple(shape), dtype=torch_dtype(code), pin_memory=pin_memory)
    if pin_memory:
        raise _err(codes.EINVAL, "pin_memory needs framework='torch'")
    import numpy as np

    return np.empty(tuple(shape), dtype=numpy_dtype(code))


class _ViewBuffer:
    """Bytes of a pinned view, exposed to numpy; keeps its owner alive."""

    __slots__ = ("owner", "__array_interface__")

    def __init__(self, ptr, nbytes, owner):
        self.owner = owner
        self.__array_interface__ = {"data": (ptr, False), "shape": (int(nbytes),), "typestr": "|u1", "version": 3}


def wrap_view(ptr, nbytes, owner):
    """A torch uint8 tensor over [ptr, ptr + nbytes) that keeps owner alive
    (no copy)."""
    import numpy as np
    import torch

    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.from_numpy(np.asarray(_ViewBuffer(ptr, nbytes, owner)))


class _CBuffer:
    """A block malloc'd by ecs_get_batch_alloc, exposed to numpy through the
    array interface; numpy keeps it as the array's base, so the block is
    freed (ecs_free) when the last array or tensor using it goes away."""

    __slots__ = ("ptr", "_free", "__array_interface__")

    def __init__(self, ptr, typestr, shape):
        self.ptr = ptr
        self._free = _lib.lib().ecs_free  # bound now: at exit module globals may be gone
        self.__array_interface__ = {"data": (ptr, False), "shape": tuple(shape), "typestr": typestr, "version": 3}

    def __del__(self):
        if self.ptr:
            self._free(self.ptr)
            self.ptr = None


def wrap_c_buffer(ptr, code, shape, framework):
    """Takes ownership of a malloc'd block holding one object and returns it
    as a numpy array or torch tensor of the stored dtype and shape (no copy)."""
    import numpy as np

    if framework == "torch":
        import torch

        tdt = torch_dtype(code)
        carrier = np.dtype(_TORCH_CARRIER[code]) if code in _TORCH_CARRIER else numpy_dtype(code)
        arr = np.asarray(_CBuffer(ptr, carrier.str, shape))
        t = torch.from_numpy(arr)
        return t if t.dtype == tdt else t.view(tdt)
    return np.asarray(_CBuffer(ptr, numpy_dtype(code).str, shape))


def check_framework(framework):
    if framework not in ("numpy", "torch"):
        raise _err(codes.EINVAL, "framework must be 'numpy' or 'torch', not %r" % (framework,))




# ---------------------------------------------------------------------------
# views as DLPack tensors (ecs_dlbox_*)

# The capsule keeps a pointer to its name: a module constant lives as long.
_DL_NAME = b"dltensor"
# PyCapsule_New called with the GIL held (a PyDLL prototype, not ctypes.pythonapi's
# shared attribute, which other code may have declared differently).
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                                 ctypes.c_void_p)(("PyCapsule_New", ctypes.pythonapi))


class _DLTensor(ctypes.Structure):
    """DLPack's DLTensor (unversioned ABI), for the deleter's offset below."""

    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64)]


class _DLManaged(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_DL_DELETER_OFF = _DLManaged.deleter.offset
_dl_deleter_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _dl_delete(ptr):
    """Runs a DLManagedTensor's own deleter (one torch never took)."""
    _dl_deleter_t(ctypes.c_void_p.from_address(ptr + _DL_DELETER_OFF).value)(ptr)


def _from_dlpack():
    import torch

    return getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack


class DLBox:
    """Torch tensors over pinned views that report when they died.

    ``tensors(views, first_token)`` gives item i's bytes as a torch CPU
    tensor of the stored dtype and shape (no copy), made by libecstore as a
    DLPack tensor and imported with torch's from_dlpack: ~1 us an item,
    where numpy's array interface took ~15.  When the last tensor over an
    item's bytes dies (the tensor itself and every slice or view of it:
    they share one storage), torch calls the item's deleter, which queues
    its token, ``first_token + i``, in the box; ``drain()`` returns the
    queued tokens, and the owner releases those views.  Until its token
    came back an item must stay pinned.  Tokens are the owner's to choose;
    the box is the owner's thread's (the deleters may run on any thread).
    ``close()`` drops the queue; the C box goes with its last tensor."""

    def __init__(self):
        lib = _lib.lib()
        if getattr(lib, "ecs_dlbox_new", None) is None:
            raise _err(codes.ENOTSUP, "%s has no ecs_dlbox_new" % _lib.lib_path())
        p = ctypes.c_void_p()
        rc = lib.ecs_dlbox_new(ctypes.byref(p))
        if rc:
            raise _err(rc, "ecs_dlbox_new")
        self._lib = lib
        self._p = p.value
        self._buf = (ctypes.c_uint64 * 256)()
        self._close = lib.ecs_dlbox_close  # bound now: at exit module globals may be gone
        self._from = _from_dlpack()

    def tensors(self, views, first_token):
        """One entry per item of views (a store.Views): a tensor, or None
        where libecstore made none (the item's status is not 0, or its
        description does not cover its bytes: the item is still pinned,
        no token will come for it) or torch refused it (its token comes
        at the next drain)."""
        n = views.n
        if n == 0:
            return []
        out = (ctypes.c_void_p * n)()
        rc = self._lib.ecs_dlbox_wrap(self._p, views._v, n, first_token, out)
        if rc:
            raise _err(rc, "ecs_dlbox_wrap")
        res = []
        new, name, take = _capsule_new, _DL_NAME, self._from
        for ptr in out:
            if ptr is None:
                res.append(None)
                continue
            cap = new(ptr, name, None)
            try:
                res.append(take(cap))
            except Exception:  # noqa: BLE001 - a dtype torch lacks: this item is not viewed
                if _capsule_name(cap) == name:  # not taken: its deleter is still ours to run
                    _dl_delete(ptr)
                res.append(None)
            del cap
        return res

    def drain(self):
        """The tokens of items whose tensors all died since the last call."""
        got = []
        buf, cap = self._buf, len(self._buf)
        while self._p:
            k = self._lib.ecs_dlbox_drain(self._p, buf, cap)
            got.extend(buf[:k])
            if k < cap:
                break
        return got

    def close(self):
        """Drops the queue; later deaths queue nothing.  Idempotent."""
        p, self._p = self._p, None
        if p:
            self._close(p)

    def __del__(self):
        self.close()


_capsule_get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))


def _capsule_name(cap):
    return _capsule_get_name(cap)
