"""ctest's entry to the Python binding's tests: `python3 -m pytest -q
tests/python`, with the skips and failures ctest needs to see.

Exit codes: pytest's own (0 passed, 1 failed, ...), except
- 77 (ctest: skipped) when ECS_SANITIZE says the library under test is a
  sanitizer build (it cannot be loaded into this python without preloading
  the ASan runtime, see docs/python.md);
- 1 when a package the suite needs (pytest, numpy, torch, vllm) is missing
  from this interpreter: a suite that cannot run fails rather than
  vanishing from a green run (scripts/pyenv.sh makes the venv that has
  them; scripts/test.sh passes it to CMake as ECS_PYTHON);
- 1 instead of pytest's 5 ("no tests collected").
"""

import os
import pathlib
import sys


def main():
    if os.environ.get("ECS_SANITIZE", "0") not in ("", "0", "OFF"):
        print("skip: libecstore is a sanitizer build (ECS_SANITIZE=%s); the Python tests run against a "
              "release build" % os.environ["ECS_SANITIZE"])
        return 77
    missing = []
    for mod in ("pytest", "numpy", "torch", "vllm"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        print("error: %s missing for %s; make the test venv with scripts/pyenv.sh and configure with "
              "-DECS_PYTHON=$(scripts/pyenv.sh)/bin/python (scripts/test.sh does both)"
              % (", ".join(missing), sys.executable))
        return 1
    import pytest

    here = pathlib.Path(__file__).resolve().parent
    rc = pytest.main(["-q", "-p", "no:cacheprovider", "-rs", str(here)] + sys.argv[1:])
    if rc == 5:
        print("error: pytest collected no tests in %s" % here)
        return 1
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())
