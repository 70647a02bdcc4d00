"""Fixtures: a real redis-server and ecstore-server on free ports in a temp
directory, stopped (and the directory removed) at the end.

ctest sets ECSTORE_LIB (the libecstore.so under test) and ECS_BIN_DIR (its
ecstore-server); run by hand, both default to the source tree's build/.
redis-server comes from PATH or /usr/bin.
"""

import atexit
import ctypes
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "ec_connector" / "python"))
BIN_DIR = pathlib.Path(os.environ.get("ECS_BIN_DIR", REPO / "build" / "bin")).resolve()
if "ECSTORE_LIB" not in os.environ and (BIN_DIR.parent / "lib" / "libecstore.so").exists():
    os.environ["ECSTORE_LIB"] = str(BIN_DIR.parent / "lib" / "libecstore.so")

NAMESPACE = "pytest"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(proc, port, log, timeout=10.0):
    """Waits until 127.0.0.1:port accepts; fails with the log if the process died."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError("process exited with %s:\n%s" % (proc.returncode, pathlib.Path(log).read_text()))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError("port %d not listening after %.0fs:\n%s" % (port, timeout, pathlib.Path(log).read_text()))


_live = set()
_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    # Runs in the child before exec: a SIGKILLed test run (a ctest timeout)
    # must not leave servers behind.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Proc:
    """A spawned process with its log in its own temp directory; every one
    still running at interpreter exit is stopped."""

    def __init__(self, argv, name, port):
        self.dir = tempfile.mkdtemp(prefix="ecs-py-%s-" % name)
        self.log = os.path.join(self.dir, name + ".log")
        self.port = port
        self.argv = argv
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=self.dir,
                                         preexec_fn=_die_with_parent)
        _live.add(self)
        try:
            wait_port(self.proc, port, self.log)
        except Exception:
            self.stop()
            raise

    def pause(self):
        """SIGSTOP, returning once every thread has stopped (kill returns
        before a multi-threaded server stops)."""
        self.proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                tasks = os.listdir(f"/proc/{self.proc.pid}/task")
                states = []
                for t in tasks:
                    with open(f"/proc/{self.proc.pid}/task/{t}/stat") as f:
                        states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                return
            if all(st in ("T", "t") for st in states):
                return
            time.sleep(0.001)

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def stop(self, timeout=10.0):
        """SIGTERM (after SIGCONT), then SIGKILL; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        _live.discard(self)
        return self.proc.returncode


@atexit.register
def _stop_leftovers():
    for p in list(_live):
        p.stop()


def redis_path():
    return shutil.which("redis-server") or "/usr/bin/redis-server"


def start_redis():
    port = free_port()
    return Proc([redis_path(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--daemonize", "no"], "redis", port)


def start_server(redis_port, *extra, ns=NAMESPACE, pool="128M"):
    binary = BIN_DIR / "ecstore-server"
    if not binary.exists():
        pytest.fail("no ecstore-server at %s (set ECS_BIN_DIR)" % binary)
    port = free_port()
    argv = [str(binary), "--listen", "127.0.0.1:%d" % port, "--redis",
            "127.0.0.1:%d" % redis_port if redis_port else "none",
            "--pool-size", pool, "--ns", ns, "--log-level", "warn"] + list(extra)
    return Proc(argv, "ecstore", port)


class Cluster:
    """One redis-server and one ecstore-server."""

    def __init__(self, redis, server):
        self.redis = redis
        self.server = server

    @property
    def servers(self):
        return "127.0.0.1:%d" % self.server.port

    @property
    def redis_url(self):
        return "redis://127.0.0.1:%d" % self.redis.port

    def config(self, **over):
        cfg = {"servers": self.servers, "redis_url": self.redis_url, "namespace": NAMESPACE, "timeout_ms": 5000}
        cfg.update(over)
        return cfg


@pytest.fixture(scope="session")
def cluster():
    redis = start_redis()
    try:
        server = start_server(redis.port)
    except Exception:
        redis.stop()
        raise
    yield Cluster(redis, server)
    rc = server.stop()
    redis.stop()
    # A server that does not exit cleanly on SIGTERM (crash, sanitizer
    # report) fails the run.
    assert rc == 0, "ecstore-server exited with %s" % rc


@pytest.fixture
def store(cluster):
    import ecstore

    with ecstore.connect(cluster.config()) as s:
        yield s


@pytest.fixture
def private_cluster():
    """A cluster of its own, for tests that stop or pause processes."""
    redis = start_redis()
    server = start_server(redis.port)
    c = Cluster(redis, server)
    yield c
    server.stop()
    redis.stop()


@pytest.fixture
def uniq(request):
    """A key prefix unique to the test."""
    n = [0]

    def make(tag=""):
        n[0] += 1
        return "%s-%s-%d-%d" % (request.node.name, tag, os.getpid(), n[0])

    return make
