"""The Python 1E1PD example runs and checks itself (examples/python)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

import torch  # noqa: E402,F401 - the examples need it
import ecstore  # noqa: E402

EX = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"

if not ecstore.has_connector():
    pytest.skip("libecstore has no ec_connector", allow_module_level=True)


def run(script, *args):
    r = subprocess.run([sys.executable, str(EX / script)] + list(args), capture_output=True, text=True,
                       timeout=120, env=dict(os.environ))
    return r.returncode, r.stdout + r.stderr


def test_run_1e1pd_end_to_end():
    build = pathlib.Path(os.environ.get("ECS_BIN_DIR", "build/bin")).resolve().parent
    rc, out = run("run_1e1pd.py", "--build", str(build), "--images", "2", "--size", "224x224")
    assert rc == 0, out
    assert "hits=2, misses=0, wrong=0" in out


def test_consumer_recomputes_misses(cluster, tmp_path):
    cfg = tmp_path / "ec.json"
    cfg.write_text(json.dumps({"backend": "ecstore", "servers": cluster.servers, "redis_url": cluster.redis_url,
                               "namespace": "pytest"}))
    common = ["--config", str(cfg), "--size", "112x84", "--hidden", "64", "--seed", "777"]
    rc, out = run("producer.py", *common, "--images", "2")
    assert rc == 0, out
    rc, out = run("consumer.py", *common, "--images", "3")
    assert rc == 0, out
    assert "hits=2, misses=1, wrong=0" in out
    rc, out = run("consumer.py", *common, "--images", "3", "--expect-all")
    assert rc == 1, out
