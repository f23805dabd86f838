"""read_docs: the harness-side reader every documentation page passes through.

Guarantee: this package is the only way an agent reads docs; see ``reader``
for what each read checks and records.
"""

from .affordances import (
    AffordanceFilter,
    AffordanceProbe,
    Affordances,
    probe_affordances,
)
from .cache import CacheMode
from .mirror import Mirror, parse_mirrors
from .page import Page, ReadFailure
from .politeness import Politeness
from .reader import DocsReader, default_user_agent

__all__ = [
    "AffordanceFilter",
    "AffordanceProbe",
    "Affordances",
    "CacheMode",
    "DocsReader",
    "Mirror",
    "Page",
    "Politeness",
    "ReadFailure",
    "default_user_agent",
    "parse_mirrors",
    "probe_affordances",
]
