"""A sandbox profile: filesystem, network and process policy, as one value.

Guarantee: a profile is immutable plain data with a stable hash, so every
result can say which policy it ran under, and two runs with one hash were held
to the same guarantees, whichever backend enforced them. The layers it requires
must be applied: a backend that cannot apply one refuses, unless the profile
lists it in ``downgrades`` (an explicit, recorded choice). Pure: stdlib only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from firstrun.policy.filesystem import FilesystemPolicy
from firstrun.policy.network import NetworkPolicy
from firstrun.policy.process import Limits


# A layer names a guarantee, not a program: each is named for the mechanism the
# reference (linux) backend uses, and LAYER_GUARANTEES says what it promises.
class LayerName(StrEnum):
    NAMESPACES = "namespaces"
    LANDLOCK = "landlock"
    SECCOMP = "seccomp"
    NETWORK = "network"
    LIMITS = "limits"
    UNPRIVILEGED = "unprivileged"


ALL_LAYERS = frozenset(LayerName)

# What each layer promises, whichever mechanism a backend provides it by.
LAYER_GUARANTEES: Mapping[LayerName, str] = {
    LayerName.NAMESPACES: "the session sees only its own processes, mounts and network",
    LayerName.LANDLOCK: "writes land only in the workspace and the session's own "
                        "temporary directories; the host's files stay unchanged",
    LayerName.SECCOMP: "kernel interfaces a sandbox has no use for are refused",
    LayerName.NETWORK: "the only way out is the egress proxy",
    LayerName.LIMITS: "memory, processes and output are capped",
    LayerName.UNPRIVILEGED: "commands run without root and without capabilities",
}

# A backend's declaration: for each layer it provides, the mechanism that does.
# ``unprovided`` checks a profile's ``enforced`` layers against it. So the
# docker backend, whose read-only root filesystem and tmpfs mounts confine
# writes exactly as Landlock does on linux, provides ``landlock`` by that
# mechanism and is enforced, while linux provides it only by Landlock and
# refuses when the kernel lacks it. Which mechanism applied each layer is
# recorded per session (``SessionInfo.layers``), not in the profile, so the
# policy hash stays a statement of what was required.
Provides = Mapping[LayerName, str]


@dataclass(frozen=True, kw_only=True)
class SandboxProfile:
    fs: FilesystemPolicy
    net: NetworkPolicy = field(default_factory=NetworkPolicy)
    limits: Limits = field(default_factory=Limits)
    # Also what a backend applies: a layer left out is not attempted at all by a
    # backend that can omit it (linux: seccomp, landlock, network), and that
    # session records the layer as not applied and itself as downgraded. Every
    # run's profile requires every layer; only ``firstrun audit`` leaves layers
    # out, to measure what each stops.
    required: frozenset[LayerName] = ALL_LAYERS
    downgrades: frozenset[LayerName] = frozenset()

    @property
    def enforced(self) -> frozenset[LayerName]:
        """The layers a session must apply: required, less the explicit downgrades."""
        return self.required - self.downgrades

    def to_data(self) -> dict[str, object]:
        return {
            "fs": self.fs.to_data(),
            "net": self.net.to_data(),
            "limits": self.limits.to_data(),
            "required": sorted(self.required),
            "downgrades": sorted(self.downgrades),
        }

    def policy_hash(self) -> str:
        """sha256 over the canonical JSON of the policy, host paths excluded.

        The workspace's host path differs per run and says nothing about what
        was allowed, so it is left out; everything that constrains is in.
        """
        blob = json.dumps(self.to_data(), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


def unprovided(profile: SandboxProfile, provides: Provides) -> tuple[LayerName, ...]:
    """The layers ``profile`` must have enforced that a backend declaring ``provides`` cannot give."""
    return tuple(sorted(profile.enforced - provides.keys()))
