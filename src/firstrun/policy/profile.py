"""A sandbox profile: filesystem, network and process policy, as one value.

Guarantee: a profile is immutable plain data with a stable hash, so every
result can say exactly which policy it ran under, and two runs with the same
hash were constrained identically. Which enforcement layers are required is
part of the profile; a backend that cannot apply one must refuse, unless the
profile lists that layer in ``downgrades`` (an explicit, recorded choice).

Pure: stdlib only, no I/O.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import StrEnum

from firstrun.policy.filesystem import FilesystemPolicy
from firstrun.policy.network import NetworkPolicy
from firstrun.policy.process import Limits


class LayerName(StrEnum):
    NAMESPACES = "namespaces"
    LANDLOCK = "landlock"
    SECCOMP = "seccomp"
    NETWORK = "network"
    LIMITS = "limits"
    UNPRIVILEGED = "unprivileged"


ALL_LAYERS = frozenset(LayerName)


@dataclass(frozen=True, kw_only=True)
class SandboxProfile:
    fs: FilesystemPolicy
    net: NetworkPolicy = field(default_factory=NetworkPolicy)
    limits: Limits = field(default_factory=Limits)
    required: frozenset[LayerName] = ALL_LAYERS
    downgrades: frozenset[LayerName] = frozenset()

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
