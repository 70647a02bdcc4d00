"""Redis AUTH through the Python layers (issue 13): a redis-server started
here with requirepass and an ACL user; the server takes the password from
a file; the Mooncake store (its metadata_server URL, and remove_by_regex's
own SCAN link) and the vLLM-facing ECConnector (redis_password_file passed
through to the C config) work; a wrong password is a clear error; the
Mooncake layer passes ecstore's newer client keys (max_object_size,
shm_server_uid) on instead of ignoring them."""

import logging
import os
import time

import pytest

import ecstore

from conftest import Proc, free_port, redis_path, start_server

PW = "py-s3cret-pw"
ALICE_PW = "al1ce:p@ss"
ALICE_PW_URL = "al1ce%3Ap%40ss"
NS = "pytest-auth"


@pytest.fixture(scope="module")
def auth_redis():
    port = free_port()
    p = Proc([redis_path(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
              "--daemonize", "no", "--requirepass", PW,
              "--user", "alice", "on", ">" + ALICE_PW, "~*", "&*", "+@all"], "redis-auth", port)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def auth_server(auth_redis, tmp_path_factory):
    d = tmp_path_factory.mktemp("pw")
    pwf = d / "redis-pw"
    pwf.write_text(PW + "\n")
    os.chmod(pwf, 0o600)
    s = start_server(auth_redis.port, "--redis-password-file", str(pwf), ns=NS)
    yield s
    assert s.stop() == 0


def test_server_password_stays_out_of_argv_and_log(auth_server):
    with open("/proc/%d/cmdline" % auth_server.proc.pid, "rb") as f:
        assert PW.encode() not in f.read()
    with open(auth_server.log) as f:
        assert PW not in f.read()


def test_mooncake_store_with_acl_user(auth_redis, auth_server, caplog):
    from ecstore.mooncake import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    meta = "redis://alice:%s@127.0.0.1:%d" % (ALICE_PW_URL, auth_redis.port)
    cfg = {"local_hostname": "127.0.0.1", "metadata_server": meta, "global_segment_size": 64 << 20,
           "local_buffer_size": 16 << 20, "protocol": "tcp",
           "master_server_addr": "127.0.0.1:%d" % auth_server.port, "tenant_id": NS,
           "max_object_size": 1 << 20, "shm_server_uid": os.getuid()}
    with caplog.at_level(logging.WARNING):
        assert s.setup(cfg) == 0
    assert "no meaning in ecstore" not in caplog.text  # the keys are passed on, not ignored
    tag = "auth-rx-%d-%d" % (os.getpid(), time.monotonic_ns())
    assert s.put(tag + "-a", b"v") == 0
    assert s.is_exist(tag + "-a") == 1  # through Redis, authenticated as alice
    assert s.remove_by_regex(tag) == 1  # its own SCAN link authenticates too
    assert s.close() == 0


def test_mooncake_scan_wrong_password(auth_redis):
    from ecstore import _mooncake_base

    url = "redis://:wrong-pw@127.0.0.1:%d" % auth_redis.port
    with pytest.raises(PermissionError) as e:
        _mooncake_base._redis_scan(url, b"*", 2.0)
    assert "authentication failed" in str(e.value)
    assert "wrong-pw" not in str(e.value)


def test_ec_connector_redis_password_file(auth_redis, tmp_path):
    if not ecstore.has_connector():
        pytest.skip("no ec_connector in this build")
    import numpy as np

    pwf = tmp_path / "pw"
    pwf.write_text(PW + "\n")
    os.chmod(pwf, 0o600)
    cfg = {"backend": "redis", "namespace": NS, "redis_url": "redis://127.0.0.1:%d" % auth_redis.port,
           "redis_password_file": str(pwf), "timeout_ms": 5000, "staging_bytes": "16M"}
    h = "auth-h-%d" % os.getpid()
    a = np.arange(4096, dtype=np.uint8)
    with ecstore.ECConnector(cfg) as c:
        c.save_caches({h: a}, h)
        assert c.wait_for_save() == []
        assert c.has_caches([h]) == [True]
    pwf.write_text("wrong-pw\n")
    with pytest.raises(ecstore.errors.AuthError) as e:
        ecstore.ECConnector(cfg)
    assert "authentication failed" in str(e.value)
    assert "wrong-pw" not in str(e.value)


def test_vllm_extra_config_passes_redis_password_file_through():
    from ecstore.vllm import split_config

    c_cfg, _ = split_config({"redis_url": "redis://alice@10.0.0.9:6379", "redis_password_file": "/run/pw"})
    assert c_cfg["redis_password_file"] == "/run/pw"
