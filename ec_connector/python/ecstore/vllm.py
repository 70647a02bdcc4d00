"""ecstore as a vLLM encoder-cache connector: :class:`ECStoreConnector`.

vLLM loads it by module path::

    --ec-transfer-config '{"ec_connector": "ECStoreConnector",
                           "ec_connector_module_path": "ecstore.vllm",
                           "ec_role": "ec_producer",
                           "ec_connector_extra_config": {
                               "servers": "10.0.0.5:7700",
                               "redis_url": "redis://10.0.0.9:6379",
                               "namespace": "qwen2.5-vl-7b"}}'

It is a subclass of the installed vLLM's ``ECConnectorBase`` and a thin
layer over :class:`ecstore.ECConnector` (the C ec_connector): saves are the
connector's asynchronous batched puts, ``has_cache_item`` its Redis-only
existence check, loads its batched gets.  What this module adds is vLLM's
side of the contract:

- scheduler role: ``has_cache_item`` never raises (an error is ``False``,
  so vLLM recomputes, and one warning per ``warn_interval_s``);
  ``update_state_after_alloc`` notes the items a consumer must load and
  ``build_connector_meta`` hands them to the workers
  (:class:`ECStoreConnectorMetadata`);
- worker role: ``start_load_caches`` fetches all of a step's items in one
  batched call and *adds* them to vLLM's ``encoder_cache`` on the model's
  device, with the dtype and shape stored with each object;
  ``save_caches`` takes CPU or CUDA tensors (a CUDA tensor is copied to
  pinned host memory on a side stream; the network work happens on the
  connector's own thread); ``get_finished`` reports the mm_hashes whose
  saves and loads completed; ``shutdown`` releases everything.

Extra config keys: every key of the C connector's JSON configuration
(docs/connector.md: ``backend``, ``servers``, ``redis_url``, ``namespace``,
``auth_token``, ``protocol``, ``timeout_ms``, ``staging_bytes``, ...) plus
the keys of :data:`PY_KEYS`.  An unknown key is an error that names it.
See docs/vllm.md.
"""

import collections
import threading
import time
from dataclasses import dataclass, field

import torch
from vllm.distributed.ec_transfer.ec_connector.base import (
    ECConnectorBase,
    ECConnectorMetadata,
    ECConnectorRole,
    ECConnectorWorkerMetadata,
)
from vllm.logger import init_logger

from . import codes
from . import tensors as _t
from .connector import ECConnector
from .pinned import HostPool
from .errors import DeadlineExceededError, EcstoreError, err_name, make_error

logger = init_logger(__name__)

#: Keys of ``ec_connector_extra_config`` read here rather than by the C
#: connector: name -> (type, default, meaning).
def _size(v):
    """An int, or a string with a K/M/G suffix (powers of 1024)."""
    if isinstance(v, str):
        t = v.strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
        return int(t[:-1] if t[-1:] in "KMG" else t) * mult
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(v)
    return v


_size.__name__ = "size (bytes, or a string like '256M')"

PY_KEYS = {
    "load_device": (str, None, "device the loaded tensors go to (default: the worker's device)"),
    "load_pool_bytes": (_size, 256 << 20, "pinned host pool the loads land in (0: plain torch memory)"),
    "warn_interval_s": (float, 30.0, "at most one store-error warning per interval, per kind"),
    "reopen_interval_s": (float, 5.0, "how soon a connector that could not open tries again"),
}


# ---------------------------------------------------------------------------
# metadata


@dataclass
class ECStoreLoadSpec:
    """One item a consumer worker loads this step."""

    mm_hash: str
    num_embeds: int  # tokens the scheduler reserved for it (a size hint only)
    req_ids: list = field(default_factory=list)  # requests that wait for it


@dataclass
class ECStoreConnectorMetadata(ECConnectorMetadata):
    """Scheduler -> worker, once per step: what to load."""

    loads: list = field(default_factory=list)  # [ECStoreLoadSpec]


@dataclass
class ECStoreWorkerMetadata(ECConnectorWorkerMetadata):
    """Worker -> scheduler, once per step: the requests whose items could not
    be loaded (evicted or unreachable between the check and the load)."""

    failed_req_ids: set = field(default_factory=set)

    def aggregate(self, other):
        return ECStoreWorkerMetadata(set(self.failed_req_ids) | set(other.failed_req_ids))


# ---------------------------------------------------------------------------
# config


def split_config(extra):
    """(C connector config dict, Python-side settings) from vLLM's
    ``ec_connector_extra_config``.  Python keys are checked here; the C
    parser checks the rest and names an unknown key."""
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise make_error(codes.EINVAL, "ec_connector_extra_config must be a dict, not %s" % type(extra).__name__)
    c_cfg, py = {}, {k: v[1] for k, v in PY_KEYS.items()}
    for key, value in extra.items():
        if key in PY_KEYS:
            kind = PY_KEYS[key][0]
            try:
                py[key] = None if value is None else kind(value)
            except (TypeError, ValueError):
                raise make_error(codes.EINVAL, "ec_connector_extra_config key %r wants a %s, got %r"
                                 % (key, kind.__name__, value))
        else:
            c_cfg[key] = value
    c_cfg.setdefault("backend", "ecstore")
    return c_cfg, py


def _model_row(vllm_config):
    """(dtype code, (hidden size,)) of the model, the likely shape of one
    token's embedding, or None when vLLM's config has no model."""
    mc = getattr(vllm_config, "model_config", None)
    if mc is None:
        return None
    try:
        code = _t.parse_dtype(str(mc.dtype).replace("torch.", ""))
        return code, (int(mc.get_hidden_size()),)
    except Exception:  # noqa: BLE001 - only a guess; loads learn the real shape
        return None


def _close_quietly(conn):
    try:
        conn.close()
    except EcstoreError:
        pass


class _Throttle:
    """One log line per interval and kind; counts what it held back."""

    def __init__(self, interval_s):
        self.interval = interval_s
        self.last = {}
        self.held = collections.Counter()
        self.lock = threading.Lock()

    def warn(self, kind, msg, *args):
        now = time.monotonic()
        with self.lock:
            if now - self.last.get(kind, -1e18) < self.interval:
                self.held[kind] += 1
                return
            held, self.held[kind] = self.held[kind], 0
            self.last[kind] = now
        if held:
            msg += " (%d more like it since the last warning)"
            args = args + (held,)
        logger.warning(msg, *args)


# ---------------------------------------------------------------------------
# the connector


class ECStoreConnector(ECConnectorBase):
    """vLLM's ECConnectorBase over ecstore; built by vLLM as
    ``ECStoreConnector(vllm_config, role)``."""

    def __init__(self, vllm_config, role):
        super().__init__(vllm_config=vllm_config, role=role)
        tc = vllm_config.ec_transfer_config
        self._c_cfg, self._py = split_config(tc.ec_connector_extra_config)
        if role == ECConnectorRole.SCHEDULER:
            # The scheduler only asks Redis; it saves nothing.
            self._c_cfg.setdefault("staging_bytes", "1M")
        self._warn = _Throttle(self._py["warn_interval_s"])
        self._lock = threading.Lock()
        self._conn = None
        self._next_open = 0.0
        self._closed = False
        # scheduler state
        self._pending = {}  # mm_hash -> ECStoreLoadSpec, until build_connector_meta
        self._unavailable = set()  # req ids the workers could not load for
        # worker state
        self._saving = set()  # mm_hashes saved but not yet reported finished
        self._finished_loads = set()  # mm_hashes loaded since the last get_finished
        self._failed_loads = set()  # req ids, for build_connector_worker_meta
        self._row = _model_row(vllm_config)  # (dtype code, one token's shape) or None, see _predict
        self._stream = None  # CUDA side stream of the saves
        self._copy_q = None  # CUDA saves waiting for their copy, see _copier
        self._copier = None
        self._host = None  # HostPool of the loads, made on the first load
        self._h2d = collections.deque()  # (event, host tensors) of copies to the GPU in flight
        if role == ECConnectorRole.WORKER and self.is_consumer:
            # The load pool is populated and locked now, at vLLM's start,
            # rather than during the first request.
            self._host_pool()
        # Open now, so that a bad configuration (an unknown key, a bad
        # value) fails vLLM's start with the C parser's message.  A store
        # that is down is not a configuration error: try again later.
        self._open(first=True)

    # ---- plumbing ---------------------------------------------------------

    def _open(self, first=False):
        """The C connector, opened on first use and reopened (at most every
        reopen_interval_s) after it failed to open; None while it cannot."""
        with self._lock:
            if self._conn is not None or self._closed:
                return self._conn
            now = time.monotonic()
            if not first and now < self._next_open:
                return None
            self._next_open = now + self._py["reopen_interval_s"]
            try:
                self._conn = ECConnector(self._c_cfg)
                logger.info("ecstore EC connector (%s, %s): %s", self.role.name.lower(),
                            "producer" if self.is_producer else "consumer" if self.is_consumer else "-",
                            self._conn.describe())
            except EcstoreError as e:
                if first and e.code in (codes.EINVAL, codes.ENOTSUP, codes.EDTYPE):
                    raise  # the configuration is wrong: say so at start, and only then
                self._warn.warn("open", "ecstore EC connector: cannot reach the store (%s); "
                                "items count as misses until it can", e)
            return self._conn

    def _drop(self, conn, why):
        """Forgets a connector after a whole-call failure, so the next call
        reconnects (a restarted server or Redis is picked up)."""
        self._warn.warn("store", "ecstore EC connector: %s", why)
        with self._lock:
            if self._conn is not conn:
                return
            self._conn = None
        # close() waits (up to timeout_ms) for saves still queued: not on
        # the scheduler's or the model runner's thread.
        threading.Thread(target=_close_quietly, args=(conn,), name="ecstore-close", daemon=True).start()

    # ---- scheduler side ------------------------------------------------------

    def has_cache_item(self, identifier):
        """True when ``identifier`` (an mm_hash) is stored.  A store or Redis
        error is False (vLLM then recomputes), never an exception."""
        conn = self._open()
        if conn is None:
            return False
        try:
            return conn.has_caches([identifier])[0]
        except EcstoreError as e:
            if e.code == codes.EKEY:  # this key only (a NUL byte, too long)
                self._warn.warn("key", "ecstore EC connector: has_cache_item(%r): %s", identifier, e)
                return False
            self._drop(conn, "has_cache_item: %s" % e)
            return False
        except Exception as e:  # noqa: BLE001 - the scheduler must never see one
            self._warn.warn("has", "ecstore EC connector: has_cache_item(%r) failed: %r", identifier, e)
            return False

    def update_state_after_alloc(self, request, index):
        """Notes mm_features[index] of request for loading when this is a
        consumer and the item is stored."""
        if not self.is_consumer:
            return
        feature = request.mm_features[index]
        mm_hash = feature.identifier
        spec = self._pending.get(mm_hash)
        if spec is None:
            if not self.has_cache_item(mm_hash):
                return
            spec = ECStoreLoadSpec(mm_hash, int(request.get_num_encoder_embeds(index)))
            self._pending[mm_hash] = spec
        if request.request_id not in spec.req_ids:
            spec.req_ids.append(request.request_id)

    def build_connector_meta(self, scheduler_output):
        """The items to load this step; resets the pending set."""
        meta = ECStoreConnectorMetadata(loads=list(self._pending.values()))
        self._pending = {}
        return meta

    def update_connector_output(self, connector_output):
        meta = getattr(connector_output, "ec_connector_worker_meta", None)
        if isinstance(meta, ECStoreWorkerMetadata) and meta.failed_req_ids:
            self._unavailable |= set(meta.failed_req_ids)

    def take_unavailable_requests(self):
        """Requests whose stored items a worker could not load: vLLM fails
        them (retryable: a new request re-runs the encoder)."""
        out, self._unavailable = self._unavailable, set()
        return out

    def request_finished(self, request):
        """Nothing of vLLM's is held after a request: saves copy the tensor
        into the connector's staging memory before save_caches returns."""
        return False, None

    # ---- worker side: saves --------------------------------------------------

    def save_caches(self, encoder_cache, mm_hash, **kwargs):
        """Queues the put of encoder_cache[mm_hash] (a producer; a no-op on a
        consumer).  A CPU tensor is copied into the connector's pinned
        staging memory now; a CUDA tensor is copied to pinned host memory
        on a side stream and handed to the connector once that copy is
        done, so the forward pass never waits for the network.  A failure
        is logged (rate-limited) and never raised into the model runner:
        a consumer then misses the item and recomputes it."""
        if not self.is_producer:
            return
        tensor = encoder_cache[mm_hash]
        if tensor.device.type == "cpu":
            self._save_host(mm_hash, tensor.contiguous())
        else:
            self._save_device(mm_hash, tensor)

    def _save_host(self, mm_hash, host):
        conn = self._open()
        if conn is None:
            return
        try:
            conn.save(mm_hash, host)
            with self._lock:
                self._saving.add(mm_hash)
        except EcstoreError as e:
            self._warn.warn("save", "ecstore EC connector: save of %s not queued: %s", mm_hash, e)

    def _save_device(self, mm_hash, tensor):
        # torch's own APIs only: a side stream that waits for the producing
        # stream, a non-blocking copy into pinned memory, an event, and
        # record_stream so that the caching allocator does not reuse the
        # tensor's memory before the copy has read it.
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=tensor.device)
            self._copy_q = collections.deque()
            self._copy_cv = threading.Condition()
            self._copier = threading.Thread(target=self._copier_main, name="ecstore-d2h", daemon=True)
            self._copier.start()
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        self._stream.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(self._stream):
            host.copy_(tensor, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._stream)
        tensor.record_stream(self._stream)
        with self._copy_cv:
            self._copy_q.append((mm_hash, host, done))
            self._copy_cv.notify()

    def _copier_main(self):
        """Waits for each device-to-host copy, then queues its put."""
        while True:
            with self._copy_cv:
                while not self._copy_q:
                    if self._closed:
                        return
                    self._copy_cv.wait(0.5)
                mm_hash, host, done = self._copy_q.popleft()
            if mm_hash is None:
                return
            done.synchronize()
            self._save_host(mm_hash, host)

    def _drain_copies(self):
        if self._copier is None:
            return
        with self._copy_cv:
            self._copy_q.append((None, None, None))
            self._copy_cv.notify()
        self._copier.join()
        self._copier = None

    def wait_for_save(self, timeout_ms=-1):
        """Blocks until every queued save is stored or failed; returns the
        failures as (mm_hash, code).  vLLM never calls it; tests and
        scripts that must know a save landed do."""
        if self._copier is not None:
            self._drain_copies()
        conn = self._open()
        if conn is None:
            return []
        return conn.wait_for_save(timeout_ms)

    # ---- worker side: loads --------------------------------------------------

    def start_load_caches(self, encoder_cache, **kwargs):
        """Loads this step's items (one batched call) and adds each hit to
        encoder_cache as a tensor on the model's device, with its stored
        dtype and shape.  An item that is no longer there is left out and
        its requests are reported to the scheduler, which fails them
        (retryable); this never raises for a miss or a store error."""
        meta = self._connector_metadata
        if not isinstance(meta, ECStoreConnectorMetadata):
            return
        todo = [s for s in meta.loads if s.mm_hash not in encoder_cache]
        if not todo:
            return
        device = self._device(encoder_cache)
        cuda = device.type == "cuda"
        self._reap_h2d()
        got = self._load(todo, pin=cuda)
        hosts = []
        for spec in todo:
            t = got.get(spec.mm_hash)
            if t is None:
                self._failed_loads.update(spec.req_ids)
                continue
            if cuda:
                # Asynchronous on the current stream: the forward pass that
                # uses it is ordered after it.  The host block stays
                # referenced until the copy is done (see _reap_h2d).
                encoder_cache[spec.mm_hash] = t.to(device, non_blocking=True)
                hosts.append(t)
            else:
                encoder_cache[spec.mm_hash] = t
            self._finished_loads.add(spec.mm_hash)
        if hosts:
            ev = torch.cuda.Event()
            ev.record()
            self._h2d.append((ev, hosts))

    def _reap_h2d(self):
        """Lets go of host blocks whose copies to the GPU are done."""
        while self._h2d and self._h2d[0][0].query():
            self._h2d.popleft()

    def _device(self, encoder_cache):
        if self._py["load_device"]:
            return torch.device(self._py["load_device"])
        for t in encoder_cache.values():
            return t.device
        from vllm.platforms import current_platform

        kind = getattr(current_platform, "device_type", "") or "cpu"
        if kind == "cuda" and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device(kind if kind in ("cpu", "cuda") else "cpu")

    def _predict(self, spec, pin):
        """A host tensor for spec: items of one model are (tokens, width)
        of one dtype, and the scheduler knows the tokens.  The width and
        dtype are the model's hidden size and dtype at first, then what the
        last load returned.  A wrong guess costs one more round trip for
        that item only (the load reports the stored dtype and shape), never
        wrong bytes; with no guess at all the buffer is empty."""
        row = self._row
        if row is None:
            return torch.empty(0, dtype=torch.uint8)
        code, tail = row
        return self._host_tensor(_t.torch_dtype(code), (spec.num_embeds,) + tail, pin)

    def _host_pool(self):
        """The pinned pool of the loads (registered with CUDA where a GPU
        is), or None when disabled or it could not be made."""
        if self._host is None and self._py["load_pool_bytes"]:
            try:
                self._host = HostPool(self._py["load_pool_bytes"], cuda_register=torch.cuda.is_available(),
                                      name="ecstore-vllm-load")
            except EcstoreError as e:
                self._warn.warn("pool", "ecstore EC connector: no pinned load pool (%s); using torch memory", e)
                self._py["load_pool_bytes"] = 0
        return self._host

    def _host_tensor(self, dtype, shape, pin):
        """A host tensor for a load: from the pinned pool when it has room
        (no page faults, and an asynchronous copy to the GPU), else torch's."""
        pool = self._host_pool()
        t = pool.tensor(dtype, shape) if pool is not None else None
        return t if t is not None else torch.empty(shape, dtype=dtype, pin_memory=pin)

    def _load(self, specs, pin):
        """{mm_hash: host tensor} of the hits."""
        conn = self._open()
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
                        self._warn.warn("miss", "ecstore EC connector: load of %s: %s", s.mm_hash, err_name(st))
            if retry:  # sizes now known exactly
                outs2 = [self._host_tensor(_t.torch_dtype(d[0]), d[1], pin) for _, d in retry]
                with conn.start_load_caches([(s.mm_hash, o) for (s, _), o in zip(retry, outs2)]) as ld:
                    res = ld.wait()
                    for i, (s, _) in enumerate(retry):
                        if ld.statuses[i] == codes.OK:
                            got[s.mm_hash] = res[i]
                            self._learn(s, ld.descs[i])
                        else:
                            self._warn.warn("miss", "ecstore EC connector: load of %s: %s", s.mm_hash,
                                            err_name(ld.statuses[i]))
        except EcstoreError as e:
            self._drop(conn, "load of %d items: %s" % (len(specs), e))
        return got

    def _learn(self, spec, desc):
        code, shape = desc
        if len(shape) >= 1 and shape[0] == spec.num_embeds:
            self._row = (code, tuple(shape[1:]))

    def get_finished(self, finished_req_ids):
        """(mm_hashes whose saves are stored, mm_hashes loaded) since the
        last call, or None for an empty set.  Saves are reported when the
        connector's queue has drained (the C connector reports failures,
        not each success); failed saves are logged and not reported."""
        loaded, self._finished_loads = self._finished_loads, set()
        self._reap_h2d()
        saved = set()
        conn = self._conn
        if self.is_producer and conn is not None and self._saving:
            drained = False
            with self._lock:
                snapshot = set(self._saving)  # queued before the check below
            try:
                failures = conn.wait_for_save(0)
                drained = conn.save_pending() == 0
            except DeadlineExceededError as e:  # some still pending: report them later
                failures = list(e.statuses or [])
            except EcstoreError as e:
                failures = []
                self._warn.warn("save", "ecstore EC connector: wait_for_save: %s", e)
            with self._lock:
                for f in failures:
                    self._saving.discard(f.mm_hash)
                    self._warn.warn("save", "ecstore EC connector: save of %s failed: %s", f.mm_hash, f.error)
                if drained:
                    saved = snapshot & self._saving
                    self._saving -= saved
        return (saved or None), (loaded or None)

    def build_connector_worker_meta(self):
        if not self._failed_loads:
            return None
        failed, self._failed_loads = self._failed_loads, set()
        return ECStoreWorkerMetadata(failed)

    # ---- both ----------------------------------------------------------------

    def describe(self):
        """The C connector's backend and data path, or "unavailable"."""
        conn = self._open()
        return conn.describe() if conn is not None else "unavailable"

    def shutdown(self):
        """Waits for queued saves (within the connector's timeout_ms), then
        closes the connector.  Idempotent."""
        if self._copier is not None:
            self._drain_copies()
        for ev, _ in self._h2d:
            ev.synchronize()
        self._h2d.clear()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


__all__ = [
    "ECStoreConnector",
    "ECStoreConnectorMetadata",
    "ECStoreLoadSpec",
    "ECStoreWorkerMetadata",
    "ECConnectorRole",
    "PY_KEYS",
    "split_config",
]
