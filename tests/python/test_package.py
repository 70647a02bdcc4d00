"""The package installs with pip and works from where pip put it: vLLM
imports connectors by module path, so ``ecstore.vllm`` must resolve in
vLLM's environment, not only from this source tree."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

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
    # The package ships the ECSTORE_LIB it was built with; without it (as
    # if deleted), away from the source tree, with no ECSTORE_LIB and no
    # installed libecstore, the error names what was tried and how to fix it.
    shipped = target / "ecstore" / "libecstore.so"
    assert shipped.is_file()
    shipped.unlink()
    r = _run("import ecstore\nimport ecstore._lib as l\nl.lib()\n", target,
             {"LD_LIBRARY_PATH": str(tmp_path)}, tmp_path)
    if r.returncode == 0:  # a libecstore is installed system-wide on this machine
        import ctypes.util
        assert ctypes.util.find_library("ecstore"), r.stdout
        return
    assert "cannot load libecstore (set ECSTORE_LIB to its path)" in r.stderr, r.stderr[-2000:]


def test_package_build_without_a_library_says_so(tmp_path):
    # A copy of the package alone (no source tree to build from), no
    # ECSTORE_LIB: unless a libecstore is installed system-wide, the build
    # stops and says where a library can come from.
    import ctypes.util
    if ctypes.util.find_library("ecstore"):
        pytest.skip("a libecstore is installed system-wide on this machine")
    src = tmp_path / "src"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("ECSTORE_LIB", "ECSTORE_SOURCE_DIR")}
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "--no-index", "--target", str(tmp_path / "site"), str(src)],
                       capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env)
    assert r.returncode != 0
    assert "ecstore: no libecstore to ship or use" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]


# The user's path (docs/python.md): pip install ./ec_connector/python from a
# source tree into a fresh venv, then use it with nothing else set.  The
# venv sees the system's site-packages (Debian's numpy, setuptools and
# wheel: scripts/install-deps.sh), so nothing is downloaded where they are
# there; its own build of libecstore is a CMake build of one target.
_USE = r"""
import importlib.metadata, pathlib, sys
import ecstore
from ecstore.mooncake import MooncakeDistributedStore
lib = pathlib.Path(ecstore.lib_path()).resolve()
assert lib.parent == pathlib.Path(ecstore.__file__).resolve().parent, lib
reqs = importlib.metadata.requires("ecstore")
assert "numpy" in reqs, reqs
servers, redis_url, ns = sys.argv[1:4]
import numpy as np
a = np.arange(650 * 16, dtype=np.float32).reshape(650, 16)
with ecstore.connect(servers=servers, redis_url=redis_url, namespace=ns, timeout_ms=5000) as st:
    st.put_tensor("pkg-np", a)
    b = st.get_tensor("pkg-np", framework="numpy")
    assert b.dtype == a.dtype and b.shape == a.shape and (b == a).all()
mc = MooncakeDistributedStore()
assert mc.setup("127.0.0.1", redis_url, 64 << 20, 16 << 20, "tcp", "", servers, tenant_id=ns) == 0
assert mc.put("pkg-mc", b"abc" * 1000) == 0
assert mc.get("pkg-mc") == b"abc" * 1000
assert mc.close() == 0
print("OK", lib)
"""


def test_pip_install_from_the_source_tree_builds_the_library(tmp_path, cluster):
    import venv  # noqa: F401 - the stdlib module the fresh venv is made with

    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo, symlinks=True,
                    ignore=shutil.ignore_patterns("build", "build-*", ".git", "__pycache__", "*.egg-info"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "ECSTORE_LIB", "ECSTORE_SOURCE_DIR", "ECSTORE_NO_BUILD", "VIRTUAL_ENV")}
    vdir = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    r = subprocess.run([base, "-m", "venv", "--system-site-packages", str(vdir)], capture_output=True, text=True,
                       timeout=180, env=env)
    assert r.returncode == 0, r.stderr
    py = vdir / "bin" / "python"
    # Offline where this interpreter has what the install needs (numpy; a
    # setuptools that builds wheels itself, >= 70.1): its site-packages are
    # put behind the venv's own (a .pth file) and the venv's older
    # setuptools removed.  Else pip fetches them from PyPI.
    import sysconfig
    offline = False
    try:
        import numpy  # noqa: F401
        import setuptools
        offline = tuple(int(x) for x in setuptools.__version__.split(".")[:2]) >= (70, 1)
    except (ImportError, ValueError):
        pass
    if offline:
        venv_site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, env=env, timeout=60).stdout.strip()
        (pathlib.Path(venv_site) / "zz_outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", "setuptools"], env=env, timeout=120,
                       capture_output=True)
    argv = [str(py), "-m", "pip", "install", "--disable-pip-version-check", str(repo / "ec_connector" / "python")]
    if offline:
        argv[4:4] = ["--no-build-isolation", "--no-index"]
    else:
        have_wheel = subprocess.run([str(py), "-c", "import setuptools, wheel"], env=env, timeout=60).returncode == 0
        if have_wheel:  # else pip fetches setuptools and wheel for an isolated build (PyPI)
            argv.insert(4, "--no-build-isolation")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                          capture_output=True, text=True, env=env, timeout=60).stdout.strip()
    assert (pathlib.Path(site) / "ecstore" / "libecstore.so").is_file()
    # Away from the source tree (which the copy is not, any more: removed),
    # with nothing set: the shipped library, numpy, a real server.
    shutil.rmtree(repo)
    from conftest import NAMESPACE
    r = subprocess.run([str(py), "-c", _USE, cluster.servers, cluster.redis_url, NAMESPACE],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert r.stdout.startswith("OK " + str(pathlib.Path(site).resolve() / "ecstore" / "libecstore.so")), r.stdout
