"""One real audit of linux and the local baseline, shared by the matrix and format tests.

The matrix is a couple of minutes of real sessions; every assertion about it
reads this one measurement rather than running it again.
"""

from __future__ import annotations

import pytest

from firstrun.audit.battery import AuditResult, run_audit


@pytest.fixture(scope="session")
def audit() -> AuditResult:
    return run_audit(["linux", "local"])
