"""Runs one pytest file for ctest: exit 77 ("skipped") when pytest or a module the tests need
is missing, pytest's own status otherwise."""
import importlib.util
import sys

for module in ("pytest", "numpy"):
    if importlib.util.find_spec(module) is None:
        print(f"skipped: Python module '{module}' is missing (python3-{module})")
        sys.exit(77)
import pytest  # noqa: E402

status = pytest.main(["-q", "-p", "no:cacheprovider", "-rs"] + sys.argv[1:])
# 5: nothing ran (a module skipped as a whole, e.g. without PyTorch): "skipped" for ctest.
sys.exit(77 if status == 5 else int(status))
