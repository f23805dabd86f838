"""Docker tests need the daemon and the default image; scripts/test provides both."""

from __future__ import annotations

import pytest
from docker_support import IMAGE

from firstrun.images.build import image_present


@pytest.fixture(scope="session")
def docker_ready() -> None:
    if not image_present(IMAGE):
        pytest.fail(f"{IMAGE} is not in the local daemon (is dockerd running?); "
                    "scripts/test starts dockerd and runs 'firstrun images build --python'")
