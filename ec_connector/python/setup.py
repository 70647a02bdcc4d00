"""Builds libecstore into the package, so that ``pip install
./ec_connector/python`` gives a package that works on its own.

The metadata is in pyproject.toml; this file only adds the library.  Where
it comes from, first match wins:

1. ``ECSTORE_LIB`` at build time: that file is copied in (a build of your
   own, e.g. ``build/lib/libecstore.so``);
2. the ecstore source tree the package sits in (``<repo>/ec_connector/
   python``; or ``ECSTORE_SOURCE_DIR``): CMake builds the ``ecstore`` shared
   target alone (Release, no tests) in a temp dir, which takes a minute or
   two on two cores, and its ``libecstore.so`` is copied in;
3. neither: an installed libecstore (``cmake --install build``: found by
   ``ldconfig``'s cache or ``pkg-config ecstore``) is used at run time, and
   nothing is shipped.  With none of the three the build stops and says so.

``ECSTORE_NO_BUILD=1`` skips 2 (use 1 or 3).  The shipped library links
the system's hiredis, xxhash, zstd, lz4 and libibverbs (Debian packages,
scripts/install-deps.sh), so the wheel is for machines that have them.
"""

import ctypes.util
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = pathlib.Path(__file__).resolve().parent
SHIPPED = "libecstore.so"


def _say(msg):
    print("ecstore: " + msg, file=sys.stderr, flush=True)


def _source_dir():
    env = os.environ.get("ECSTORE_SOURCE_DIR")
    cand = pathlib.Path(env).resolve() if env else HERE.parents[1]
    if (cand / "CMakeLists.txt").is_file() and (cand / "include" / "ecstore" / "ecstore.h").is_file():
        return cand
    if env:
        sys.exit("ecstore: ECSTORE_SOURCE_DIR=%s holds no ecstore source tree (CMakeLists.txt, "
                 "include/ecstore/ecstore.h)" % env)
    return None


def _installed():
    if ctypes.util.find_library("ecstore"):
        return True
    try:
        return subprocess.run(["pkg-config", "--exists", "ecstore"], timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _cmake_build(src, dest):
    cmake = shutil.which("cmake")
    if cmake is None:
        sys.exit("ecstore: building libecstore needs cmake and a C compiler (Debian: "
                 "scripts/install-deps.sh, or apt-get install build-essential cmake pkg-config "
                 "libhiredis-dev libxxhash-dev libzstd-dev liblz4-dev libibverbs-dev); or set ECSTORE_LIB "
                 "to a libecstore.so you built")
    jobs = str(os.cpu_count() or 2)
    with tempfile.TemporaryDirectory(prefix="ecstore-build-") as b:
        _say("building libecstore from %s with CMake in %s (the ecstore target only; a minute or two)" % (src, b))
        for argv in ([cmake, "-S", str(src), "-B", b, "-DCMAKE_BUILD_TYPE=Release", "-DECS_BUILD_TESTS=OFF"],
                     [cmake, "--build", b, "--target", "ecstore", "-j", jobs]):
            r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0:
                sys.exit("ecstore: %s failed (status %d):\n%s" % (" ".join(argv), r.returncode, r.stdout[-6000:]))
        built = pathlib.Path(b) / "lib" / "libecstore.so"
        shutil.copyfile(built.resolve(), dest)


class BuildPyWithLib(build_py):
    def run(self):
        super().run()
        dest = pathlib.Path(self.build_lib) / "ecstore" / SHIPPED
        dest.parent.mkdir(parents=True, exist_ok=True)
        prebuilt = os.environ.get("ECSTORE_LIB")
        if prebuilt:
            if not os.path.isfile(prebuilt):
                sys.exit("ecstore: ECSTORE_LIB=%s is not a file" % prebuilt)
            _say("shipping %s (ECSTORE_LIB)" % prebuilt)
            shutil.copyfile(os.path.realpath(prebuilt), dest)
            return
        src = None if os.environ.get("ECSTORE_NO_BUILD") == "1" else _source_dir()
        if src is not None:
            _cmake_build(src, dest)
            return
        if _installed():
            _say("no source tree here: the installed libecstore will be used at run time")
            return
        sys.exit("ecstore: no libecstore to ship or use: build this package from the ecstore source tree "
                 "(pip install ./ec_connector/python), set ECSTORE_LIB to a built libecstore.so, or install "
                 "the library first (cmake --install build; ldconfig)")


class PlatformDistribution(Distribution):
    """A wheel with a shared library in it is for one platform, not 'any'."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLib}, distclass=PlatformDistribution)
