"""Host memory for tensors from ecstore's own pinned pool (libecstore's
``ecs_pool``): one region populated and locked up front (and registered
with CUDA when a GPU is there), carved by the buddy allocator.

Why: a freshly allocated tensor of a few MB costs a page fault per 4 KiB
the first time it is written (hundreds per embedding), and pageable memory
makes host-to-GPU copies slow and synchronous.  A tensor from this pool is
already faulted in and pinned; when the last tensor or view using a block
is garbage collected, the block goes back to the pool.

    pool = HostPool(256 << 20)
    t = pool.tensor(torch.bfloat16, (650, 2048))   # None when the pool is full

Thread safety: every method may be called from any thread (the C pool
locks); a block is freed from whichever thread drops its last reference.
The pool itself is destroyed when the HostPool and every tensor from it are
gone (each block keeps its pool alive).
"""

import ctypes
import threading

from . import _lib
from . import codes
from .errors import check, make_error


class HostPool:
    """A pinned host region handing out torch tensors."""

    def __init__(self, size, cuda_register=False, name="ecstore-host"):
        lib = _lib.lib()
        if getattr(lib, "ecs_pool_create", None) is None:
            raise make_error(codes.ENOTSUP, "%s has no ecs_pool_create" % _lib.lib_path())
        self._lib = lib
        # Room to spare past the struct, as Store does for its config: a
        # header that grew without this binding must not make
        # ecs_pool_opts_init write past our memory (test_abi catches it).
        mem = ctypes.create_string_buffer(ctypes.sizeof(_lib.PoolOpts) + 256)
        opts = _lib.PoolOpts.from_buffer(mem)
        lib.ecs_pool_opts_init(ctypes.byref(opts))
        opts.size = int(size)
        opts.cuda_register = 1 if cuda_register else 0
        opts.name = name.encode()
        ptr = ctypes.c_void_p()
        check(lib.ecs_pool_create(ctypes.byref(opts), ctypes.byref(ptr)), "host pool of %d bytes" % size)
        self._ptr = ptr.value
        self._destroy = lib.ecs_pool_destroy  # bound now: usable at interpreter exit
        self._free = lib.ecs_pool_free
        self._lock = threading.Lock()

    def tensor(self, dtype, shape):
        """An uninitialised contiguous torch tensor of dtype and shape in the
        pool, or None when the pool has no room for it now."""
        import numpy as np
        import torch

        count = 1
        for d in shape:
            count *= int(d)
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = max(count * itemsize, 1)
        off = ctypes.c_uint64()
        rc = self._lib.ecs_pool_alloc(self._ptr, nbytes, ctypes.byref(off))
        if rc in (codes.ENOSPC, codes.ETOOBIG):
            return None
        check(rc, "host pool alloc of %d bytes" % nbytes)
        block = _Block(self, off.value, nbytes)
        raw = torch.from_numpy(np.asarray(block))  # uint8; the array keeps the block alive
        return raw[: count * itemsize].view(dtype).view(tuple(int(d) for d in shape))

    def stats(self):
        st = _lib.PoolStats()
        self._lib.ecs_pool_stats(self._ptr, ctypes.byref(st))
        return {n: getattr(st, n) for n, _ in _lib.PoolStats._fields_ if n != "free_count"}

    def __del__(self):
        if getattr(self, "_ptr", None):
            self._destroy(self._ptr)
            self._ptr = None


class _Block:
    """One allocation, exposed to numpy as a uint8 array; freed when the
    last array/tensor over it goes away."""

    __slots__ = ("pool", "off", "size", "__array_interface__")

    def __init__(self, pool, off, size):
        self.pool = pool
        self.off = off
        self.size = size
        addr = pool._lib.ecs_pool_ptr(pool._ptr, off)
        self.__array_interface__ = {"data": (addr, False), "shape": (size,), "typestr": "|u1", "version": 3}

    def __del__(self):
        pool, self.pool = self.pool, None
        if pool is not None and pool._ptr:
            pool._free(pool._ptr, self.off, self.size)
