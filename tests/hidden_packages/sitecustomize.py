"""Put on PYTHONPATH by tests/test_missing_packages.py: the top-level packages named in $RLVR_TEST_HIDE (comma
separated) look not installed. Python's path finder is replaced by one that answers "not found" for them, the
answer it gives for a package that is absent, so `importlib.util.find_spec` returns None and `import` raises
ModuleNotFoundError; every other import is unchanged."""

import importlib.machinery
import os
import sys

HIDDEN = frozenset(filter(None, os.environ.get("RLVR_TEST_HIDE", "").split(",")))


class HidingPathFinder(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] in HIDDEN:
            return None
        return super().find_spec(fullname, path, target)


sys.meta_path[:] = [HidingPathFinder if finder is importlib.machinery.PathFinder else finder
                    for finder in sys.meta_path]
