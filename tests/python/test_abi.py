"""The ctypes mirror of the C headers matches the compiler's layout."""

import ctypes
import json
import os
import pathlib
import subprocess

import pytest

import ecstore
from ecstore import _lib, codes


def c_layout():
    exe = pathlib.Path(os.environ.get("ECS_BIN_DIR", "")) / "ecs_py_abi"
    if not exe.exists():
        pytest.skip("ecs_py_abi not built (run through ctest, or set ECS_BIN_DIR)")
    return json.loads(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)


@pytest.mark.parametrize("name", sorted(_lib.ABI_STRUCTS))
def test_struct_layout_matches_c(name):
    layout = c_layout()[name]
    cls = _lib.ABI_STRUCTS[name]
    assert ctypes.sizeof(cls) == layout["size"], name
    for field, off in layout["fields"].items():
        assert getattr(cls, field).offset == off, "%s.%s" % (name, field)


def test_error_codes_match_library():
    for name, value in codes.ALL.items():
        assert ecstore.err_name(value) == name
    # The next code after the table is unknown to this binding and to C alike.
    assert ecstore.err_name(min(codes.ALL.values()) - 1) == "UNKNOWN"


def test_library_is_the_one_under_test():
    want = os.environ.get("ECSTORE_LIB")
    if want:
        assert ecstore.lib_path() == want
