"""`pytest -m quick` (tests/conftest.py's _QUICK) names tests that exist: a renamed file
or test would otherwise drop out of the quick check without a word."""

from __future__ import annotations

import re
from pathlib import Path

import conftest

TESTS = Path(__file__).resolve().parent


def test_every_quick_entry_names_an_existing_test():
    for entry in conftest._QUICK:
        path, _, name = entry.partition("::")
        file = TESTS / path
        assert file.is_file(), entry
        if name:
            function = re.escape(name.split("[")[0])
            assert re.search(rf"^def {function}\w*\(", file.read_text(), re.M), entry
