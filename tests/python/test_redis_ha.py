"""The Python side's own Redis link (the Mooncake store's SCAN for
remove_all / remove_by_regex) through Redis Sentinel and Redis Cluster
(docs/redis-ha.md), against real redis-server processes: the scan reaches
the sentinels' master, and the cluster node that holds the namespace's
slot even when the URL names another."""
import shutil
import subprocess
import time

import pytest

from conftest import Proc, free_port, redis_path

from ecstore import _mooncake_base as mb


def _redis(*extra):
    port = free_port()
    return Proc([redis_path(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--daemonize", "no"] + list(extra), "redis", port)


def _cmd(port, *args):
    r = mb._Resp("127.0.0.1", port, 5.0)
    try:
        return r.cmd(*args)
    finally:
        r.close()


def test_scan_through_sentinel(tmp_path):
    master = _redis()
    conf = tmp_path / "sentinel.conf"
    sport = free_port()
    conf.write_text("port %d\nbind 127.0.0.1\nsentinel monitor pym 127.0.0.1 %d 1\n" % (sport, master.port))
    sentinel = Proc([redis_path(), str(conf), "--sentinel"], "sentinel", sport)
    try:
        _cmd(master.port, "SET", "ecs:{pyha}:obj:a", "1")
        _cmd(master.port, "SET", "ecs:{pyha}:obj:b", "1")
        dead = free_port()  # a sentinel that is not there is skipped
        url = "redis-sentinel://127.0.0.1:%d,127.0.0.1:%d/pym" % (dead, sport)
        assert sorted(mb._redis_scan(url, b"ecs:{pyha}:obj:*", 2.0)) == [b"ecs:{pyha}:obj:a", b"ecs:{pyha}:obj:b"]
        with pytest.raises(ConnectionError) as e:
            mb._redis_scan("redis-sentinel://127.0.0.1:%d/nosuch" % sport, b"*", 2.0)
        assert "no sentinel knows master 'nosuch'" in str(e.value)
    finally:
        sentinel.stop()
        master.stop()


def test_scan_through_sentinel_with_auth(tmp_path, monkeypatch):
    """Sentinels with requirepass: the scan authenticates to them with the
    sentinels' own password (the environment's, or the URL's), never the
    master's; without it the error names the sentinel."""
    master = _redis("--requirepass", "m-pw")
    conf = tmp_path / "sentinel.conf"
    sport = free_port()
    conf.write_text("port %d\nbind 127.0.0.1\nrequirepass s-pw\nsentinel monitor pym 127.0.0.1 %d 1\n"
                    "sentinel auth-pass pym m-pw\n" % (sport, master.port))
    sentinel = Proc([redis_path(), str(conf), "--sentinel"], "sentinel", sport)
    try:
        r = mb._Resp("127.0.0.1", master.port, 5.0)
        r.cmd("AUTH", "m-pw")
        r.cmd("SET", "ecs:{pyha}:obj:a", "1")
        r.close()
        monkeypatch.setenv("ECSTORE_REDIS_PASSWORD", "m-pw")
        monkeypatch.delenv("ECSTORE_SENTINEL_PASSWORD", raising=False)
        url = "redis-sentinel://127.0.0.1:%d/pym" % sport
        with pytest.raises(PermissionError) as e:
            mb._redis_scan(url, b"ecs:{pyha}:obj:*", 2.0)
        assert "sentinel 127.0.0.1:%d: NOAUTH" % sport in str(e.value)
        monkeypatch.setenv("ECSTORE_SENTINEL_PASSWORD", "wrong")
        with pytest.raises(PermissionError) as e:
            mb._redis_scan(url, b"ecs:{pyha}:obj:*", 2.0)
        assert "sentinel 127.0.0.1:%d: authentication failed" % sport in str(e.value)
        assert "wrong" not in str(e.value)
        monkeypatch.setenv("ECSTORE_SENTINEL_PASSWORD", "s-pw")
        assert mb._redis_scan(url, b"ecs:{pyha}:obj:*", 2.0) == [b"ecs:{pyha}:obj:a"]
        monkeypatch.delenv("ECSTORE_SENTINEL_PASSWORD")
        assert mb._redis_scan(url + "?sentinel_password=s-pw", b"ecs:{pyha}:obj:*", 2.0) == [b"ecs:{pyha}:obj:a"]
    finally:
        sentinel.stop()
        master.stop()


def test_scan_follows_cluster_slot():
    if shutil.which("redis-cli") is None:
        pytest.skip("no redis-cli (redis-tools) to create a cluster")
    nodes = [_redis("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port",
                    str(free_port())) for _ in range(3)]
    try:
        subprocess.run(["redis-cli", "--cluster", "create"] + ["127.0.0.1:%d" % n.port for n in nodes]
                       + ["--cluster-yes"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not all(b"cluster_state:ok" in _cmd(n.port, "CLUSTER", "INFO") for n in nodes):
            assert time.monotonic() < deadline, "cluster never became ok"
            time.sleep(0.2)
        slots = _cmd(nodes[0].port, "CLUSTER", "SLOTS")
        owner = {}
        for lo, hi, m, *_ in slots:
            owner[(int(lo), int(hi))] = int(m[1])

        def port_of(key):
            slot = int(_cmd(nodes[0].port, "CLUSTER", "KEYSLOT", key))
            return next(p for (lo, hi), p in owner.items() if lo <= slot <= hi)

        ns = next("py%d" % i for i in range(1000) if port_of("ecs:{py%d}:x" % i) != nodes[0].port)
        home = port_of("ecs:{%s}:x" % ns)
        for k in ("a", "b", "c"):
            _cmd(home, "SET", "ecs:{%s}:obj:%s" % (ns, k), "1")
        want = [("ecs:{%s}:obj:%s" % (ns, k)).encode() for k in "abc"]
        pattern = ("ecs:{%s}:obj:*" % ns).encode()
        dead = free_port()  # a seed list whose first seed is not there
        for url in ("redis-cluster://127.0.0.1:%d" % nodes[0].port, "127.0.0.1:%d" % nodes[0].port,
                    "redis-cluster://127.0.0.1:%d,127.0.0.1:%d" % (dead, nodes[0].port)):
            assert sorted(mb._redis_scan(url, pattern, 2.0)) == want
    finally:
        for n in nodes:
            n.stop()
