"""The CUDA registration cache of ecstore.vllm_worker follows the mapping,
not just the address.

A consumer registers the local server's pool mapping with CUDA once, so
that host-to-device copies from zero-copy views are asynchronous.  After a
reconnect (a restarted server: a new memfd) the client maps the new pool,
often at the very same address; a registration kept by address alone would
then have CUDA read the old pages: wrong bytes on the GPU.  No GPU here, so
CUDA's runtime is replaced by a recorder of the two calls the cache makes;
the mappings are real (memfds mapped with mmap, the second one MAP_FIXED
over the first).
"""

import ctypes
import ctypes.util
import mmap
import os

import pytest

from ecstore import vllm_worker as vw

SIZE = 1 << 20


class Recorder:
    """cudaHostRegister / cudaHostUnregister, recorded; both succeed."""

    def __init__(self):
        self.calls = []

    def cudaHostRegister(self, addr, size, flags):
        self.calls.append(("register", addr, size))
        return 0

    def cudaHostUnregister(self, addr):
        self.calls.append(("unregister", addr))
        return 0


@pytest.fixture
def libc():
    lib = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return lib


def map_memfd(libc, addr=None):
    fd = os.memfd_create("ecs-test-pool")
    os.ftruncate(fd, SIZE)
    flags = mmap.MAP_SHARED | (0x10 if addr else 0)  # MAP_FIXED
    p = libc.mmap(addr, SIZE, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
    os.close(fd)
    assert p not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    return p


def test_registration_follows_a_remapped_pool(monkeypatch, libc):
    rec = Recorder()
    monkeypatch.setattr(vw, "_cudart", lambda: rec)
    monkeypatch.setattr(vw, "_cuda_ranges", [])
    addr = map_memfd(libc)
    try:
        assert vw.cuda_register_mapping(addr + 4096, 8192)
        assert vw.cuda_register_mapping(addr + 65536, 4096)  # same mapping: registered once
        assert rec.calls == [("register", addr, SIZE)]

        # The pool mapped again at the same address, over another memfd.
        assert map_memfd(libc, addr) == addr
        assert vw.cuda_register_mapping(addr + 4096, 8192)
        assert rec.calls == [("register", addr, SIZE), ("unregister", addr), ("register", addr, SIZE)]
    finally:
        libc.munmap(addr, SIZE)


def test_a_range_past_its_mapping_is_not_registered(monkeypatch, libc):
    rec = Recorder()
    monkeypatch.setattr(vw, "_cudart", lambda: rec)
    monkeypatch.setattr(vw, "_cuda_ranges", [])
    addr = map_memfd(libc)
    try:
        assert not vw.cuda_register_mapping(addr + SIZE - 4096, 8192)
        assert rec.calls == []
    finally:
        libc.munmap(addr, SIZE)


class SlowRecorder(Recorder):
    """A cudaHostRegister that takes as long as a large pool's does."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def cudaHostRegister(self, addr, size, flags):
        import time

        time.sleep(self.seconds)
        return super().cudaHostRegister(addr, size, flags)


def test_pool_mapping_registered_in_background_and_loads_never_wait(monkeypatch, cluster):
    """A consumer registers the local server's pool mapping off the load
    path (on an H100 host cudaHostRegister of a 1 GiB pool took 185 ms,
    all of it in the first load step); a load that comes meanwhile copies
    synchronously instead of waiting."""
    import time

    import ecstore

    rec = SlowRecorder(0.5)
    monkeypatch.setattr(vw, "_cudart", lambda: rec)
    monkeypatch.setattr(vw, "_cuda_ranges", [])
    with ecstore.connect(cluster.config(transport="shm")) as s:
        assert s.transport() == "shm"
        maps = vw.pool_mappings()
        assert maps, "no pool mapping of the server found in /proc/self/maps"
        lo, hi, _ = maps[-1]
        t = vw.register_pool_mappings_async()
        assert t is not None
        time.sleep(0.05)  # the thread is inside cudaHostRegister now
        t0 = time.monotonic()
        assert not vw.cuda_register_mapping(lo + 4096, 4096, wait=False)  # in progress: no wait
        assert time.monotonic() - t0 < 0.1
        t.join(5)
        assert not t.is_alive()
        assert ("register", lo, hi - lo) in rec.calls
        n = len(rec.calls)
        assert vw.cuda_register_mapping(lo + 4096, 4096, wait=False)  # done: registered, no new call
        assert len(rec.calls) == n
