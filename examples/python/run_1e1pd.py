#!/usr/bin/python3
"""The Python 1E1PD example end to end: starts a redis-server and an
ecstore-server on free ports (binaries from --build, default build/),
runs producer.py (the encoder) and then consumer.py (prefill/decode) as
separate processes with the same --ec-transfer-config-style JSON, and
stops the servers.  Exit code 0 when every embedding arrived bit-exact.

  /usr/bin/python3 examples/python/run_1e1pd.py [--build build] [--images 8] [--backend ecstore]
"""

import argparse
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv, port, name, tmp):
    log = open(os.path.join(tmp, name + ".log"), "w")
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        if p.poll() is not None:
            sys.exit("%s exited: %s" % (name, pathlib.Path(log.name).read_text()))
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return p
        except OSError:
            time.sleep(0.02)
    p.kill()
    sys.exit("%s did not listen on %d" % (name, port))


def stop(p):
    if p and p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main():
    # SIGTERM (a timeout, kill) must still stop the servers below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--size", default="700x728")
    ap.add_argument("--backend", default="ecstore", choices=["ecstore", "disk", "redis"])
    args = ap.parse_args()
    build = pathlib.Path(args.build).resolve()
    env = dict(os.environ, ECSTORE_LIB=os.environ.get("ECSTORE_LIB", str(build / "lib" / "libecstore.so")))
    tmp = tempfile.mkdtemp(prefix="ecs-1e1pd-py-")
    rp = sp = None
    try:
        rport, sport = free_port(), free_port()
        rp = start([shutil.which("redis-server") or "/usr/bin/redis-server", "--port", str(rport), "--bind",
                    "127.0.0.1", "--save", "", "--appendonly", "no"], rport, "redis", tmp)
        sp = start([str(build / "bin" / "ecstore-server"), "--listen", "127.0.0.1:%d" % sport, "--redis",
                    "127.0.0.1:%d" % rport, "--ns", "example", "--pool-size", "512M", "--log-level", "warn"],
                   sport, "ecstore-server", tmp)
        # What vLLM's --ec-transfer-config would carry in ec_connector_extra_config.
        cfg = {"backend": args.backend, "servers": "127.0.0.1:%d" % sport, "namespace": "example",
               "redis_url": "redis://127.0.0.1:%d" % rport, "protocol": "auto"}
        if args.backend == "disk":
            cfg["disk_path"] = os.path.join(tmp, "ec-cache")
            os.mkdir(cfg["disk_path"])
        cfg_file = os.path.join(tmp, "ec.json")
        pathlib.Path(cfg_file).write_text(json.dumps(cfg))
        common = ["--config", cfg_file, "--images", str(args.images), "--size", args.size]
        for script, extra in (("producer.py", []), ("consumer.py", ["--expect-all"])):
            print("$ %s %s" % (script, " ".join(common + extra)), flush=True)
            rc = subprocess.run([sys.executable, str(HERE / script)] + common + extra, env=env).returncode
            if rc:
                print("%s failed (%d)" % (script, rc))
                return rc
        print("1E1PD (python, %s backend): every embedding arrived bit-exact" % args.backend)
        return 0
    finally:
        stop(sp)
        stop(rp)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
