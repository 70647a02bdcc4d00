"""Where ecstore.mooncake puts an object and where it looks for one:
Mooncake's ReplicateConfig (replica_num, preferred_segment(s), pins)
mapped onto ecstore's placement (docs/mooncake.md, "ReplicateConfig").

The store class keeps one *main* client: with master_server_addr listing
servers, an object lives on the server its key hashes to, and a get asks
only that server (no Redis round trip).  A put that asks for more goes
through another client of the same settings, made on first use and kept:

- replica_num N > 1: a client with the servers from Redis's registry and
  ``replicas=N`` (docs/multihost.md "Replicas"): N copies on distinct live
  servers, each server adding itself to the object's Redis record.  Fewer
  live servers than N store fewer copies and the put still succeeds, as
  Mooncake's does with fewer segments than replicas.
- preferred_segment(s) "host[:port]": a client of the one server on that
  host (the first listed, or in the registry); none there: the usual
  placement, as Mooncake falls back when a preferred segment cannot take
  the object.  A segment naming this client (LMCache's
  prefer_local_alloc sets get_hostname()) is this host.

Gets that miss on the key's hash server (or cannot reach it) ask the
holders Redis records, through a registry client: so a copy placed
elsewhere is found by every client of the namespace.  All of this needs the
Redis metadata server; without one, every put goes to the key's hash server
(one copy) and the log says what was not honoured.
"""

import logging
import socket
import threading
import time

from .errors import EcstoreError
from .store import Store

log = logging.getLogger("ecstore.mooncake")

_RETRY_S = 5.0  # a registry client that failed to connect is tried again after this


def _host_of(segment):
    """The host part of a Mooncake segment name "host[:port]"."""
    s = segment.strip()
    if s.startswith("["):
        return s[1:s.index("]")] if "]" in s else s[1:]
    host, sep, port = s.rpartition(":")
    return host if sep and port.isdigit() and ":" not in host else s


def _addresses(host):
    """The IP addresses a host name stands for (itself when unresolvable)."""
    try:
        return {ai[4][0] for ai in socket.getaddrinfo(host, None)} | {host}
    except OSError:
        return {host}


def _local(host):
    if host in ("localhost", "127.0.0.1", "::1", socket.gethostname()):
        return True
    return any(a.startswith("127.") or a == "::1" for a in _addresses(host))


class Placement:
    """The extra clients of one MooncakeDistributedStore (see the module
    doc).  target() picks the client for a put, located() gives the
    registry client for gets that missed, remover() the client that reaches
    every copy."""

    def __init__(self, main, cfg, hostname):
        self.main = main
        self.cfg = dict(cfg)
        self.servers = [s.strip() for s in (cfg.get("servers") or "").split(",") if s.strip()]
        self.redis = bool(cfg.get("redis_url"))
        self.hostname = hostname
        self._extra = {}
        self._failed = {}
        self._warned = set()
        self._lock = threading.Lock()

    def close(self):
        with self._lock:
            extra, self._extra = self._extra, {}
        for st in extra.values():
            st.close()

    def _warn_once(self, what, why):
        if why not in self._warned:
            self._warned.add(why)
            log.warning("%s: %s", what, why)

    def _client(self, name, **over):
        """The extra client `name` (made on first use), or None when it
        cannot connect (tried again after _RETRY_S)."""
        with self._lock:
            st = self._extra.get(name)
            if st is not None:
                return st
            if time.monotonic() < self._failed.get(name, 0):
                return None
        cfg = dict(self.cfg, **over)
        try:
            st = Store(cfg)
        except EcstoreError as e:
            (log.debug if name in self._failed else log.warning)(
                "ecstore.mooncake: cannot open the %s client (tried again after %.0f s): %s", name, _RETRY_S, e)
            with self._lock:
                self._failed[name] = time.monotonic() + _RETRY_S
            return None
        with self._lock:
            if name in self._extra:  # another thread made it meanwhile
                st.close()
                return self._extra[name]
            self._extra[name] = st
        return st

    def located(self):
        """The registry client (servers from Redis, gets at the holders
        Redis records), or None without Redis or when the main client is a
        registry client already."""
        if not self.redis or not self.servers:
            return None
        return self._client("registry", servers=None, replicas=1)

    def remover(self):
        """The client whose removes reach every copy of an object."""
        return self.located() or self.main

    def _preferred_server(self, segments):
        """(server "host:port" or None, whether the segment is on this
        host) for the first segment that names a host: the listed server
        on exactly that host, else, for a segment on this host, the first
        listed server on this host."""
        for seg in segments:
            host = self.hostname.rpartition(":")[0] if seg == self.hostname else _host_of(seg)
            want = _addresses(host)
            local = _local(host)
            for srv in self.servers:
                if want & _addresses(_host_of(srv)):
                    return srv, local
            if local:
                for srv in self.servers:
                    if _local(_host_of(srv)):
                        return srv, True
                if not self.servers:
                    return None, True
        return None, False

    def target(self, what, config):
        """The client a put with this ReplicateConfig goes through."""
        if config is None:
            return self.main
        n = getattr(config, "replica_num", 1)
        segs = [s for s in list(getattr(config, "preferred_segments", []) or []) if s]
        one = getattr(config, "preferred_segment", "")
        if one:
            segs.insert(0, one)
        if getattr(config, "prefer_alloc_in_same_node", False):
            segs.append(self.hostname)
        if n <= 1 and not segs:
            return self.main
        if not self.redis:
            self._warn_once(what, "replica_num > 1 and preferred segments need the Redis metadata server (to find "
                                  "the copies); without one every object has one copy, on its key's hash server")
            return self.main
        if n > 1:
            n = min(n, 8)  # ECS_MAX_REPLICAS
            srv, local = self._preferred_server(segs) if segs else (None, False)
            st = self._client("replicas-%d%s" % (n, "-local" if local else ""), servers=None, replicas=n,
                              placement="local" if local else "hash")
            return st or self.main
        srv, local = self._preferred_server(segs)
        if srv is not None:
            if len(self.servers) == 1:
                return self.main
            return self._client("at-" + srv, servers=srv, replicas=1) or self.main
        if local and not self.servers:
            return self._client("local", servers=None, replicas=1, placement="local") or self.main
        return self.main
