"""ecstore as a vLLM encoder-cache connector: :class:`ECStoreConnector`.

vLLM loads it by module path::

    --ec-transfer-config '{"ec_connector": "ECStoreConnector",
                           "ec_connector_module_path": "ecstore.vllm",
                           "ec_role": "ec_producer",
                           "ec_connector_extra_config": {
                               "servers": "10.0.0.5:7700",
                               "redis_url": "redis://10.0.0.9:6379",
                               "namespace": "qwen2.5-vl-7b"}}'

It is a subclass of the installed vLLM's ``ECConnectorBase``.  This module
holds the class vLLM builds and the plumbing both roles share (the C
connector, opened lazily and reopened after a failure); the roles live in
their own modules:

- ``ecstore.vllm_scheduler``: ``ensure_cache_available`` (prefetch to this
  host, pinned; bounded by ``prefetch_timeout_ms``), ``has_cache_item``
  (pending saves count), load specs with every waiting request,
  ``request_finished``'s ``ec_transfer_params``, stats;
- ``ecstore.vllm_worker``: saves that return at once (pending marks, a
  saver thread, CUDA copies on a side stream), loads that hand over views
  of the local pool (or start an asynchronous copy to the GPU), stats.

Extra config keys: every key of the C connector's JSON configuration
(docs/connector.md) plus :data:`PY_KEYS`.  An unknown key is an error that
names it.  See docs/vllm.md.
"""

import threading
import time

from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorBase, ECConnectorRole

from . import codes
from .connector import ECConnector
from .errors import EcstoreError
from .vllm_common import (  # noqa: F401 - re-exported
    PY_KEYS,
    ECStoreConnectorMetadata,
    ECStoreConnectorStats,
    ECStoreLoadSpec,
    ECStorePromMetrics,
    ECStoreWorkerMetadata,
    Throttle,
    close_quietly,
    logger,
    model_row,
    split_config,
)
from .vllm_scheduler import SchedulerSide
# host_copy / device_copy: the CUDA save and load copies on their own, for device checks
from .vllm_worker import WorkerSide, cuda_register_mapping, device_copy, host_copy  # noqa: F401


class ECStoreConnector(ECConnectorBase):
    """vLLM's ECConnectorBase over ecstore; built by vLLM as
    ``ECStoreConnector(vllm_config, role)``.  Delegates to one role object
    (``self.scheduler`` or ``self.worker``)."""

    def __init__(self, vllm_config, role):
        super().__init__(vllm_config=vllm_config, role=role)
        tc = vllm_config.ec_transfer_config
        self._c_cfg, self._py = split_config(tc.ec_connector_extra_config)
        self._open_cfg = self._c_cfg
        if role == ECConnectorRole.SCHEDULER:
            # The scheduler only asks Redis (it saves nothing), and must not
            # be held long by a frozen one.
            self._c_cfg.setdefault("staging_bytes", "1M")
            self._open_cfg = dict(self._c_cfg, timeout_ms=min(int(self._c_cfg.get("timeout_ms", 10000)),
                                                              max(100, self._py["redis_timeout_ms"])))
        self._warn = Throttle(self._py["warn_interval_s"])
        self._lock = threading.Lock()
        self._conn = None
        self._next_open = 0.0
        self._closed = False
        self.scheduler = self.worker = None
        args = (vllm_config, self._c_cfg, self._py, self._warn, self._open, self._drop, self.is_producer,
                self.is_consumer)
        # Open now, so that a bad configuration (an unknown key, a bad
        # value) fails vLLM's start with the C parser's message.  A store
        # that is down is not a configuration error: try again later.
        self._open(first=True)
        if role == ECConnectorRole.SCHEDULER:
            self.scheduler = SchedulerSide(*args)
        else:
            self.worker = WorkerSide(*args, row=model_row(vllm_config))

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
                self._conn = ECConnector(self._open_cfg)
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
        threading.Thread(target=close_quietly, args=(conn,), name="ecstore-close", daemon=True).start()

    # ---- scheduler side ------------------------------------------------------

    def has_cache_item(self, identifier):
        return self.scheduler.has_cache_item(identifier)

    def ensure_cache_available(self, request, num_computed_tokens):
        return self.scheduler.ensure_cache_available(request, num_computed_tokens)

    def update_state_after_alloc(self, request, index):
        self.scheduler.update_state_after_alloc(request, index)

    def update_state_after_free(self, request, index):
        return None  # encoder-cache frees arrive with build_connector_meta's scheduler output

    def build_connector_meta(self, scheduler_output):
        return self.scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output):
        self.scheduler.update_connector_output(connector_output)

    def take_unavailable_requests(self):
        return self.scheduler.take_unavailable_requests()

    def request_finished(self, request):
        return self.scheduler.request_finished(request)

    def has_pending_push_work(self):
        # Saves run on the worker's own thread and need no engine step.
        return False

    # ---- worker side ------------------------------------------------------

    def start_save_caches(self, **kwargs):
        if self.worker is not None:
            self.worker.start_save_caches(self._connector_metadata, kwargs.get("encoder_cache") or {})

    def save_caches(self, encoder_cache, mm_hash, **kwargs):
        """Queues the save of encoder_cache[mm_hash] and returns (a no-op on
        a consumer); see ecstore.vllm_worker."""
        if self.is_producer:
            self.worker.save_caches(encoder_cache, mm_hash)

    def wait_for_save(self, timeout_ms=-1):
        """Blocks until every queued save is stored or failed; returns the
        failures as (mm_hash, code).  vLLM never calls it; tests and
        scripts that must know a save landed do."""
        return self.worker.wait_for_save(timeout_ms)

    def start_load_caches(self, encoder_cache, **kwargs):
        """Adds this step's items to encoder_cache (views of this host's
        pool, or copies); a miss fails its requests, never raises."""
        self.worker.start_load_caches(self._connector_metadata, encoder_cache)

    def get_finished(self, finished_req_ids):
        """(mm_hashes whose saves are stored, mm_hashes loaded) since the
        last call, or None for an empty set."""
        return self.worker.get_finished()

    def build_connector_worker_meta(self):
        return self.worker.build_worker_meta() if self.worker is not None else None

    # ---- both ----------------------------------------------------------------

    def get_ec_connector_stats(self):
        side = self.scheduler or self.worker
        return side.get_stats() if side is not None else None

    @classmethod
    def build_ec_connector_stats(cls, data=None):
        return ECStoreConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return ECStorePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def describe(self):
        """The C connector's backend and data path, or "unavailable"."""
        conn = self._open()
        return conn.describe() if conn is not None else "unavailable"

    def shutdown(self):
        """Waits for queued saves (within timeout_ms), then closes.
        Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        tmo = int(self._c_cfg.get("timeout_ms", 10000)) / 1e3
        if self.worker is not None:
            self.worker.close(tmo)
        if self.scheduler is not None:
            self.scheduler.close()
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


__all__ = [
    "ECStoreConnector",
    "ECStoreConnectorMetadata",
    "ECStoreConnectorStats",
    "ECStoreLoadSpec",
    "ECStoreWorkerMetadata",
    "ECConnectorRole",
    "PY_KEYS",
    "cuda_register_mapping",
    "device_copy",
    "host_copy",
    "split_config",
]
