"""The worker role of ecstore.vllm.ECStoreConnector: saves (producer) and
loads (consumer), on CPU and CUDA.

Saves never hold the forward pass for the bytes:

- ``start_save_caches`` (before the model runs) marks every item the step
  encodes as pending in Redis, in one pipelined round trip; a consumer's
  ``has_cache_item`` is true from then on.
- ``save_caches`` queues (mm_hash, tensor) and returns.  For a CUDA tensor
  it first records an event on the current stream.  The queued tensor is a
  reference: vLLM may drop its encoder-cache entry at once (vLLM 0.33 frees
  the entry right after ``request_finished``, whatever it returns), and the
  tensor's memory stays valid until the saver thread let go of it.
- the saver thread (one per connector) copies each CUDA tensor to pinned
  host memory on a side stream that waits for the event, puts the batch
  (one batched put), deletes the pending marks, and drops the references.

Loads hand over memory that is already on this host:

- the scheduler's prefetch put each item into this host's server and
  pinned it there; ``start_load_caches`` takes views of those objects
  (one call, shm, no byte moves) and gives vLLM a tensor over the pool
  (CPU), or starts an asynchronous host-to-device copy from the pool (which
  is registered with CUDA once) and records an event (CUDA).
- a CPU view goes back when vLLM drops the tensor, and is swapped for a
  copy if vLLM keeps it past ``view_hold_s`` (the server's lease would run
  out under it); a CUDA copy's view goes back once its event completes.
- items not prefetched (prefetch off, no local server, not on shm) are
  loaded by the C connector into the pinned load pool, as before.
"""

import collections
import threading
import time

import torch

from . import codes
from . import tensors as _t
from .errors import EcstoreError, err_name, make_error
from .pinned import HostPool
from .store import Store
from .vllm_common import ECStoreConnectorMetadata, ECStoreConnectorStats, ECStoreWorkerMetadata, store_config
from .vllm_scheduler import host_id, make_marks
from .vllm_stage import StageClient, channel_name


def _first_pp_rank():
    """True where this worker runs the model's first stage (the one that
    loads encoder outputs); True outside a distributed run."""
    try:
        from vllm.distributed.parallel_state import get_pp_group, model_parallel_is_initialized

        return get_pp_group().is_first_rank if model_parallel_is_initialized() else True
    except Exception:  # noqa: BLE001 - no parallel state: one rank
        return True


def _tp_rank():
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank, model_parallel_is_initialized

        return get_tensor_model_parallel_rank() if model_parallel_is_initialized() else 0
    except Exception:  # noqa: BLE001 - no parallel state: one rank
        return 0


# ---------------------------------------------------------------------------
# saves


class _Saver:
    """The producer's saver thread: copies out and puts what save_caches
    queued, then deletes the pending marks."""

    def __init__(self, side):
        self.side = side
        self.q = collections.deque()
        self.cv = threading.Condition()
        self.busy = 0
        self.closed = False
        self.stream = None
        self.thread = threading.Thread(target=self._main, name="ecstore-save", daemon=True)
        self.thread.start()

    def push(self, job, limit):
        """Queues job; False (nothing queued) when limit jobs wait already,
        or once closed (no thread would take it: the tensor would be kept
        for ever)."""
        with self.cv:
            if len(self.q) >= limit or self.closed:
                return False
            self.q.append(job)
            self.cv.notify_all()
        return True

    def idle(self, timeout_s):
        """Waits until nothing is queued or in flight; False on timeout."""
        end = time.monotonic() + timeout_s
        with self.cv:
            while self.q or self.busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cv.wait(left)
        return True

    def close(self, timeout_s):
        self.idle(timeout_s)
        with self.cv:
            self.closed = True
            self.cv.notify_all()
        self.thread.join(timeout_s)

    def _main(self):
        batch_max = int(self.side.c_cfg.get("batch_size", 32) or 32)
        while True:
            with self.cv:
                while not self.q and not self.closed:
                    self.cv.wait()
                if not self.q:
                    return
                jobs = [self.q.popleft() for _ in range(min(batch_max, len(self.q)))]
                self.busy += 1
            try:
                self.side._put(jobs)
            except Exception as e:  # noqa: BLE001 - this thread must live on
                keys = [j[0] for j in jobs]
                self.side.warn.warn("save", "ecstore EC connector: saves failed: %r", e)
                if self.side.marks is not None:
                    self.side.marks.unmark(keys)
                self.side._done(keys, [(k, codes.EIO) for k in keys], 0, 0.0)
                jobs = None
            finally:
                with self.cv:
                    self.busy -= 1
                    self.cv.notify_all()


def host_copy(tensor, ready_event=None, stream=None):
    """A host copy of a CUDA tensor, made on stream (a side stream) after
    ready_event (recorded on the producing stream); returns (host tensor,
    completion event).  Pinned host memory, so the copy is asynchronous.
    The caller keeps tensor referenced until the event completes."""
    stream = stream or torch.cuda.Stream(device=tensor.device)
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    with torch.cuda.stream(stream):
        if ready_event is not None:
            stream.wait_event(ready_event)
        host.copy_(tensor, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
    return host, done


# Host mappings this process registered with CUDA: (start, end, (dev, inode)).
# The identity matters: a client maps the server's pool again after a
# reconnect (a restarted server: a new memfd), often at the same address,
# and CUDA's registration of the old range still points at the old pages.
# So every call checks that the mapping around addr is still the one
# registered, and re-registers (unregistering the stale range) when not.
_cuda_ranges = []
_cuda_lock = threading.Lock()


def _cudart():
    return torch.cuda.cudart()


def _mapping_of(addr):
    """(start, end, (dev, inode)) of the mapping of this process holding
    addr, from /proc/self/maps; None when no mapping holds it."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= addr < hi:
                return lo, hi, (fields[3], fields[4])
    return None


def cuda_register_mapping(addr, nbytes, wait=True):
    """Registers with CUDA the whole host mapping that holds
    [addr, addr + nbytes) (for a view: the server's shared pool), once per
    mapping, so that copies from it to a GPU are asynchronous.  Returns
    True when the range is registered (now or before).  With wait=False
    it never waits for a registration in progress (cudaHostRegister of a
    1 GiB pool takes ~185 ms on an H100 host): it returns False, and the
    caller copies synchronously this time."""
    m = _mapping_of(addr)
    if m is None or addr + nbytes > m[1]:
        return False
    return _register(m, wait)


def _register(m, wait=True):
    """cuda_register_mapping's core, for a mapping (start, end, ident)."""
    if not _cuda_lock.acquire(blocking=wait):
        return False
    try:
        for entry in list(_cuda_ranges):
            lo, hi, ident, ok = entry
            if (lo, hi, ident) == m:
                return ok
            if lo < m[1] and m[0] < hi:
                # Another mapping now where a registered one was: forget
                # the stale registration before registering this one.
                if ok:
                    _cudart().cudaHostUnregister(lo)
                _cuda_ranges.remove(entry)
        rc = _cudart().cudaHostRegister(m[0], m[1] - m[0], 0)
        ok = int(getattr(rc, "value", rc)) == 0
        _cuda_ranges.append(m + (ok,))  # tried once a mapping: a failure stays a synchronous copy
        return ok
    finally:
        _cuda_lock.release()


#: The name of the server's pool as a client maps it (store/server: memfd_create).
_POOL_MAPPING = "/memfd:ecstore-pool"


def pool_mappings():
    """(start, end, (dev, inode)) of every mapping of a server's shared pool
    in this process (one per shm connection), as _mapping_of gives them."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == _POOL_MAPPING and fields[1][3] == "s":
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                out.append((lo, hi, (fields[3], fields[4])))
    return out


def register_pool_mappings_async():
    """Registers with CUDA, on a background thread, the pool mappings this
    process has (a consumer calls it right after connecting to the local
    server), so that no load step pays for cudaHostRegister; a load that
    comes first copies synchronously (device_copy does not wait).
    Returns the thread (None when there is nothing to register)."""
    todo = pool_mappings()
    if not todo:
        return None

    def run():
        for m in todo:
            try:
                _register(m)
            except Exception:  # noqa: BLE001 - a failure means synchronous copies, never a crash
                pass

    t = threading.Thread(target=run, name="ecstore-cuda-register", daemon=True)
    t.start()
    return t


class _Registrations:
    """device_copy for the items of one load step, whose views lie in one
    or a few mappings of the server's pool: each mapping is found in
    /proc/self/maps (and registered with CUDA, without waiting) once for
    the step, not once per item (a vLLM process has thousands of
    mappings to read through)."""

    def __init__(self):
        self.seen = []  # (start, end) of the mappings checked this step

    def copy(self, host, device, stream=None):
        if not host.is_pinned():
            addr, n = host.data_ptr(), host.numel() * host.element_size()
            if not any(lo <= addr and addr + n <= hi for lo, hi in self.seen):
                m = _mapping_of(addr)
                if m is not None and addr + n <= m[1]:
                    _register(m, wait=False)
                    self.seen.append(m[:2])
        return _h2d(host, device, stream)


def device_copy(host, device, stream=None):
    """The load's copy to a GPU: host (a CPU tensor over a view of the
    local pool, or pinned memory) copied to a new tensor on device,
    asynchronously on stream (default: the current one); returns (device
    tensor, event recorded after the copy).  Keep host referenced until
    the event completes.  A host tensor that is neither pinned nor in a
    registered mapping has its mapping registered first, unless a
    registration is in progress (register_pool_mappings_async): then this
    copy is synchronous rather than a wait."""
    if not host.is_pinned():
        cuda_register_mapping(host.data_ptr(), host.numel() * host.element_size(), wait=False)
    return _h2d(host, device, stream)


def _h2d(host, device, stream):
    stream = stream or torch.cuda.current_stream(device)
    with torch.cuda.stream(stream):
        out = host.to(device, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
    return out, done


# The torch dtypes a DLBox tensor of a dtype torch may lack comes as (see
# ecs_dlbox_wrap): only these need the stored dtype looked up.
_CARRIERS = frozenset((torch.uint8, torch.int16, torch.int32, torch.int64))


class WorkerSide:
    """The worker's half.  conn_fn()/drop_fn as in SchedulerSide."""

    def __init__(self, vllm_config, c_cfg, py, warn, conn_fn, drop_fn, is_producer, is_consumer, row):
        self.c_cfg, self.py = c_cfg, py
        self.warn = warn
        self.conn_fn, self.drop_fn = conn_fn, drop_fn
        self.is_producer, self.is_consumer = is_producer, is_consumer
        self.row = row  # (dtype code, one token's shape) or None, see _predict
        self.lock = threading.Lock()
        self.stats = ECStoreConnectorStats()
        self.rank = _tp_rank()
        self.queue_depth = max(1, int(c_cfg.get("queue_depth", 256) or 256))  # saves waiting, at most
        # saves
        self.marked = set()  # marked this step by start_save_caches
        self.saved = set()  # stored since the last get_finished
        self.failures = []  # SaveFailure-like (mm_hash, code) since the last wait_for_save
        self.saver = None
        self.store = None  # Store of the saver thread (backend ecstore)
        self.marks = None
        if is_producer and self.rank == 0:
            try:
                self.marks = make_marks(c_cfg, py)
            except (OSError, ValueError) as e:
                warn.warn("marks", "ecstore EC connector: no pending marks (%s)", e)
            self.saver = _Saver(self)
        # loads
        self.finished_loads = set()
        self.failed_loads = set()
        self.host = None  # HostPool of copied loads
        self.h2d = collections.deque()  # (event, [views or host tensors]) of copies to the GPU in flight
        self.local = None  # Store of this host's server (views), model-runner thread only
        self.next_local = 0.0
        # Views handed out: each item's tensor comes from self.box (torch's
        # DLPack import), whose deleter queues the item's token when the last
        # tensor over its bytes died (slices too); the view is released then.
        self.box = None  # tensors.DLBox, made with the first view
        self.next_token = 1
        self.leases = {}  # token -> (Views, index, mm_hash) of every view not released yet
        self.held = collections.deque()  # (time, [token]) of CPU views, per load step, not yet past view_hold_s
        self.cache = None  # the model runner's encoder_cache, as last seen (close() swaps its views)
        self.platform_device = None  # vLLM platform's device, as _device first found it
        self.closed = False
        # staging (see vllm_stage): items the scheduler asked this worker to
        # copy into pinned memory ahead of their load
        self.staged = {}  # mm_hash -> (host tensor, when)
        self.staged_bytes = 0
        self.stage_store = None  # Stores of the stage thread: the connector's servers, holders via Redis
        self.stage_remote = None
        self.load_remote = None  # holders via Redis, model-runner thread: loads staging did not serve
        self.stager = None
        if is_consumer and py["stage"] and py["prefetch"] and _first_pp_rank():
            self.stager = StageClient(channel_name(vllm_config, py), self.rank, self._stage_fetch,
                                      self._stage_drop, 0.5, warn)
        if is_consumer:
            self._host_pool()
            if self.py["zero_copy"] and torch.cuda.is_available():
                # Connect to the local server now (on the thread that builds
                # the connector, vLLM's model-runner thread), so that its
                # pool mapping is registered with CUDA before the first load.
                self._local()

    # ---- saves -------------------------------------------------------------

    def start_save_caches(self, meta, encoder_cache):
        """Marks this step's items pending before the model runs."""
        if self.saver is None or self.closed or not isinstance(meta, ECStoreConnectorMetadata) or not meta.saves:
            return
        todo = [h for h in meta.saves if h not in encoder_cache]
        self._mark(todo)

    def _mark(self, keys):
        if self.marks is None or not keys:
            return
        try:
            self.marks.mark(keys, ("%s %d" % (host_id(), int(time.time() * 1e3))).encode())
            self.marked.update(keys)
        except ConnectionError as e:
            self.warn.warn("marks", "ecstore EC connector: pending marks not written: %s", e)

    def save_caches(self, encoder_cache, mm_hash):
        """Queues the save of encoder_cache[mm_hash] and returns."""
        if self.saver is None:
            return  # a consumer, or a TP rank other than 0 (rank 0 saves for all)
        if self.closed:  # shut down: nothing would store it, and nothing may keep the tensor
            self._done([mm_hash], [(mm_hash, codes.ENOTCONN)], 0, 0.0)
            return
        try:
            tensor = encoder_cache[mm_hash]
            ev = None
            if tensor.device.type == "cuda":
                ev = torch.cuda.Event()
                ev.record(torch.cuda.current_stream(tensor.device))
            if mm_hash not in self.marked:
                self._mark([mm_hash])
            self.marked.discard(mm_hash)
            if not self.saver.push((mm_hash, tensor, ev, time.monotonic()), self.queue_depth):
                # The store does not keep up (the step does not wait for
                # it), or the connector is shut down.
                closed = self.saver.closed
                if self.marks is not None and not closed:
                    self.marks.unmark([mm_hash])
                self._done([mm_hash], [(mm_hash, codes.ENOTCONN if closed else codes.EBUSY)], 0, 0.0)
        except Exception as e:  # noqa: BLE001 - never raised into the model runner
            self.warn.warn("save", "ecstore EC connector: save of %s not queued: %r", mm_hash, e)

    def _saver_store(self):
        if self.store is None and self.c_cfg.get("backend", "ecstore") == "ecstore" \
                and not self.c_cfg.get("redis_password_file"):
            self.store = Store(store_config(self.c_cfg, protocol=self.c_cfg.get("protocol")))
        return self.store

    def _put(self, jobs):
        """On the saver thread: copy out, put, unmark."""
        keys, hosts, nbytes = [], [], 0
        for mm_hash, tensor, ev, _ in jobs:
            if tensor.device.type == "cuda":
                if self.saver.stream is None:
                    self.saver.stream = torch.cuda.Stream(device=tensor.device)
                host, done = host_copy(tensor, ev, self.saver.stream)
                done.synchronize()
            else:
                host = tensor.contiguous()
            keys.append(mm_hash)
            hosts.append(host)
            nbytes += host.numel() * host.element_size()
        t0 = time.monotonic()
        failed = []
        try:
            store = self._saver_store()
        except EcstoreError as e:
            store = None
            self.warn.warn("save", "ecstore EC connector: cannot reach the store for saves: %s", e)
            failed = [(k, e.code) for k in keys]
        if store is not None:
            try:
                st = store.batch_put_tensors(keys, hosts)
            except EcstoreError as e:
                st = list(e.statuses or [e.code] * len(keys))
                self.warn.warn("save", "ecstore EC connector: put of %d items: %s", len(keys), e)
            failed = [(k, s) for k, s in zip(keys, st) if s not in (0, codes.EREDIS)]
        elif not failed:  # another backend: the C connector's queue
            failed = self._put_conn(keys, hosts)
        if self.marks is not None:
            self.marks.unmark(keys)
        del hosts
        jobs.clear()  # the tensors may go now
        self._done(keys, failed, nbytes, time.monotonic() - t0)

    def _put_conn(self, keys, hosts):
        """On the saver thread: saves through the C connector (backends
        disk and redis), waits for them; returns the failures.  A save the
        wait did not see end (its deadline passed, or the connector failed
        as a whole) is not stored as far as anyone can tell: it fails with
        the wait's code rather than counting as saved.  Failures the wait
        reports for keys of an earlier batch (one that ended so) are not
        this batch's: they were reported then."""
        conn = self.conn_fn()
        if conn is None:
            return [(k, codes.ECONN) for k in keys]
        failed, sent = [], []
        for k, h in zip(keys, hosts):
            try:
                conn.save(k, h)
                sent.append(k)
            except EcstoreError as e:
                failed.append((k, e.code))
        if not sent:
            return failed
        mine = set(sent)
        try:
            failed += [(f.mm_hash, f.code) for f in conn.wait_for_save(-1) if f.mm_hash in mine]
        except EcstoreError as e:
            seen = [(f.mm_hash, f.code) for f in (e.statuses or []) if f.mm_hash in mine]
            told = {k for k, _ in seen}
            failed += seen + [(k, e.code) for k in sent if k not in told]
            if e.code != codes.ETIMEDOUT:
                self.drop_fn(conn, "saves of %d items: %s" % (len(sent), e))
        return failed

    def _done(self, keys, failed, nbytes, seconds):
        bad = {k for k, _ in failed}
        with self.lock:
            for k, code in failed:
                self.failures.append((k, code))
                self.warn.warn("save", "ecstore EC connector: save of %s failed: %s", k, err_name(code))
            ok = [k for k in keys if k not in bad]
            self.saved.update(ok)
            self.stats.add("saves", len(ok))
            self.stats.add("save_failed", len(bad))
            self.stats.add("save_bytes", nbytes)
            self.stats.observe("save_s", seconds)

    def wait_for_save(self, timeout_ms=-1):
        """Blocks until every queued save is stored or failed; returns the
        failures [(mm_hash, code)] since the last call.  Not a vLLM call."""
        if self.saver is not None:
            tmo = (timeout_ms if timeout_ms >= 0 else int(self.c_cfg.get("timeout_ms", 10000))) / 1e3
            self.saver.idle(tmo)
        with self.lock:
            out, self.failures = self.failures, []
        return out

    # ---- loads ---------------------------------------------------------------

    def start_load_caches(self, meta, encoder_cache):
        if self.closed:
            return
        self.cache = encoder_cache
        self._housekeeping(encoder_cache)
        if not isinstance(meta, ECStoreConnectorMetadata):
            return
        todo = [s for s in meta.loads if s.mm_hash not in encoder_cache]
        if not todo:
            return
        t0 = time.monotonic()
        device = self._device(encoder_cache)
        rest = todo
        if self.staged:
            rest = self._load_staged(todo, encoder_cache, device)
        if self.py["zero_copy"]:
            views = self._load_views([s for s in rest if s.local], encoder_cache, device)
            rest = views + [s for s in rest if not s.local]
        if rest:
            self._load_copies(rest, encoder_cache, device)
        with self.lock:
            self.stats.observe("load_s", time.monotonic() - t0)

    def _load_staged(self, specs, encoder_cache, device):
        """Hands over what the stage thread copied already; returns the
        specs it had not."""
        with self.lock:
            got = [(s, self._staged_pop_locked(s.mm_hash)) for s in specs]
        self._hand_over([(s, t) for s, t in got if t is not None], encoder_cache, device, "load_staged")
        return [s for s, t in got if t is None]

    def _hand_over(self, pairs, encoder_cache, device, counter=None):
        """Puts host tensors [(spec, tensor)] into encoder_cache: as they
        are on a CPU; on a GPU copied asynchronously, each host tensor kept
        until its copy's event completed.  Counts them loaded."""
        hosts = []
        for s, t in pairs:
            if device.type == "cuda":
                encoder_cache[s.mm_hash] = t.to(device, non_blocking=True)
                hosts.append(t)
            else:
                encoder_cache[s.mm_hash] = t
        if hosts:
            ev = torch.cuda.Event()
            ev.record()
            self.h2d.append((ev, hosts))
        with self.lock:
            for s, t in pairs:
                self.finished_loads.add(s.mm_hash)
                self.stats.add("loads")
                self.stats.add("load_bytes", t.numel() * t.element_size())
                if counter:
                    self.stats.add(counter)

    def _staged_put_locked(self, h, t, now):
        self.staged[h] = (t, now)
        self.staged_bytes += t.numel() * t.element_size()

    def _staged_pop_locked(self, h):
        """h's staged tensor, no longer staged; None when there was none."""
        e = self.staged.pop(h, None)
        if e is None:
            return None
        self.staged_bytes -= e[0].numel() * e[0].element_size()
        return e[0]

    def _stage_fetch(self, specs):
        """On the stage thread: copies specs [(h, nbytes, dtype code,
        shape)] from the store into pinned host tensors; returns (staged,
        failed) hashes.  At most load_pool_bytes (or 256 MiB without the
        pool) are held staged; what does not fit fails (its load copies)."""
        self._stage_expire()
        cap = self.py["load_pool_bytes"] or (256 << 20)
        cuda = torch.cuda.is_available()
        want, outs, failed, unknown = [], [], [], []
        with self.lock:
            room = cap - self.staged_bytes
        seen = set()
        for h, n, code, shape in specs:
            if h in seen:
                continue  # named twice in one message: once is enough
            seen.add(h)
            with self.lock:
                if h in self.staged:
                    want.append(h)  # asked again (a second request): still here
                    outs.append(None)
                    continue
            if n < 0:
                unknown.append((h, shape[0] if len(shape) == 1 else 0))  # read from its holder below
                continue
            try:
                dt = _t.torch_dtype(code)
            except Exception:  # noqa: BLE001 - a dtype this torch lacks: the load says why
                failed.append(h)
                continue
            count = 1
            for d in shape:
                count *= d
            if n > room or self.closed or count * torch.empty((), dtype=dt).element_size() != n:
                failed.append(h)  # no room, or a shape that does not match its size: nothing allocated
                continue
            t = self._host_tensor(dt, shape, cuda)
            if t.numel() * t.element_size() != n:
                failed.append(h)
                continue
            room -= n
            want.append(h)
            outs.append(t)
        fetch = [(h, o) for h, o in zip(want, outs) if o is not None]
        staged = [h for h, o in zip(want, outs) if o is None]
        if fetch:
            try:
                store = self._stage_open()
                _, sts = store.batch_get_tensors([h for h, _ in fetch], outs=[o for _, o in fetch],
                                                 with_status=True)
            except EcstoreError as e:
                self.warn.warn("stage", "ecstore EC connector: staging %d items: %s", len(fetch), e)
                self._stage_close()
                sts = [e.code] * len(fetch)
            now = time.monotonic()
            with self.lock:
                for (h, o), st in zip(fetch, sts):
                    if st == 0 and not self.closed:
                        self._staged_put_locked(h, o, now)
                        staged.append(h)
                    else:
                        failed.append(h)
        if unknown:
            ok, bad = self._stage_from_holders(unknown, cap, cuda)
            staged += ok
            failed += bad
        return staged, failed

    def _stage_from_holders(self, items, cap, pin):
        """Items the scheduler did not bring to this host (see
        vllm_scheduler._Prefetcher._direct), [(h, rows a request expects or
        0)]: read from their holders, found through Redis, with their stored
        dtype and shape, into the load pool (faulted in up front, pinned on a
        GPU host).  Where the model's row is known (from an earlier item) the
        tensor is guessed from rows and the read is one round trip; else, or
        where the guess was wrong, one round trip learns the dtype and shape
        and a second reads.  Nothing is allocated past cap: those items
        fail.  Returns (staged, failed)."""
        with self.lock:
            room = [cap - self.staged_bytes]
        if self.closed or room[0] <= 0:
            return [], [h for h, _ in items]

        def take(code, shape):
            """A host tensor within the room left, or None."""
            count = 1
            for d in shape:
                count *= d
            n = count * _t.dtype_size(code)
            if n > room[0]:
                return None
            try:
                t = self._host_tensor(_t.torch_dtype(code), shape, pin)
            except Exception:  # noqa: BLE001 - a dtype this torch lacks: the item fails
                return None
            room[0] -= n
            return t

        got = {}  # h -> tensor
        rest = [h for h, _ in items]
        try:
            store = self._stage_open(remote=True)
            row = self.row
            guess = [(h, take(row[0], (rows,) + row[1])) for h, rows in items if rows] if row else []
            guess = [(h, t) for h, t in guess if t is not None]
            if guess:
                res, sts = store.batch_get_tensors([h for h, _ in guess], outs=[t for _, t in guess],
                                                   with_status=True)
                for (h, g), t, st in zip(guess, res, sts):
                    n = g.numel() * g.element_size()
                    if st == 0 and t is not None and t.numel() * t.element_size() == n:
                        got[h] = t
                    else:  # a wrong guess (smaller, or larger than the item): its block goes back
                        room[0] += n
                guess = res = g = t = None  # (the blocks of wrong guesses are freed here)
                rest = [h for h in rest if h not in got]
            if rest:
                res, sts = store.batch_get_tensors(rest, alloc=take, with_status=True)
                for h, t, st in zip(rest, res, sts):
                    if st == 0 and t is not None:
                        got[h] = t
        except EcstoreError as e:
            self.warn.warn("stage", "ecstore EC connector: staging %d items from their holders: %s", len(items), e)
            self._stage_close()
        rows_of = dict(items)
        ok, bad = [], []
        now = time.monotonic()
        with self.lock:
            for h, _ in items:
                t = got.get(h)
                if t is not None and not self.closed and h not in self.staged:
                    if rows_of[h] and t.dim() >= 1 and t.shape[0] == rows_of[h]:
                        self._learn_row(t)
                    self._staged_put_locked(h, t, now)
                    ok.append(h)
                elif h in self.staged:
                    ok.append(h)  # staged meanwhile by another message
                else:
                    bad.append(h)
        return ok, bad

    def _learn_row(self, t):
        """The model's row (dtype code, one embedding's shape) from an item
        of the expected rows: the next items' size guess."""
        try:
            self.row = (_t.describe(t)[2], tuple(t.shape[1:]))
        except EcstoreError:
            pass  # a dtype ecstore cannot name: keep the old guess

    def _stage_open(self, remote=False):
        """The stage thread's Stores: the connector's servers, or (remote)
        holders found through Redis when there is one.  None opens once
        the worker closed (close() may not have waited this thread out)."""
        if self.closed:
            raise make_error(codes.ENOTCONN, "the connector is shut down")
        if remote and self.c_cfg.get("redis_url"):
            if self.stage_remote is None:
                self.stage_remote = self._holders_store()
            return self.stage_remote
        if self.stage_store is None:
            self.stage_store = Store(store_config(self.c_cfg, protocol=self.c_cfg.get("protocol"),
                                                  placement=None, replicas=None))
        return self.stage_store

    def _holders_store(self):
        """A Store that finds each item's holder through Redis (one per
        thread that uses it)."""
        return Store(store_config(self.c_cfg, servers=None, protocol=self.c_cfg.get("protocol"), placement=None,
                                  replicas=None))

    def _stage_close(self):
        for s in (self.stage_store, self.stage_remote):
            if s is not None:
                _close(s)
        self.stage_store = self.stage_remote = None

    def _stage_drop(self, hashes):
        with self.lock:
            for h in hashes:
                self._staged_pop_locked(h)

    def _stage_expire(self):
        """Drops staged items vLLM never loaded (their requests went)."""
        old = time.monotonic() - self.py["stage_ttl_s"]
        with self.lock:
            gone = [h for h, (_, t) in self.staged.items() if t < old]
        self._stage_drop(gone)

    def _local(self):
        """Store of this host's server over shm, or None."""
        if self.local is None and self.py["local_server"] and time.monotonic() >= self.next_local:
            self.next_local = time.monotonic() + self.py["reopen_interval_s"]
            try:
                # The prefetch verified the bytes when it pinned them.
                self.local = Store(store_config(self.c_cfg, servers=self.py["local_server"], redis_url=None,
                                                transport="shm", verify_checksum=False, compression=None,
                                                placement=None, replicas=None))
            except EcstoreError as e:
                self.warn.warn("local", "ecstore EC connector: no shm views of %s (%s); loads copy",
                               self.py["local_server"], e)
            else:
                if torch.cuda.is_available():
                    register_pool_mappings_async()
        return self.local

    def _load_views(self, specs, encoder_cache, device):
        """Hands over views of the local pool; returns the specs it could not."""
        local = self._local() if specs else None
        if local is None:
            return specs
        try:
            views = local.get_views([s.mm_hash for s in specs])
        except EcstoreError as e:
            self.warn.warn("local", "ecstore EC connector: views: %s", e)
            self.local = None
            _close(local)
            return specs
        first = self.next_token
        self.next_token += views.n
        try:
            if self.box is None:
                self.box = _t.DLBox()
            ts = self.box.tensors(views, first)
        except EcstoreError as e:  # no room for the tensors (ENOMEM), or a library without them
            self.warn.warn("local", "ecstore EC connector: views as tensors: %s", e)
            views.release()
            return specs
        # Every tensor made has its lease before anything can raise: a
        # tensor dropped on an error then still releases its view.
        leases = self.leases
        for i, t in enumerate(ts):
            if t is not None:
                leases[first + i] = (views, i, specs[i].mm_hash)
        # One pass; stats and sets once for the batch.
        cuda = device.type == "cuda"
        rest, gpu_views, tokens, unused, loaded = [], [], [], [], []
        nbytes = 0
        carriers = _CARRIERS
        if cuda:
            reg = _Registrations()
        for i, (s, t) in enumerate(zip(specs, ts)):
            if t is None:
                rest.append(s)
                if views.statuses[i] == 0:
                    unused.append(i)  # pinned but no tensor made: released below
                continue
            h = s.mm_hash
            if t.dtype in carriers:  # maybe a carrier (float8, bool, u16..u64): view it as stored
                want = _t.torch_dtype(views.descs[i][0])
                if t.dtype != want:
                    t = t.view(want)
            if cuda:
                encoder_cache[h], _ = reg.copy(t, device)
                gpu_views.append(t)  # the view goes once the copy is done
            else:
                encoder_cache[h] = t
                tokens.append(first + i)
            loaded.append(h)
            nbytes += t.nbytes
        del ts, t
        if unused:  # pinned, but no tensor was made of them
            views.release_items(unused)
        if gpu_views:
            ev = torch.cuda.Event()
            ev.record()
            self.h2d.append((ev, gpu_views))
        if tokens:
            self.held.append((time.monotonic(), tokens))
        with self.lock:
            self.finished_loads.update(loaded)
            self.stats.add("loads", len(loaded))
            self.stats.add("load_bytes", nbytes)
        return rest

    def _housekeeping(self, encoder_cache):
        """Releases views whose tensors died or whose copies to the GPU are
        done; swaps views vLLM held past view_hold_s for copies."""
        while self.h2d and self.h2d[0][0].query():
            self.h2d.popleft()
        if self.staged:
            self._stage_expire()
        held = self.held
        if held:
            end = time.monotonic() - self.py["view_hold_s"]
            while held and held[0][0] < end:
                for tok in held.popleft()[1]:
                    self._swap(encoder_cache, tok)
        self._release_dead()

    def _swap(self, encoder_cache, tok):
        """Swaps view tok for a copy where encoder_cache still holds it (the
        server's lease must not run out under it); its release follows when
        the view's last tensor dies."""
        lease = self.leases.get(tok)
        if lease is None:
            return  # released already
        views, i, h = lease
        t = encoder_cache.get(h)
        if t is not None and t.device.type == "cpu" and t.data_ptr() == views.address(i):
            encoder_cache[h] = self._copy_of(t)
            with self.lock:
                self.stats.add("load_copies")

    def _release_dead(self):
        """Releases the views whose tensors all died (their tokens came
        back from the box), grouped by Views: one release call (one
        message) per group, not one per item (32 items cost ~1 ms of the
        load step one by one)."""
        if self.box is None:
            return
        dead = self.box.drain()
        if not dead:
            return
        groups = {}
        for tok in dead:
            lease = self.leases.pop(tok, None)
            if lease is not None:
                groups.setdefault(id(lease[0]), (lease[0], []))[1].append(lease[1])
        for views, idx in groups.values():
            try:
                views.release_items(idx)
            except EcstoreError:
                pass

    def _copy_of(self, t):
        out = self._host_tensor(t.dtype, tuple(t.shape), False)
        out.copy_(t)
        return out

    def _device(self, encoder_cache):
        if self.py["load_device"]:
            return torch.device(self.py["load_device"])
        for t in encoder_cache.values():
            return t.device
        dev = self.platform_device
        if dev is None:  # the platform's device, once: asking vLLM took ~40 us a step
            from vllm.platforms import current_platform

            kind = getattr(current_platform, "device_type", "") or "cpu"
            if kind == "cuda" and torch.cuda.is_available():
                dev = torch.device("cuda", torch.cuda.current_device())
            else:
                dev = torch.device(kind if kind in ("cpu", "cuda") else "cpu")
            self.platform_device = dev
        return dev

    def _host_pool(self):
        if self.host is None and self.py["load_pool_bytes"] and not self.closed:
            try:
                self.host = HostPool(self.py["load_pool_bytes"], cuda_register=torch.cuda.is_available(),
                                     name="ecstore-vllm-load")
            except EcstoreError as e:
                self.warn.warn("pool", "ecstore EC connector: no pinned load pool (%s); using torch memory", e)
                self.py["load_pool_bytes"] = 0
        return self.host

    def _host_tensor(self, dtype, shape, pin):
        pool = self._host_pool()
        t = pool.tensor(dtype, shape) if pool is not None else None
        return t if t is not None else torch.empty(shape, dtype=dtype, pin_memory=pin)

    def _predict(self, spec, pin):
        """A host tensor for spec: its stored dtype and shape when the
        prefetch saw it, else the model's row guess (a wrong guess costs one
        more round trip for that item, never wrong bytes)."""
        if spec.desc is not None:
            code, shape = spec.desc
            return self._host_tensor(_t.torch_dtype(code), tuple(shape), pin)
        if self.row is None:
            return torch.empty(0, dtype=torch.uint8)
        code, tail = self.row
        return self._host_tensor(_t.torch_dtype(code), (spec.num_embeds,) + tail, pin)

    def _load_copies(self, specs, encoder_cache, device):
        cuda = device.type == "cuda"
        got = self._load(specs, cuda)
        lost = [s for s in specs if s.mm_hash not in got and not s.local]
        if lost and self.stager is not None and self.c_cfg.get("redis_url"):
            got.update(self._load_from_holders(lost, cuda))
        with self.lock:
            for spec in specs:
                if spec.mm_hash not in got:
                    self.failed_loads.update(spec.req_ids)
                    self.stats.add("load_failed")
        self._hand_over([(s, got[s.mm_hash]) for s in specs if s.mm_hash in got], encoder_cache, device)

    def _load(self, specs, pin):
        """{mm_hash: host tensor} of the hits, through the C connector."""
        conn = self.conn_fn()
        if conn is None:
            return {}
        outs = [self._predict(s, pin) for s in specs]
        got = {}
        retry = []
        try:
            with conn.start_load_caches([(s.mm_hash, o) for s, o in zip(specs, outs)]) as ld:
                res = ld.wait()
                for i, s in enumerate(specs):
                    st = ld.statuses[i]
                    if st == codes.OK:
                        got[s.mm_hash] = res[i]
                        self._learn(s, ld.descs[i])
                    elif st in (codes.EBUFSMALL, codes.EDTYPE) and ld.descs[i] is not None:
                        retry.append((s, ld.descs[i]))
                    else:
                        self.warn.warn("miss", "ecstore EC connector: load of %s: %s", s.mm_hash, err_name(st))
            if retry:
                outs2 = [self._host_tensor(_t.torch_dtype(d[0]), d[1], pin) for _, d in retry]
                with conn.start_load_caches([(s.mm_hash, o) for (s, _), o in zip(retry, outs2)]) as ld:
                    res = ld.wait()
                    for i, (s, _) in enumerate(retry):
                        if ld.statuses[i] == codes.OK:
                            got[s.mm_hash] = res[i]
                            self._learn(s, ld.descs[i])
                        else:
                            self.warn.warn("miss", "ecstore EC connector: load of %s: %s", s.mm_hash,
                                           err_name(ld.statuses[i]))
        except EcstoreError as e:
            self.drop_fn(conn, "load of %d items: %s" % (len(specs), e))
        return got

    def _load_from_holders(self, specs, pin):
        """Items the prefetch left on their holders for staging (see
        vllm_scheduler._Prefetcher._direct) whose staging failed or timed
        out: read from their holders, found through Redis, in the step (the
        connector's servers are this host's, which never had them)."""
        try:
            if self.load_remote is None:
                self.load_remote = self._holders_store()
            tensors, sts = self.load_remote.batch_get_tensors([s.mm_hash for s in specs], pin_memory=pin,
                                                              with_status=True)
        except EcstoreError as e:
            self.warn.warn("miss", "ecstore EC connector: load of %d items from their holders: %s", len(specs), e)
            if self.load_remote is not None:
                _close(self.load_remote)
                self.load_remote = None
            return {}
        return {s.mm_hash: t for s, t, st in zip(specs, tensors, sts) if st == 0 and t is not None}

    def _learn(self, spec, desc):
        code, shape = desc
        if len(shape) >= 1 and shape[0] == spec.num_embeds:
            self.row = (code, tuple(shape[1:]))

    # ---- both ------------------------------------------------------------------

    def get_finished(self):
        while self.h2d and self.h2d[0][0].query():
            self.h2d.popleft()
        with self.lock:
            loaded, self.finished_loads = self.finished_loads, set()
            saved, self.saved = self.saved, set()
        return (saved or None), (loaded or None)

    def build_worker_meta(self):
        with self.lock:
            if not self.failed_loads:
                return None
            failed, self.failed_loads = self.failed_loads, set()
        return ECStoreWorkerMetadata(failed)

    def get_stats(self):
        with self.lock:
            if self.stats.is_empty():
                return None
            return self.stats.take()

    def close(self, timeout_s):
        """Releases what the worker holds: the saver thread (after the
        queued saves, within timeout_s), the copies to the GPU in flight,
        every view of the local pool (one vLLM still holds in its
        encoder_cache is swapped for a copy first: closing the Store drops
        the pins, and the server may then reuse the bytes), the Stores, the
        pending-mark link and the pinned load pool (freed once the last
        tensor in it dies).  Later calls do nothing (a save fails with
        ENOTCONN).  Idempotent."""
        self.closed = True
        if self.saver is not None:
            self.saver.close(timeout_s)
        if self.stager is not None:
            self.stager.close()
        self._stage_drop(list(self.staged))
        self._stage_close()
        if self.load_remote is not None:
            _close(self.load_remote)
            self.load_remote = None
        for ev, _ in self.h2d:
            ev.synchronize()
        self.h2d.clear()
        cache, self.cache = self.cache, None
        for views, i, h in list(self.leases.values()):
            t = cache.get(h) if cache is not None else None
            if t is not None and t.device.type == "cpu" and t.data_ptr() == views.address(i):
                out = torch.empty(tuple(t.shape), dtype=t.dtype)
                out.copy_(t)
                cache[h] = out
            del t
        self._release_dead()
        self.leases.clear()
        self.held.clear()
        if self.box is not None:
            self.box.close()
        for s in (self.store, self.local):
            if s is not None:
                _close(s)
        self.store = self.local = None
        if self.marks is not None:
            self.marks.close()
        self.host = None  # the pool goes with its last tensor


def _close(s):
    try:
        s.close()
    except EcstoreError:
        pass
