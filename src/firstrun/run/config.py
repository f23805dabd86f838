"""How runs are carried out: one frozen value shared by every run of a sweep.

Guarantee: the defaults are the secure ones: an enforcing backend chosen by
``auto``, no unenforced execution, no downgraded layer, the workspace thrown
away after the run, and egress enforced rather than reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from firstrun.docs import Affordances, CacheMode, Mirror, Politeness
from firstrun.errors import UsageError
from firstrun.policy.permissions import RuleSet
from firstrun.policy.profile import LayerName
from firstrun.sandbox.select import BACKENDS, Entry


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """``out_dir`` is ``--out``; traces go to ``out_dir/runs/<task>/<attempt>/``.

    ``politeness`` is shared by every run given this config, so parallel runs
    space their requests to one docs host together; None gives each run its
    own (``run_suite`` shares one across its workers). ``affordances`` is
    ``--affordances`` (``none`` hides llms.txt, llms-full.txt and .md variants
    from read_docs) and ``probe_affordances`` records which of them exist.
    ``inspect_tls`` is ``--inspect-tls``: the proxy decrypts tunnels with a
    per-run CA and applies the method rules and credentials (policy.methods).
    ``chosen`` is ``backend``'s registry entry, resolved once for the sweep
    (``run_suite``) and carried by every run, to its Ray node too; None: a
    lone run resolves ``backend`` itself, once.
    """

    out_dir: Path
    backend: str = "auto"
    chosen: Entry | None = None
    allow_unenforced: bool = False
    # ``--allow-downgrade``: layers a run may go without (recorded), as in the profile.
    downgrades: frozenset[LayerName] = frozenset()
    keep_sandbox: bool = False
    docs_mirrors: Mapping[str, Mirror] = field(default_factory=dict)
    cache_dir: Path | None = None
    # ``--refresh`` or ``--offline``: how the reader uses ``cache_dir``.
    cache_mode: CacheMode = CacheMode.USE
    politeness: Politeness | None = None
    report_only: bool = False
    affordances: Affordances = Affordances.ALL
    probe_affordances: bool = False
    inspect_tls: bool = False
    # ``--image``: a container backend's image for tasks that name none.
    image: str | None = None
    # The project config's permission rules; each run adds its task's own.
    permissions: tuple[RuleSet, ...] = ()

    def __post_init__(self) -> None:
        # Refused here, once, so a sweep never starts runs that all fail alike.
        if self.backend not in BACKENDS:
            raise UsageError(
                f"--backend: unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}"
            )
        if self.chosen is not None and self.chosen.name != self.backend:
            raise ValueError(f"backend {self.backend!r} resolved to another's entry "
                             f"({self.chosen.name!r})")
