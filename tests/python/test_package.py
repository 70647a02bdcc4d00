"""The package installs with pip and works from where pip put it: vLLM
imports connectors by module path, so ``ecstore.vllm`` must resolve in
vLLM's environment, not only from this source tree."""

import os
import pathlib
import shutil
import subprocess
import sys

from conftest import REPO

PKG = REPO / "ec_connector" / "python"


def _install(tmp_path):
    # From a copy: setuptools writes build/ and *.egg-info next to the sources.
    src = tmp_path / "src"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "--no-index", "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    return target


def _run(code, target, env_over, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ECSTORE_LIB")}
    env.update(env_over)
    env["PYTHONPATH"] = str(target)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def test_pip_install_then_vllm_loads_it_by_module_path(tmp_path):
    target = _install(tmp_path)
    code = (
        "import ecstore, ecstore.vllm\n"
        "import ecstore.mooncake.store, ecstore.mooncake.structured_object_store\n"  # the subpackage is installed
        "from vllm.config import ECTransferConfig\n"
        "from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory\n"
        "tc = ECTransferConfig(ec_connector='ECStoreConnector', ec_connector_module_path='ecstore.vllm',"
        " ec_role='ec_consumer')\n"
        "cls = ECConnectorFactory.get_connector_class(tc)\n"
        "print(ecstore.__file__)\n"
        "print(cls.__module__, cls.__name__)\n"
        "ecstore._lib.lib()\n"
        "print(ecstore.lib_path())\n"
    )
    lib = os.environ["ECSTORE_LIB"]
    r = _run(code, target, {"ECSTORE_LIB": lib}, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout.split("\n")
    assert pathlib.Path(out[0]).resolve().is_relative_to(target.resolve()), out[0]
    assert out[1] == "ecstore.vllm ECStoreConnector"
    assert pathlib.Path(out[2]).resolve() == pathlib.Path(lib).resolve()


def test_installed_package_without_a_library_says_so(tmp_path):
    target = _install(tmp_path)
    # Away from the source tree, with no ECSTORE_LIB and no installed
    # libecstore, the error names what was tried and how to fix it.
    r = _run("import ecstore\nimport ecstore._lib as l\nl.lib()\n", target,
             {"LD_LIBRARY_PATH": str(tmp_path)}, tmp_path)
    if r.returncode == 0:  # a libecstore is installed system-wide on this machine
        import ctypes.util
        assert ctypes.util.find_library("ecstore"), r.stdout
        return
    assert "cannot load libecstore (set ECSTORE_LIB to its path)" in r.stderr, r.stderr[-2000:]
