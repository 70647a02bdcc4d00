"""What the two roles of ecstore.vllm.ECStoreConnector share: the
configuration, the metadata passed between them, the stats vLLM shows, and
the rate-limited warnings.  See ecstore/vllm.py and docs/vllm.md."""

import collections
import threading
import time
from dataclasses import dataclass, field

from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorMetadata, ECConnectorWorkerMetadata
from vllm.distributed.ec_transfer.ec_connector.metrics import ECConnectorPromMetrics, ECConnectorStats
from vllm.logger import init_logger

from . import codes
from . import tensors as _t
from .errors import EcstoreError, make_error

logger = init_logger("ecstore.vllm")


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


def _ms(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise ValueError(v)
    return int(v)


_ms.__name__ = "non-negative number of milliseconds"


def _flag(v):
    if not isinstance(v, bool):
        raise ValueError(v)
    return v


_flag.__name__ = "bool"

#: Keys of ``ec_connector_extra_config`` read here rather than by the C
#: connector: name -> (type, default, meaning).
PY_KEYS = {
    "load_device": (str, None, "device the loaded tensors go to (default: the worker's device)"),
    "load_pool_bytes": (_size, 256 << 20, "pinned host pool the copied loads land in (0: plain torch memory)"),
    "warn_interval_s": (float, 30.0, "at most one store-error warning per interval, per kind"),
    "reopen_interval_s": (float, 5.0, "how soon a connector that could not open tries again"),
    "local_server": (str, None, "this host's ecstore-server (default: `servers` when it names one)"),
    "prefetch": (_flag, True, "consumer: bring items to the local server before vLLM schedules them"),
    "prefetch_timeout_ms": (_ms, 10000, "consumer: a prefetch not done by then fails its requests"),
    "pending_ttl_ms": (_ms, 10000, "producer: life of a pending mark whose save never ends"),
    "redis_timeout_ms": (_ms, 500, "deadline of one pending-mark call to Redis"),
    "zero_copy": (_flag, True, "consumer worker: hand out views of the local pool (shm) rather than copies"),
    "view_hold_s": (float, 10.0, "consumer worker: a view vLLM keeps longer is swapped for a copy"),
    "stage": (_flag, True, "consumer: where loads would copy (no shm view), the workers copy each item into "
                           "pinned memory while vLLM defers its request, so the load step only hands it over"),
    "stage_timeout_ms": (_ms, 2000, "consumer: an item whose workers have not staged it by then is ready anyway "
                                    "(its load copies in the step)"),
    "stage_ttl_s": (float, 120.0, "consumer worker: a staged item vLLM has not loaded by then is dropped"),
    "stage_channel": (str, None, "consumer: name of the scheduler-to-worker stage socket (default: from vLLM's "
                                 "instance id and data-parallel rank)"),
}


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
    if py["local_server"] is None:
        servers = c_cfg.get("servers") or ""
        servers = servers if isinstance(servers, (list, tuple)) else [s for s in str(servers).split(",") if s]
        if len(servers) == 1:
            py["local_server"] = str(servers[0]).strip()
    return c_cfg, py


#: C connector keys that mean the same to a Store (ecstore.Store).
_STORE_KEYS = {"redis_url": "redis_url", "namespace": "namespace", "auth_token": "auth_token",
               "connect_timeout_ms": "connect_timeout_ms", "timeout_ms": "timeout_ms",
               "compression": "compression", "device": "rdma_device", "rdma_port": "rdma_port",
               "rdma_gid_index": "rdma_gid_index", "placement": "placement", "replicas": "replicas"}


def store_config(c_cfg, **over):
    """A Store config (ecstore.Store keys) from the C connector's, with
    over applied (None values dropped)."""
    out = {}
    for k, v in c_cfg.items():
        if k in _STORE_KEYS and v not in (None, ""):
            out[_STORE_KEYS[k]] = v
    servers = c_cfg.get("servers")
    if servers:
        out["servers"] = servers
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def model_row(vllm_config):
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


def close_quietly(obj):
    try:
        obj.close()
    except EcstoreError:
        pass


class Throttle:
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
# metadata


@dataclass
class ECStoreLoadSpec:
    """One item a consumer worker loads this step."""

    mm_hash: str
    num_embeds: int  # tokens the scheduler reserved for it (a size hint)
    req_ids: list = field(default_factory=list)  # every scheduled request that waits for it
    desc: tuple = None  # (dtype code, shape) when the prefetch saw the object, else None
    local: bool = False  # prefetched into this host's server (and pinned there)


@dataclass
class ECStoreConnectorMetadata(ECConnectorMetadata):
    """Scheduler -> worker, once per step."""

    loads: list = field(default_factory=list)  # [ECStoreLoadSpec]
    saves: list = field(default_factory=list)  # mm_hashes this step encodes (producer): marked pending first


@dataclass
class ECStoreWorkerMetadata(ECConnectorWorkerMetadata):
    """Worker -> scheduler, once per step: the requests whose items could not
    be loaded."""

    failed_req_ids: set = field(default_factory=set)

    def aggregate(self, other):
        return ECStoreWorkerMetadata(set(self.failed_req_ids) | set(other.failed_req_ids))


# ---------------------------------------------------------------------------
# stats

#: Counters (summed) and series of seconds (pooled) in ECStoreConnectorStats.data.
COUNTERS = ("hits", "misses", "prefetches", "prefetch_waits", "prefetch_failed", "prefetch_bytes", "prefetch_pulled",
            "loads", "load_bytes", "load_failed", "load_copies", "load_staged", "stage_failed", "stage_timeouts",
            "saves", "save_bytes", "save_failed")
SERIES = ("prefetch_s", "load_s", "save_s")
_MAX_SERIES = 4096


@dataclass
class ECStoreConnectorStats(ECConnectorStats):
    """ecstore's counters for vLLM's EC transfer metrics (summed over the
    scheduler and every worker): hits/misses of has_cache_item, prefetches
    (started, steps a request waited, failed, bytes brought to this host,
    items the local server pulled from their holders itself),
    loads (items, bytes, failed, copied rather than viewed), saves (items,
    bytes, failed), and latency series (seconds) of prefetches, loads and
    saves."""

    def __post_init__(self):
        for k in COUNTERS:
            self.data.setdefault(k, 0)
        for k in SERIES:
            self.data.setdefault(k, [])

    def add(self, key, n=1):
        self.data[key] = self.data.get(key, 0) + n

    def observe(self, key, seconds):
        s = self.data.setdefault(key, [])
        if len(s) < _MAX_SERIES:
            s.append(float(seconds))

    def reset(self):
        self.data = {}
        self.__post_init__()

    def aggregate(self, other):
        for k, v in (other.data or {}).items():
            if isinstance(v, list):
                self.data.setdefault(k, []).extend(v[: max(0, _MAX_SERIES - len(self.data.get(k, [])))])
            elif isinstance(v, (int, float)):
                self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self):
        out = {k: self.data.get(k, 0) for k in COUNTERS}
        for k in SERIES:
            s = sorted(self.data.get(k) or [])
            name = k[:-2]
            out[name + "_p50_ms"] = round(s[len(s) // 2] * 1e3, 3) if s else 0.0
            out[name + "_max_ms"] = round(s[-1] * 1e3, 3) if s else 0.0
        return out

    def is_empty(self):
        return not any(self.data.get(k) for k in COUNTERS + SERIES)

    def take(self):
        """A copy of the data, and a reset (what get_ec_connector_stats returns)."""
        out = ECStoreConnectorStats(data={k: (list(v) if isinstance(v, list) else v) for k, v in self.data.items()})
        self.reset()
        return out


_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


class ECStorePromMetrics(ECConnectorPromMetrics):
    """Prometheus counters ``vllm:ec_ecstore_<counter>_total`` and histograms
    ``vllm:ec_ecstore_<prefetch|load|save>_seconds``, per engine, fed with
    the ECStoreConnectorStats data vLLM collects each step."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters = {}
        for k in COUNTERS:
            c = self._counter_cls(name="vllm:ec_ecstore_%s" % k, documentation="ecstore EC connector: %s" % k,
                                  labelnames=labelnames)
            self.counters[k] = {i: c.labels(*v) for i, v in per_engine_labelvalues.items()}
        self.hists = {}
        for k in SERIES:
            h = self._histogram_cls(name="vllm:ec_ecstore_%s_seconds" % k[:-2],
                                    documentation="ecstore EC connector: %s latency" % k[:-2],
                                    buckets=_BUCKETS, labelnames=labelnames)
            self.hists[k] = {i: h.labels(*v) for i, v in per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data, engine_idx=0):
        for k, v in (transfer_stats_data or {}).items():
            if k in self.counters and isinstance(v, (int, float)) and v > 0 and engine_idx in self.counters[k]:
                self.counters[k][engine_idx].inc(v)
            elif k in self.hists and isinstance(v, list) and engine_idx in self.hists[k]:
                for x in v:
                    self.hists[k][engine_idx].observe(x)
