"""The scheduler role of ecstore.vllm.ECStoreConnector.

vLLM's scheduler asks, each step and for each request with images,
``ensure_cache_available(request, num_computed_tokens)`` first, then
``has_cache_item`` for each item it considers, then
``update_state_after_alloc`` for each item it loads or encodes, then
``build_connector_meta``.  Here:

- ``ensure_cache_available`` looks up the request's items it does not know
  yet, in one Redis round trip for the pending marks and one for the
  records (one of each per request, not per item).  An item nobody has nor
  is saving is left to vLLM (it encodes it).  An item stored or being saved
  is handed to the prefetch thread, and the request is deferred until the
  item is on this host's server and pinned there; an item that cannot be
  had by ``prefetch_timeout_ms`` fails its requests (through
  ``take_unavailable_requests``).  The hook itself never waits for the
  store, and never raises.
- ``has_cache_item`` answers from what ensure_cache_available learnt (no
  round trip); an item it has not seen costs one lookup, and an item being
  saved is True (a consumer never re-encodes an image that is about to
  land).
- the workers get, per item, its dtype and shape, and the requests of the
  step that wait for it (all of them: vLLM allocates a shared item once).

The prefetch thread (`_Prefetcher`) owns the pins: a view of the item on
the local server, which keeps it from being evicted until the worker has
loaded it (``finished_recving``) or its requests are gone.
"""

import collections
import os
import socket
import threading
import time

from . import codes
from . import tensors as _t
from .errors import EcstoreError
from .pending import PendingMarks, read_password_file
from .store import Store
from .vllm_common import (
    ECStoreConnectorMetadata,
    ECStoreConnectorStats,
    ECStoreLoadSpec,
    ECStoreWorkerMetadata,
    store_config,
)
from .vllm_stage import StageHub, channel_name

#: An item is first looked up (by the prefetch thread: is it stored or
#: being saved?), then fetched (to this host), then staged (its workers copy
#: it into their pinned memory; only where their loads would copy), then
#: ready.
LOOKUP, FETCHING, STAGING, READY = "lookup", "fetching", "staging", "ready"
#: An item found absent stays known absent this long (vLLM encodes it; a
#: request that wants it later looks again after).
_ABSENT_S = 1.0
#: A first look not settled by the prefetch thread within twice
#: redis_timeout_ms, and at least this long, leaves the item to vLLM (the
#: thread may be busy with other items' transfers meanwhile).
_LOOKUP_MIN_S = 1.0

#: Pause of the prefetch thread between tries of an item being saved, or
#: after a store error.
_POLL_S = 0.002
_ERROR_BACKOFF_S = 0.05
#: A pin is taken again after this long (servers drop a lease held longer
#: than --lease-timeout-ms, default 30 s).
_PIN_REFRESH_S = 10.0
#: After the local server said it cannot pull (ENOTSUP), prefetch gets and
#: puts for this long before it asks again.
_PULL_RETRY_S = 30.0


class _Item:
    __slots__ = ("state", "deadline", "t0", "waiters", "desc", "nbytes", "local", "busy", "expect", "stage_end",
                 "rows")

    def __init__(self, deadline, now):
        self.state = FETCHING
        self.deadline = deadline
        self.t0 = now
        self.waiters = set()  # request ids
        self.desc = None  # (dtype code, shape)
        self.nbytes = 0
        self.local = False  # on this host's server, pinned
        self.busy = False  # the prefetch thread is working on it
        self.expect = set()  # STAGING: the worker ranks that have not answered
        self.stage_end = 0.0  # STAGING: ready at this time even without their answers
        self.rows = 0  # embeddings a request expects of it (0: unknown): the worker's size guess


def make_marks(c_cfg, py):
    """The pending-mark link, or None without a redis_url."""
    url = c_cfg.get("redis_url")
    if not url or c_cfg.get("backend", "ecstore") != "ecstore":
        return None
    pw = None
    if c_cfg.get("redis_password_file"):
        pw = read_password_file(c_cfg["redis_password_file"])
    return PendingMarks(url, c_cfg.get("namespace") or "default", py["pending_ttl_ms"],
                        timeout_s=py["redis_timeout_ms"] / 1e3, password=pw)


class SchedulerSide:
    """The scheduler's half.  conn_fn() is the C connector (for has), or None
    while the store cannot be reached; drop_fn(conn, why) forgets it."""

    def __init__(self, vllm_config, c_cfg, py, warn, conn_fn, drop_fn, is_producer, is_consumer):
        self.cfg = vllm_config
        self.c_cfg, self.py = c_cfg, py
        self.warn = warn
        self.conn_fn, self.drop_fn = conn_fn, drop_fn
        self.is_producer, self.is_consumer = is_producer, is_consumer
        self.lock = threading.Condition()
        self.items = {}  # mm_hash -> _Item, consumer
        self.absent = {}  # mm_hash -> until when it is known absent
        self.loads = {}  # mm_hash -> ECStoreLoadSpec, until build_connector_meta
        self.in_cache = set()  # mm_hashes in vLLM's encoder cache (allocated, not yet freed)
        self.unavailable = set()
        self.saves = []  # producer: mm_hashes allocated for encoding this step
        self.answers = {}  # has_cache_item's answers this step: True means vLLM loads rather than encodes
        self.stats = ECStoreConnectorStats()
        self.marks = None
        try:
            self.marks = make_marks(c_cfg, py)
        except (OSError, ValueError) as e:
            self.warn.warn("marks", "ecstore EC connector: no pending marks (%s)", e)
        self.hub = None
        # staged items vLLM will not load: the prefetch thread tells the
        # workers (after any stage message it sent for them; never vLLM's
        # thread, which a worker's full socket would hold up)
        self.stage_drops = []
        if is_consumer and py["stage"] and py["prefetch"]:
            try:
                self.hub = StageHub(channel_name(vllm_config, py), self._staged, self._stage_gone, warn)
            except OSError as e:
                self.warn.warn("stage", "ecstore EC connector: no staging (stage channel: %s); loads that "
                               "copy do so in the step", e)
        self.prefetcher = None
        if is_consumer and py["prefetch"]:
            self.prefetcher = _Prefetcher(self)

    # ---- lookups ---------------------------------------------------------

    def _lookup(self, keys):
        """{key: "pending" | "stored" | "absent"} in two round trips at most
        (marks, then records for the unmarked).  Errors make keys absent."""
        out = {}
        rest = list(keys)
        if self.marks is not None:
            try:
                for k, p in zip(keys, self.marks.pending(keys)):
                    if p:
                        out[k] = "pending"
                rest = [k for k in keys if k not in out]
            except ConnectionError as e:
                self.warn.warn("store", "ecstore EC connector: pending marks unreadable: %s", e)
        if rest:
            conn = self.conn_fn()
            found = [False] * len(rest)
            if conn is not None:
                try:
                    found = conn.has_caches(rest)
                except EcstoreError as e:
                    if e.code == codes.EKEY:
                        found = self._has_one_by_one(conn, rest)
                    else:
                        self.drop_fn(conn, "has_cache_item: %s" % e)
                except Exception as e:  # noqa: BLE001 - the scheduler must never see one
                    self.warn.warn("has", "ecstore EC connector: lookup failed: %r", e)
            for k, f in zip(rest, found):
                out[k] = "stored" if f else "absent"
        return out

    def _has_one_by_one(self, conn, keys):
        out = []
        for k in keys:
            try:
                out.append(conn.has_caches([k])[0])
            except EcstoreError as e:
                self.warn.warn("key", "ecstore EC connector: has_cache_item(%r): %s", k, e)
                out.append(False)
        return out

    def _start(self, keys, now):
        """Looks up keys and starts a prefetch for each stored or pending one."""
        states = self._lookup(keys)
        deadline = now + self.py["prefetch_timeout_ms"] / 1e3
        with self.lock:
            for k in keys:
                if states[k] == "absent":
                    self.absent[k] = now + _ABSENT_S
                elif k not in self.items:
                    it = self.items[k] = _Item(deadline, now)
                    self.stats.add("prefetches")
                    if self.prefetcher is None and states[k] == "stored":
                        it.state = READY  # prefetch off: the worker reads it from its holder
            self.lock.notify_all()
        return states

    def _poll_without_prefetcher(self, keys, now):
        """Prefetch off: items whose save was pending are looked up again;
        stored ones are ready, gone ones fail."""
        states = self._lookup(keys)
        with self.lock:
            for k in keys:
                it = self.items.get(k)
                if it is None:
                    continue
                if states[k] == "stored":
                    it.state = READY
                    self.stats.observe("prefetch_s", now - it.t0)
                elif states[k] == "absent":
                    self._fail_locked(k, "no longer stored, and no save pending")

    # ---- vLLM's calls ------------------------------------------------------

    def ensure_cache_available(self, request, num_computed_tokens):
        if not self.is_consumer:
            return True
        try:
            return self._ensure(request, num_computed_tokens)
        except Exception as e:  # noqa: BLE001 - never an exception out of a hook
            self.warn.warn("ensure", "ecstore EC connector: ensure_cache_available(%s): %r", request.request_id, e)
            return True

    def _ensure(self, request, num_computed_tokens):
        now = time.monotonic()
        need = []
        rows = {}
        for i, f in enumerate(request.mm_features):
            pos = f.mm_position
            if pos.offset + pos.length <= num_computed_tokens or f.identifier in self.in_cache:
                continue
            need.append(f.identifier)
            rows[f.identifier] = _rows(request, i)
        if not need:
            return True
        with self.lock:
            unknown = list(dict.fromkeys(h for h in need if h not in self.items and not self._known_absent(h, now)))
            if unknown and self.prefetcher is not None:
                # The prefetch thread looks them up (one batch), never this
                # thread: the request waits a step, vLLM's scheduler never
                # waits for Redis.
                end = now + max(_LOOKUP_MIN_S, 2 * self.py["redis_timeout_ms"] / 1e3)
                for h in unknown:
                    it = self.items[h] = _Item(end, now)
                    it.state = LOOKUP
                self.lock.notify_all()
        if unknown and self.prefetcher is None:
            self._start(unknown, now)
        if self.prefetcher is None:
            with self.lock:
                waiting = [h for h in need if h in self.items and self.items[h].state != READY]
            if waiting:
                self._poll_without_prefetcher(waiting, now)
        ready = True
        failed = []
        with self.lock:
            for h in need:
                it = self.items.get(h)
                if it is None:
                    continue  # absent: vLLM encodes it
                it.rows = it.rows or rows[h]
                if it.state == LOOKUP and now >= it.deadline:
                    self._absent_locked(h)  # not looked up in time: vLLM encodes it
                    continue
                it.waiters.add(request.request_id)
                if it.state == STAGING and now >= it.stage_end:
                    self._stage_done_locked(it, "stage_timeouts")
                if it.state == READY:
                    continue
                ready = False
                if now >= it.deadline and it.state != STAGING:  # a stage ends at stage_end
                    failed.append(h)
            for h in failed:
                self._fail_locked(h, "not here after %d ms" % self.py["prefetch_timeout_ms"])
        if not ready:
            self.stats.add("prefetch_waits")
        return ready

    # ---- staging (hub thread) --------------------------------------------

    def _stage_done_locked(self, it, counter=None):
        it.state = READY
        it.expect = set()
        if counter:
            self.stats.add(counter)
        self.stats.observe("prefetch_s", time.monotonic() - it.t0)

    def _staged(self, rank, staged, failed):
        """A worker's answer: each item is ready once every rank asked
        answered (a failed stage still is: the load copies)."""
        with self.lock:
            for h in staged + failed:
                it = self.items.get(h)
                if it is not None and it.state == STAGING:
                    it.expect.discard(rank)
                    if not it.expect:
                        self._stage_done_locked(it)
            if failed:
                self.stats.add("stage_failed", len(failed))
            self.lock.notify_all()

    def _stage_gone(self, rank):
        """A worker went: nothing waits for its answers."""
        with self.lock:  # a Condition over an RLock: _staged takes it again
            self._staged(rank, [h for h, it in self.items.items() if it.state == STAGING], [])

    def _stage(self, specs):
        """Prefetch thread: items just ready on this host (h, desc, nbytes,
        local); those the workers would copy are staged first."""
        zero_copy = self.py["zero_copy"]
        ranks = self.hub.ranks() if self.hub is not None else set()
        now = time.monotonic()
        with self.lock:
            go, ask = [], []
            for h, desc, n, local in specs:
                it = self.items.get(h)
                if it is None:
                    if local:
                        self._unpin(h)  # gone while the prefetch pinned it
                    continue
                it.desc, it.nbytes, it.local = desc, max(0, n), local
                if ranks and not (zero_copy and local):
                    it.state, it.expect = STAGING, set(ranks)
                    it.stage_end = now + self.py["stage_timeout_ms"] / 1e3
                    go.append(h)
                    # an item without desc (read from its holder by the
                    # worker, see _Prefetcher._direct) goes as size, dtype
                    # and shape unknown, with the rows a request expects
                    ask.append((h, n, desc[0], desc[1]) if desc is not None
                               else (h, -1, -1, (it.rows,) if it.rows else ()))
                else:
                    self._stage_done_locked(it)
        if not go:
            return
        asked = self.hub.stage(ask)
        with self.lock:
            for h in go:
                it = self.items.get(h)
                if it is None:
                    # gone while the message went (its drop may have gone
                    # first): tell the workers again after it
                    self.stage_drops.append(h)
                elif it.state == STAGING:
                    it.expect &= asked
                    if not it.expect:
                        self._stage_done_locked(it)
            self.lock.notify_all()

    def _known_absent(self, h, now):
        return self.absent.get(h, 0) > now

    def _unpin(self, h):
        """Lets go of h's pin, if the prefetch holds one (it may have pinned
        h before h's item learnt it was local)."""
        if self.prefetcher is not None:
            self.prefetcher.unpin(h)

    def _absent_locked(self, h):
        """h's first look found it neither stored nor being saved."""
        self.items.pop(h, None)
        self.absent[h] = time.monotonic() + _ABSENT_S
        self._unpin(h)

    def _fail_locked(self, h, why):
        it = self.items.pop(h, None)
        if it is None:
            return
        if self.hub is not None:
            self.stage_drops.append(h)
        self.unavailable |= it.waiters
        self.stats.add("prefetch_failed")
        self.warn.warn("prefetch", "ecstore EC connector: item %s unavailable (%s); requests %s fail (retryable)",
                       h, why, sorted(it.waiters))
        self._unpin(h)

    def has_cache_item(self, identifier):
        """True when identifier is ready here, being fetched, stored or being
        saved; False (vLLM encodes it) otherwise, and on any error."""
        try:
            with self.lock:
                it = self.items.get(identifier)
                if it is not None and it.state != LOOKUP:
                    found = True
                elif it is None and self._known_absent(identifier, time.monotonic()):
                    found = False
                else:
                    found = None
            if found is None:
                found = self._lookup([identifier])[identifier] != "absent"
        except Exception as e:  # noqa: BLE001 - the scheduler must never see one
            self.warn.warn("has", "ecstore EC connector: has_cache_item(%r) failed: %r", identifier, e)
            found = False
        self.answers[identifier] = found
        self.stats.add("hits" if found else "misses")
        return found

    def update_state_after_alloc(self, request, index):
        feature = request.mm_features[index]
        h = feature.identifier
        self.in_cache.add(h)
        # vLLM asked has_cache_item just before: True means it loads the item.
        external = self.answers[h] if h in self.answers else self.has_cache_item(h)
        if external and self.is_consumer:
            spec = self.loads.get(h)
            if spec is None:
                with self.lock:
                    it = self.items.get(h)
                    desc = it.desc if it is not None and it.state == READY else None
                    local = bool(it is not None and it.local)
                spec = ECStoreLoadSpec(h, int(request.get_num_encoder_embeds(index)), desc=desc, local=local)
                self.loads[h] = spec
            if request.request_id not in spec.req_ids:
                spec.req_ids.append(request.request_id)
        elif self.is_producer and not external:
            self.saves.append(h)  # encoded this step: marked pending before the model runs

    def build_connector_meta(self, scheduler_output):
        for h in getattr(scheduler_output, "free_encoder_mm_hashes", None) or ():
            self.in_cache.discard(h)
        scheduled = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
        with self.lock:
            for h, spec in self.loads.items():
                it = self.items.get(h)
                # vLLM allocates an item shared by two requests once: every
                # scheduled request that waits for it is named here, so a
                # failed load fails each of them.
                for r in sorted(it.waiters) if it is not None else ():
                    if r in scheduled and r not in spec.req_ids:
                        spec.req_ids.append(r)
            now = time.monotonic()
            self.absent = {h: t for h, t in self.absent.items() if t > now}
            if self.stage_drops:
                self.lock.notify_all()  # the prefetch thread tells the workers
        self.answers = {}
        meta = ECStoreConnectorMetadata(loads=list(self.loads.values()), saves=list(dict.fromkeys(self.saves)))
        self.loads = {}
        self.saves = []
        return meta

    def update_connector_output(self, connector_output):
        meta = getattr(connector_output, "ec_connector_worker_meta", None)
        if isinstance(meta, ECStoreWorkerMetadata) and meta.failed_req_ids:
            self.unavailable |= set(meta.failed_req_ids)
        done = getattr(connector_output, "finished_recving", None) or ()
        with self.lock:
            for h in done:
                it = self.items.pop(h, None)
                if it is not None:
                    self._unpin(h)
                if it is not None and self.hub is not None:
                    # loaded: a copy a worker staged too late (after the
                    # stage timeout) is nobody's now
                    self.stage_drops.append(h)

    def take_unavailable_requests(self):
        with self.lock:
            out, self.unavailable = self.unavailable, set()
        return out

    def request_finished(self, request):
        """(False, params): the encoder cache entry may go at once (a save
        holds its own reference to the tensor until the bytes are copied
        out, see the worker).  params, per mm_hash of the request: where it
        is stored (holder, namespace), its size, dtype and shape as this
        model produces them, its modality and positions in the request."""
        rid = request.request_id
        if self.is_consumer:
            with self.lock:
                for f in request.mm_features:
                    it = self.items.get(f.identifier)
                    if it is None:
                        continue
                    it.waiters.discard(rid)
                    if not it.waiters:
                        self.items.pop(f.identifier, None)
                        self._unpin(f.identifier)
                        if self.hub is not None:
                            self.stage_drops.append(f.identifier)  # staged for nobody now
        if not self.is_producer or not request.mm_features:
            return False, None
        try:
            return False, self._params(request)
        except Exception as e:  # noqa: BLE001 - params are a courtesy, never a failure
            self.warn.warn("params", "ecstore EC connector: ec_transfer_params of %s: %r", rid, e)
            return False, None

    def _params(self, request):
        holder = self.py["local_server"] or self.c_cfg.get("servers") or "redis:" + str(self.c_cfg.get("redis_url"))
        mc = getattr(self.cfg, "model_config", None)
        items = {}
        for i, f in enumerate(request.mm_features):
            e = items.get(f.identifier)
            if e is None:
                e = items[f.identifier] = {"modality": f.modality, "item_indices": [], "holder": holder,
                                           "namespace": self.c_cfg.get("namespace") or "default"}
                if mc is not None:
                    dtype = mc.dtype
                    width = _width(self.cfg, f.modality, mc)
                    shape = [int(request.get_num_encoder_embeds(i)), int(width)]
                    e.update(dtype=str(dtype).replace("torch.", ""), shape=shape,
                             nbytes=shape[0] * shape[1] * dtype.itemsize)
            e["item_indices"].append(i)
        return items

    def has_pending_push_work(self):
        return False

    def get_stats(self):
        with self.lock:
            if self.stats.is_empty():
                return None
            return self.stats.take()

    def close(self):
        if self.prefetcher is not None:
            self.prefetcher.close()
        if self.hub is not None:
            self.hub.close()
        if self.marks is not None:
            self.marks.close()


def _rows(request, index):
    """How many embeddings the request expects of its index-th item (0
    when it cannot say)."""
    try:
        n = int(request.get_num_encoder_embeds(index))
    except Exception:  # noqa: BLE001 - only a guess
        return 0
    return n if 0 < n < 1 << 32 else 0


def _width(vllm_config, modality, mc):
    try:
        from vllm.distributed.ec_transfer.ec_connector.encoder_output_width import get_encoder_output_width

        return get_encoder_output_width(vllm_config, modality)
    except Exception:  # noqa: BLE001 - older vLLM, or a model it cannot size
        return mc.get_hidden_size()


# ---------------------------------------------------------------------------
# the prefetch thread


class _Prefetcher:
    """Brings items to this host's ecstore-server and pins them there.

    For each item the scheduler hands it, the local server pulls it from
    its holder (found through Redis), server to server, into its own pool
    (one copy, no Python in the byte path; the server answers at once for
    an item it has), then a view (shm) pins it there; an item no holder
    gave (Redis does not know it, or cannot be read) is pinned if the local
    server has it all the same.  A local server that cannot pull (older,
    or without Redis) is asked for views first, and gets the rest the old
    way: read from the holder into this process, put into the local
    server.  Every TP rank and every vLLM instance on the host then reads
    that one copy.  An item whose save is still pending is tried again
    every few ms.  Everything here runs on this one thread, which owns the
    pins (they belong to its connection)."""

    def __init__(self, side):
        self.side = side
        self.py = side.py
        self.pins = {}  # mm_hash -> (Views, index)
        self.pinned_at = {}  # mm_hash -> when its pin was taken
        self.next_refresh = 0.0
        self.unpins = collections.deque()
        self.closed = False
        self.local = self.remote = None
        self.local_nv = None  # the local server again, without the checksum pass (see _pin_ready)
        self.pull_off_until = 0.0  # the local server cannot pull: get+put until then
        self.next_open = 0.0
        self.done = []  # (h, desc, nbytes, local) ready this pass, see _ready
        self.known = set()  # items this pass found stored or being saved
        self.marks_down = False  # this pass could not read the pending marks
        self.thread = threading.Thread(target=self._main, name="ecstore-prefetch", daemon=True)
        self.thread.start()

    def unpin(self, h):
        """Called by the scheduler (any thread): let go of h's pin."""
        self.unpins.append(h)
        with self.side.lock:
            self.side.lock.notify_all()

    def close(self):
        self.closed = True
        with self.side.lock:
            self.side.lock.notify_all()
        self.thread.join(5.0)

    def _open(self):
        """(local Store or None, remote Store or None); each one that could
        not be opened is tried again every reopen_interval_s."""
        c = self.side.c_cfg
        want_local = bool(self.py["local_server"])
        want_remote = bool(c.get("redis_url")) or not want_local
        if (self.local is not None or not want_local) and (self.remote is not None or not want_remote):
            return self.local, self.remote
        if time.monotonic() < self.next_open:
            return self.local, self.remote
        self.next_open = time.monotonic() + self.side.py["reopen_interval_s"]
        tmo = min(int(c.get("timeout_ms", 10000)), max(1, self.py["prefetch_timeout_ms"]))
        try:
            if want_local and self.local is None:
                lc = store_config(c, servers=self.py["local_server"], redis_url=None, timeout_ms=tmo,
                                  transport="auto", compression=None, placement=None, replicas=None)
                self.local = Store(lc)
                self.local_nv = Store(dict(lc, verify_checksum=False))
            if want_remote and self.remote is None:
                if c.get("redis_url"):  # holders found through Redis
                    self.remote = Store(store_config(c, servers=None, timeout_ms=tmo, placement=None, replicas=None))
                else:
                    self.remote = Store(store_config(c, timeout_ms=tmo))
        except EcstoreError as e:
            self.side.warn.warn("prefetch-open", "ecstore EC connector: prefetch cannot reach the store: %s", e)
        return self.local, self.remote

    def _send_drops(self):
        with self.side.lock:
            drops, self.side.stage_drops = self.side.stage_drops, []
        if drops and self.side.hub is not None:
            self.side.hub.drop(drops)

    def _main(self):
        while not self.closed:
            self._send_drops()
            self._release()
            self._refresh()
            with self.side.lock:
                todo = [h for h, it in self.side.items.items() if it.state in (LOOKUP, FETCHING) and not it.busy]
                if not todo:
                    self.side.lock.wait(0.05)
                    continue
                for h in todo:
                    self.side.items[h].busy = True
            try:
                again = self._fetch(todo)
            except Exception as e:  # noqa: BLE001 - this thread must live on
                self.side.warn.warn("prefetch", "ecstore EC connector: prefetch: %r", e)
                again = True
            try:
                self._flush_ready()
            except Exception as e:  # noqa: BLE001 - this thread must live on
                self.side.warn.warn("prefetch", "ecstore EC connector: staging: %r", e)
            with self.side.lock:
                for h in todo:
                    it = self.side.items.get(h)
                    if it is not None:
                        it.busy = False
            if self.marks_down:
                time.sleep(_ERROR_BACKOFF_S)  # Redis cannot be read: not every 2 ms
            elif again:
                time.sleep(_POLL_S)
        self._release()
        for views, i in list(self.pins.values()):
            views.release_items([i])
        self.pins.clear()
        for s in (self.local, self.local_nv, self.remote):
            if s is not None:
                s.close()

    def _refresh(self):
        """Pins older than _PIN_REFRESH_S are taken again (then the old
        ones released), so that the server's lease timeout never ends the
        pin of an item whose request waits long after it became ready."""
        now = time.monotonic()
        if now < self.next_refresh or self.local is None:
            return
        self.next_refresh = now + 1.0
        old = [h for h, t in self.pinned_at.items() if now - t > _PIN_REFRESH_S and h in self.pins]
        if not old:
            return
        fresh = self._pin(self.local, old)
        for h in old:
            pin = fresh.get(h)
            if pin is None:
                continue  # gone from the local server: the load will say so
            self._hold(h, pin)

    def _hold(self, h, pin):
        """Keeps pin as h's, releasing the one held before."""
        old = self.pins.pop(h, None)
        self.pins[h] = pin
        self.pinned_at[h] = time.monotonic()
        if old is not None:
            old[0].release_items([old[1]])

    def _release(self):
        while self.unpins:
            h = self.unpins.popleft()
            with self.side.lock:
                if h in self.side.items:
                    continue  # wanted again meanwhile
            pin = self.pins.pop(h, None)
            self.pinned_at.pop(h, None)
            if pin is not None:
                pin[0].release_items([pin[1]])

    def _ready(self, h, desc, nbytes, local, t0=None):
        """h is on this host (or known stored, without a local server):
        ready, or staged first, at the end of this pass (_flush_ready).
        False when nobody wants h any more."""
        with self.side.lock:
            if h not in self.side.items:
                return False
        self.done.append((h, desc, nbytes, local))
        return True

    def _flush_ready(self):
        done, self.done = self.done, []
        if done:
            self.side._stage(done)

    def _pin(self, local, keys):
        """Views of keys on the local server: {key: (views, i)} of the hits."""
        got = {}
        if local is None or not keys:
            return got
        try:
            views = local.get_views(keys)
        except EcstoreError as e:
            self.side.warn.warn("pin", "ecstore EC connector: local server: %s", e)
            return got
        for i, k in enumerate(keys):
            if views.statuses[i] == 0:
                got[k] = (views, i)
        rest = [i for i in range(len(keys)) if views.statuses[i] != 0]
        if rest:
            views.release_items(rest)
        return got

    def _fetch(self, todo):
        """One pass over todo; True when something must be tried again soon.
        Then each of todo's first looks (LOOKUP) is settled: found (ready
        or staging now), being saved or known stored (FETCHING), or absent
        (vLLM encodes it); one the pass could not tell (an error) is looked
        at again, until its deadline leaves it to vLLM."""
        gone, unsure, again = set(), True, True
        self.known = set()
        self.marks_down = False
        try:
            again, gone, unsure = self._fetch_pass(todo)
        finally:
            ready = {d[0] for d in self.done}
            with self.side.lock:
                for h in todo:
                    it = self.side.items.get(h)
                    if it is None or it.state != LOOKUP:
                        continue
                    if h not in ready and (h in gone or (unsure and h not in self.known)):
                        self.side._absent_locked(h)  # (located, then gone: not coming either)
                    elif h in ready or h in self.known:
                        self.side.stats.add("prefetches")
                        it.state = FETCHING  # ready ones leave it at _flush_ready
                        it.deadline = it.t0 + self.py["prefetch_timeout_ms"] / 1e3
                    elif time.monotonic() >= it.deadline:
                        self.side._absent_locked(h)  # not told in time: vLLM encodes it
                    else:
                        again = True
                self.side.lock.notify_all()
        return again

    def _fetch_pass(self, todo):
        """(again, gone, unsure): gone holds the items of todo no holder
        has and no save is pending for; unsure says the pass could not
        tell (no store, marks unreadable)."""
        local, remote = self._open()
        if local is None and remote is None:
            return True, set(), True
        again = False
        direct = self._direct()
        pulls = not direct and local is not None and remote is not None and time.monotonic() >= self.pull_off_until
        # 1. already on this host: pin it.  Not when the worker reads from
        # the holders anyway (the staged copy keeps the item), nor when the
        # local server pulls: it answers for what it has already (one round
        # trip less per pass).
        pinned = self._pin_here(local, todo) if not (direct or pulls) else {}
        missing = [h for h in todo if h not in pinned]
        if not missing:
            return False, set(), False
        if remote is None:
            return True, set(), True  # nowhere else to look; the deadline ends it
        # 2. from its holder, through this host's server when there is one.
        # The marks are read before the get: a save commits its record
        # before it deletes its mark, so a key unmarked before a get that
        # misses is not coming.
        pend, unsure = {}, False
        if self.side.marks is not None:
            try:
                pend = dict(zip(missing, self.side.marks.pending(missing)))
                self.known.update(h for h, p in pend.items() if p)
            except ConnectionError:
                pend = {h: True for h in missing}  # unknown: keep trying until the deadline
                unsure = self.marks_down = True
        looked = list(missing)
        gone, missing = [], list(missing)
        if unsure and pulls:
            missing = []  # Redis cannot be read: only the local server can say (below)
            again = True
        if direct:
            gone, missing = self._direct_ready(remote, missing)
        if missing and local is not None and time.monotonic() >= self.pull_off_until:
            pulled, lost, missing, more = self._pull(local, remote, missing)
            gone += lost
            again |= more
        if missing:
            got, lost, more = self._get_put(local, remote, missing)
            gone += lost
            again |= more
        if pulls:
            # What no holder gave (Redis does not know it, or cannot be
            # read) may be on the local server all the same.
            ready = {d[0] for d in self.done}
            left = [h for h in looked if h not in ready and (unsure or not pend.get(h))]
            here = self._pin_here(local, left) if left else {}
            gone = [h for h in gone if h not in here]
        # 3. not stored anywhere (yet): pending, or gone.
        out = set()
        if gone:
            with self.side.lock:
                for h in gone:
                    it = self.side.items.get(h)
                    if pend.get(h):
                        again = True
                    elif it is not None and it.state != LOOKUP:
                        self.side._fail_locked(h, "no longer stored, and no save pending")
                    else:
                        out.add(h)
        return again, out, unsure

    def _direct(self):
        """True when the worker stages straight from the holders: it
        cannot view this host's pool (zero_copy off) and is the one rank
        that stages, so a pull into the local server would only add a copy
        (with more ranks the local copy saves the network a crossing per
        rank)."""
        hub = self.side.hub
        return hub is not None and not self.py["zero_copy"] and len(hub.ranks()) == 1

    def _direct_ready(self, remote, keys):
        """Items some holder has are ready for staging from there (their
        dtype and shape are the worker's to learn); returns (gone, rest):
        rest (lookup errors) goes the usual way."""
        try:
            locs = remote.locate(keys)
        except EcstoreError as e:
            self.side.warn.warn("prefetch-locate", "ecstore EC connector: prefetch locate: %s", e)
            return [], keys
        for h, loc in zip(keys, locs):
            if loc[0] == 0:
                self._ready(h, None, -1, False)
        gone = [h for h, loc in zip(keys, locs) if loc[0] == codes.ENOTFOUND]
        rest = [h for h, loc in zip(keys, locs) if loc[0] not in (0, codes.ENOTFOUND)]
        return gone, rest

    def _pin_here(self, local, keys):
        """Pins those of keys on the local server and marks them ready;
        returns {key: pin} of those."""
        pinned = self._pin(local, keys)
        for h, pin in pinned.items():
            self._hold(h, pin)
            if not self._ready(h, pin[0].descs[pin[1]], pin[0].nbytes[pin[1]], True):
                self.unpins.append(h)
        return pinned

    def _pin_ready(self, local, keys):
        """Pins keys just brought to the local server and marks them ready;
        returns the ones pinned.  The bytes were checked on their way in
        (by the pull's server, or the get), so the pin does not read them
        all again."""
        pinned = self._pin_here(self.local_nv or local, keys)
        with self.side.lock:
            self.side.stats.add("prefetch_bytes", sum(pin[0].nbytes[pin[1]] for pin in pinned.values()))
        return pinned

    def _pull(self, local, remote, keys):
        """Server to server: this host's server fetches each key from its
        holder into its own pool (Store.pull: one copy, no Python in the
        byte path), then it is pinned.  Returns (pinned, gone, rest): rest
        is left to get+put (no pull there, a holder the server would not or
        could not reach), again says some key is to be tried once more (being
        written on this host by another puller: it is local next pass)."""
        try:
            locs = remote.locate(keys)
        except EcstoreError as e:
            self.side.warn.warn("prefetch-locate", "ecstore EC connector: prefetch locate: %s", e)
            return {}, [], keys, False
        ask = [(h, loc[1]) for h, loc in zip(keys, locs) if loc[0] == 0]
        self.known.update(h for h, _ in ask)
        gone = [h for h, loc in zip(keys, locs) if loc[0] == codes.ENOTFOUND]
        rest = [h for h, loc in zip(keys, locs) if loc[0] not in (0, codes.ENOTFOUND)]
        if not ask:
            return {}, gone, rest, False
        try:
            sts = local.pull([h for h, _ in ask], [a for _, a in ask])
        except EcstoreError as e:
            if e.code == codes.ENOTSUP:  # an older local server, or one without Redis
                self.pull_off_until = time.monotonic() + _PULL_RETRY_S
                self.side.warn.warn("prefetch-pull", "ecstore EC connector: local server cannot pull (%s); "
                                    "prefetch gets and puts instead", e)
            else:
                self.side.warn.warn("prefetch-pull", "ecstore EC connector: prefetch pull: %s", e)
            return {}, [], keys, False
        # EINVAL: the holder is the local server itself (committed objects
        # there were checked on their way in, as pulled ones are)
        ok = [h for (h, _), st in zip(ask, sts) if st in (0, codes.EINVAL)]
        gone += [h for (h, _), st in zip(ask, sts) if st == codes.ENOTFOUND]
        busy = [h for (h, _), st in zip(ask, sts) if st == codes.EBUSY]
        rest += [h for (h, _), st in zip(ask, sts) if st not in (0, codes.EINVAL, codes.ENOTFOUND, codes.EBUSY)]
        pinned = self._pin_ready(local, ok)
        with self.side.lock:
            self.side.stats.add("prefetch_pulled", len(pinned))
        rest += [h for h in ok if h not in pinned]  # evicted already: try the other way
        return pinned, gone, rest, bool(busy)

    def _get_put(self, local, remote, keys):
        """From the holder into this process, then into this host's server
        (two copies; for a local server that cannot pull, and what pulls
        left).  Returns (pinned, gone, again)."""
        try:
            tensors, statuses = remote.batch_get_tensors(keys, with_status=True)
        except EcstoreError as e:
            self.side.warn.warn("prefetch-get", "ecstore EC connector: prefetch get: %s", e)
            time.sleep(_ERROR_BACKOFF_S)
            return {}, [], True
        again = False
        pinned = {}
        hits = [(h, t) for h, t, st in zip(keys, tensors, statuses) if st == 0 and t is not None]
        self.known.update(h for h, _ in hits)
        if hits and local is not None:
            try:
                st = local.batch_put_tensors([h for h, _ in hits], [t for _, t in hits])
            except EcstoreError as e:
                st = [e.code] * len(hits)
                self.side.warn.warn("prefetch-put", "ecstore EC connector: prefetch put: %s", e)
            pinned = self._pin_ready(local, [h for (h, _), s in zip(hits, st) if s == 0])
            again |= len(pinned) < len(hits)
        elif hits:  # no local server: the worker reads from the holder
            for h, t in hits:
                code = _t.parse_dtype(str(t.dtype).replace("torch.", ""))
                self._ready(h, (code, tuple(t.shape)), t.numel() * t.element_size(), False)
            with self.side.lock:
                self.side.stats.add("prefetch_bytes", sum(t.numel() * t.element_size() for _, t in hits))
        gone = [h for h, t, st in zip(keys, tensors, statuses) if not (st == 0 and t is not None)]
        return pinned, gone, again


def host_id():
    return "%s:%d" % (socket.gethostname(), os.getpid())
