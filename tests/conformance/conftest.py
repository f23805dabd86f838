"""The conformance suite runs once per backend ``firstrun doctor`` reports available here.

A backend that registers in ``firstrun.sandbox.select.REGISTRY`` and probes
available joins every test parametrized on ``backend`` with no change here;
``local`` never does (it probes unavailable unless unenforced runs were
allowed, and doctor does not allow them).
"""

from __future__ import annotations

import pytest
from conformance_support import AVAILABLE


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", AVAILABLE, ids=list(AVAILABLE))

