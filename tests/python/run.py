"""Runs one pytest file for ctest: exit 77 ("skipped") when pytest or a module the tests need
is missing, pytest's own status otherwise."""
import importlib.util
import sys

for module in ("pytest", "numpy"):
    if importlib.util.find_spec(module) is None:
        print(f"skipped: Python module '{module}' is missing (python3-{module})")
        sys.exit(77)
import pytest  # noqa: E402

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-rs"] + sys.argv[1:]))
