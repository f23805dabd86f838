"""The one profile maker: a sandbox profile over a workspace on this host."""

from __future__ import annotations

import os
from collections.abc import Iterable

from firstrun.policy.profile import SandboxProfile
from firstrun.sandbox.hostfs import host_filesystem_policy


def make_profile(workspace: str, *, protect: bool = False, lift: Iterable[str] = (),
                 **fields: object) -> SandboxProfile:
    """``workspace`` under this host's filesystem policy; ``protect`` and ``lift`` as
    ``host_filesystem_policy``'s, every other field (net, limits, ...) as given."""
    return SandboxProfile(fs=host_filesystem_policy(workspace, os.environ, protect=protect,
                                                    lift=lift), **fields)  # type: ignore[arg-type]
