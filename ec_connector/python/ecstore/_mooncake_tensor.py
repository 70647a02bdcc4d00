"""The tensor calls of ecstore.mooncake.MooncakeDistributedStore (a mixin
of the store class): put_tensor / get_tensor and their batch, upsert,
*_into and *_from forms, and the tensor-parallel *_with_tp forms.

A tensor is stored as an ecstore tensor (its dtype and shape in the
object's description, the bytes as they are, no copy), so ecstore's own
get_tensor and connector read it.  Through Mooncake's byte calls (get,
get_size, get_into, ...) it reads as Mooncake's [304-byte metadata][data]
(the store class adds the metadata).  One case is stored as those bytes
instead: a one-dimensional uint8 tensor, whose description would be
ecstore's "raw bytes" (u8, one dimension), so that get_tensor can tell a
tensor from plain bytes (None for plain bytes, as Mooncake's).

Tensor parallelism (*_with_tp), as Mooncake's: a put with tp_size N > 1
splits the tensor into N equal contiguous parts along split_dim and stores
part r under "{key}_tp_{r}" (a dimension N does not divide: -600, as
Mooncake's "only uniform sharding"); tp_size 1 (or 0) stores the key
itself.  A get reads "{key}_tp_{tp_rank}" (tp_size 1: the key); a rank
outside 0..tp_size-1 is None.
"""

import ctypes
import logging

from . import _lib
from . import tensors as _t
from ._mooncake_base import (
    INVALID_PARAMS,
    NO_AVAILABLE_HANDLE,
    _ECS_TO_MC,
    _HDR,
    _MAX_DIMS,
    _TORCH_NAMES,
    _decode_header,
    _encode_header,
    _torch_view,
)

log = logging.getLogger("ecstore.mooncake")


def _is_raw_desc(code, shape):
    return code == _lib.DTYPE_U8 and len(shape) == 1


def _shard_key(key, rank, size):
    return key if size <= 1 else "%s_tp_%d" % (key, rank)


class TensorCalls:
    """Mixin: needs the store class's _raw_put, _raw_get, _alloc_get,
    _live, _no_staging and the module's key checks."""

    # ---- puts ------------------------------------------------------------------

    def _describe(self, what, tensor):
        """(tensor kept alive, ptr, nbytes, code, shape) or an error code."""
        import torch

        if not isinstance(tensor, torch.Tensor):
            log.error("%s: not a PyTorch tensor (%s)", what, type(tensor).__name__)
            return INVALID_PARAMS
        name = str(tensor.dtype).replace("torch.", "")
        if name not in _TORCH_NAMES:
            log.error("%s: unsupported tensor dtype %s", what, tensor.dtype)
            return INVALID_PARAMS
        if tensor.dim() > _MAX_DIMS:
            log.error("%s: tensor has more than %d dimensions: %d", what, _MAX_DIMS, tensor.dim())
            return INVALID_PARAMS
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        code = _t.parse_dtype(name)
        nbytes = tensor.numel() * tensor.element_size()
        shape = tuple(tensor.shape)
        if _is_raw_desc(code, shape):  # stored as Mooncake's bytes: see the module doc
            joined = ctypes.create_string_buffer(_HDR + nbytes)
            joined[:_HDR] = _encode_header(code, shape, nbytes)
            if nbytes:
                ctypes.memmove(ctypes.addressof(joined) + _HDR, tensor.data_ptr(), nbytes)
            return joined, ctypes.addressof(joined), _HDR + nbytes, _lib.DTYPE_U8, (_HDR + nbytes,)
        return tensor, tensor.data_ptr(), nbytes, code, shape

    def _put_tensors(self, what, keys, tensors, upsert, config=None):
        from .mooncake import _check_keys

        _check_keys(what, keys)
        n = len(keys)
        if len(tensors) != n:
            log.error("%s: %d keys but %d tensors", what, n, len(tensors))
            return [INVALID_PARAMS] * n
        if self._no_staging(what):
            return [NO_AVAILABLE_HANDLE] * n  # Mooncake's answer without a local buffer
        out = [None] * n
        keep, todo = [], []
        for i, t in enumerate(tensors):
            d = self._describe(what, t)
            if isinstance(d, int):
                out[i] = d
            else:
                keep.append(d)
                todo.append(i)
        st = self._raw_put(what, [keys[i] for i in todo], [d[1] for d in keep], [d[2] for d in keep], config,
                           upsert, descs=[(d[3], d[4]) for d in keep])
        for j, i in enumerate(todo):
            out[i] = st[j]
        return out

    def put_tensor(self, key, tensor):
        """Stores a torch tensor with its dtype and shape.  0 or a code."""
        return self._put_tensors("put_tensor", [key], [tensor], False)[0]

    def upsert_tensor(self, key, tensor):
        return self._put_tensors("upsert_tensor", [key], [tensor], True)[0]

    def batch_put_tensor(self, keys, tensors_list):
        return self._put_tensors("batch_put_tensor", keys, tensors_list, False)

    def batch_upsert_tensor(self, keys, tensors_list):
        return self._put_tensors("batch_upsert_tensor", keys, tensors_list, True)

    # ---- gets ------------------------------------------------------------------

    def get_tensor(self, key):
        """The tensor (CPU, its stored dtype and shape), or None (a miss,
        or a key holding plain bytes)."""
        return self.batch_get_tensor([key])[0]

    def batch_get_tensor(self, keys):
        from .mooncake import _check_keys

        _check_keys("batch_get_tensor", keys)
        if not self._live("batch_get_tensor") or self._no_staging("batch_get_tensor"):
            return [None] * len(keys)
        if not keys:
            return []
        out = []
        for s, owner, ptr, n, desc in self._alloc_get("batch_get_tensor", keys, present=False):
            if s != 0 or desc.dtype not in _ECS_TO_MC:
                out.append(None)
                continue
            shape = tuple(desc.shape[: desc.ndim])
            if _is_raw_desc(desc.dtype, shape):
                out.append(self._bytes_tensor(ptr, n))
            elif owner is not None:
                owner.ptr = 0  # wrap_c_buffer takes the block over
                out.append(_t.wrap_c_buffer(ptr, desc.dtype, shape, "torch"))
            else:
                out.append(_torch_view(0, desc.dtype, shape, 0))
        return out

    @staticmethod
    def _bytes_tensor(ptr, n):
        """A copy of the tensor in n bytes of [metadata][data] at ptr, or
        None when they are not such a buffer (plain bytes)."""
        if not ptr:
            return None
        try:
            code, shape, nbytes = _decode_header(ptr, n)
        except ValueError:
            return None
        return _torch_view(ptr + _HDR, code, shape, nbytes).clone()

    def get_tensor_into(self, key, buffer_ptr, size):
        """Reads a tensor into a caller buffer as [304-byte metadata][data]
        and returns a tensor over the data part (no copy), or None."""
        return self.batch_get_tensor_into([key], [buffer_ptr], [size])[0]

    def batch_get_tensor_into(self, keys, buffer_ptrs, sizes):
        from .mooncake import _check_keys, _check_uints

        _check_keys("batch_get_tensor_into", keys)
        _check_uints("batch_get_tensor_into", buffer_ptrs, sizes)
        n = len(keys)
        if len(buffer_ptrs) != n or len(sizes) != n:
            log.error("batch_get_tensor_into: mismatched list lengths")
            return [None] * n
        ok = [s >= _HDR and p > 0 for p, s in zip(buffer_ptrs, sizes)]
        for i in range(n):
            if not ok[i]:
                log.error("batch_get_tensor_into %r: buffer of %r bytes cannot hold the %d-byte metadata",
                          keys[i], sizes[i], _HDR)
        idx = [i for i in range(n) if ok[i]]
        # The buffer then holds [metadata][data] whatever the object's form
        # (a tensor: the metadata is written in front; Mooncake's bytes: as
        # stored); the metadata is then checked against the bytes read.
        res, _ = self._raw_get("batch_get_tensor_into", [keys[i] for i in idx], [buffer_ptrs[i] for i in idx],
                               [sizes[i] for i in idx])
        out = [None] * n
        for j, i in enumerate(idx):
            if res[j] < 0:
                continue
            try:
                code, shape, nbytes = _decode_header(buffer_ptrs[i], res[j])
            except ValueError as e:
                log.error("batch_get_tensor_into %r: %s", keys[i], e)
                continue
            out[i] = _torch_view(buffer_ptrs[i] + _HDR, code, shape, nbytes)
        return out

    # ---- puts from [metadata][data] buffers ----------------------------------------

    def _tensors_from(self, what, keys, buffer_ptrs, sizes, upsert):
        from .mooncake import _check_keys, _check_uints

        _check_keys(what, keys)
        _check_uints(what, buffer_ptrs, sizes)
        n = len(keys)
        if len(buffer_ptrs) != n or len(sizes) != n:
            log.error("%s: mismatched list lengths", what)
            return [INVALID_PARAMS] * n
        out, todo, items = [None] * n, [], []
        for i in range(n):
            try:
                if buffer_ptrs[i] <= 0:
                    raise ValueError("bad buffer pointer")
                code, shape, nbytes = _decode_header(buffer_ptrs[i], sizes[i])
            except ValueError as e:
                log.error("%s %r: %s", what, keys[i], e)
                out[i] = INVALID_PARAMS
                continue
            todo.append(i)
            if _is_raw_desc(code, shape):  # kept as Mooncake's bytes (module doc)
                items.append((buffer_ptrs[i], sizes[i], _lib.DTYPE_U8, (sizes[i],)))
            else:
                items.append((buffer_ptrs[i] + _HDR, nbytes, code, shape))
        st = self._raw_put(what, [keys[i] for i in todo], [d[0] for d in items], [d[1] for d in items], None,
                           upsert, descs=[(d[2], d[3]) for d in items])
        for j, i in enumerate(todo):
            out[i] = st[j]
        return out

    def put_tensor_from(self, key, buffer_ptr, size):
        """Stores a tensor from a [metadata][data] buffer (the layout
        get_tensor_into writes): the data is stored straight from it."""
        return self._tensors_from("put_tensor_from", [key], [buffer_ptr], [size], False)[0]

    def upsert_tensor_from(self, key, buffer_ptr, size):
        return self._tensors_from("upsert_tensor_from", [key], [buffer_ptr], [size], True)[0]

    def batch_put_tensor_from(self, keys, buffer_ptrs, sizes):
        return self._tensors_from("batch_put_tensor_from", keys, buffer_ptrs, sizes, False)

    def batch_upsert_tensor_from(self, keys, buffer_ptrs, sizes):
        return self._tensors_from("batch_upsert_tensor_from", keys, buffer_ptrs, sizes, True)

    # ---- tensor parallelism (module doc) -------------------------------------------

    def _shards(self, what, tensor, tp_size, split_dim):
        """The tp_size equal parts of tensor along split_dim, or an error code."""
        import torch

        if not isinstance(tensor, torch.Tensor):
            log.error("%s: not a PyTorch tensor (%s)", what, type(tensor).__name__)
            return INVALID_PARAMS
        if tp_size <= 1:
            return [tensor]
        if not -tensor.dim() <= split_dim < tensor.dim():
            log.error("%s: split_dim %d out of range for %d dimensions", what, split_dim, tensor.dim())
            return INVALID_PARAMS
        if tensor.shape[split_dim] % tp_size:
            log.error("%s: dimension %d (%d) does not split into %d equal parts (only uniform sharding)", what,
                      split_dim, tensor.shape[split_dim], tp_size)
            return INVALID_PARAMS
        step = tensor.shape[split_dim] // tp_size
        return [tensor.narrow(split_dim, r * step, step).contiguous() for r in range(tp_size)]

    def _put_tp(self, what, base_keys, tensors, tp_size, split_dim):
        from .mooncake import _check_keys

        _check_keys(what, base_keys)
        n = len(base_keys)
        if len(tensors) != n:
            log.error("%s: %d keys but %d tensors", what, n, len(tensors))
            return [INVALID_PARAMS] * n
        out = [None] * n
        keys, parts, owner = [], [], []
        for i, (k, t) in enumerate(zip(base_keys, tensors)):
            sh = self._shards(what, t, tp_size, split_dim)
            if isinstance(sh, int):
                out[i] = sh
                continue
            for r, part in enumerate(sh):
                keys.append(_shard_key(k, r, tp_size))
                parts.append(part)
                owner.append(i)
        st = self._put_tensors(what, keys, parts, False) if keys else []
        for i, s in zip(owner, st):
            if out[i] is None or (out[i] == 0 and s != 0):
                out[i] = s
        return out

    def put_tensor_with_tp(self, key, tensor, tp_rank=0, tp_size=1, split_dim=0):
        """Stores tensor split into tp_size equal parts along split_dim,
        part r under "{key}_tp_{r}" (tp_size 1: under key).  0 or a code."""
        return self._put_tp("put_tensor_with_tp", [key], [tensor], tp_size, split_dim)[0]

    def batch_put_tensor_with_tp(self, base_keys, tensors_list, tp_rank=0, tp_size=1, split_dim=0):
        return self._put_tp("batch_put_tensor_with_tp", base_keys, tensors_list, tp_size, split_dim)

    def put_tensor_with_tp_from(self, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0):
        """put_tensor_with_tp of the tensor in a [metadata][data] buffer."""
        return self.batch_put_tensor_with_tp_from([key], [buffer_ptr], [size], tp_rank, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp_from(self, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1, split_dim=0):
        from .mooncake import _check_uints

        _check_uints("batch_put_tensor_with_tp_from", buffer_ptrs, sizes)
        tensors = []
        for k, p, z in zip(base_keys, buffer_ptrs, sizes):
            try:
                code, shape, nbytes = _decode_header(p, z) if p else (None, None, None)
            except ValueError as e:
                log.error("batch_put_tensor_with_tp_from %r: %s", k, e)
                code = None
            tensors.append(None if code is None else _torch_view(p + _HDR, code, shape, nbytes))
        if len(buffer_ptrs) != len(base_keys) or len(sizes) != len(base_keys):
            return [INVALID_PARAMS] * len(base_keys)
        return self._put_tp("batch_put_tensor_with_tp_from", base_keys, tensors, tp_size, split_dim)

    def get_tensor_with_tp(self, key, tp_rank=0, tp_size=1, split_dim=0):
        """The part tp_rank of a tensor put with tp_size parts, or None."""
        return self.batch_get_tensor_with_tp([key], tp_rank, tp_size)[0]

    def batch_get_tensor_with_tp(self, base_keys, tp_rank=0, tp_size=1):
        if not 0 <= tp_rank < max(tp_size, 1):
            log.error("batch_get_tensor_with_tp: tp_rank %d outside 0..%d", tp_rank, max(tp_size, 1) - 1)
            return [None] * len(base_keys)
        return self.batch_get_tensor([_shard_key(k, tp_rank, tp_size) for k in base_keys])

    def get_tensor_with_tp_into(self, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0):
        return self.batch_get_tensor_with_tp_into([key], [buffer_ptr], [size], tp_rank, tp_size)[0]

    def batch_get_tensor_with_tp_into(self, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1):
        if not 0 <= tp_rank < max(tp_size, 1):
            log.error("batch_get_tensor_with_tp_into: tp_rank %d outside 0..%d", tp_rank, max(tp_size, 1) - 1)
            return [None] * len(base_keys)
        return self.batch_get_tensor_into([_shard_key(k, tp_rank, tp_size) for k in base_keys], buffer_ptrs, sizes)
