"""ctest's entry to the Python binding's tests: `python3 -m pytest -q
tests/python`, with the skips and failures ctest needs to see.

Exit codes: pytest's own (0 passed, 1 failed, ...), except
- 77 (ctest: skipped) when numpy or pytest is missing, or when ECS_SANITIZE
  says the library under test is a sanitizer build (it cannot be loaded into
  this python without preloading the ASan runtime, see docs/python.md);
- 1 instead of pytest's 5 ("no tests collected"), so that a suite that
  silently vanished fails rather than passes.
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
    for mod in ("pytest", "numpy"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        print("skip: %s missing for %s (scripts/install-deps.sh installs python3-numpy, python3-pytest)"
              % (", ".join(missing), sys.executable))
        return 77
    import pytest

    here = pathlib.Path(__file__).resolve().parent
    rc = pytest.main(["-q", "-p", "no:cacheprovider", "-rs", str(here)] + sys.argv[1:])
    if rc == 5:
        print("error: pytest collected no tests in %s" % here)
        return 1
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())
