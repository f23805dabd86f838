"""``firstrun doctor``: what this machine can enforce, and the exact fix for what it can't.

Guarantee: doctor only observes: every finding comes from asking the kernel or
the daemon directly (each backend's own probe, an open of /dev/kvm), never from
guesses. Every registered backend is reported with what it needs and the fix,
and which one ``auto`` would pick and why. The exit status is 0 when ``firstrun
sandbox --backend linux`` would run, 1 when it would be refused. The home
exposure shown is computed by the same function the sandbox uses.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from firstrun.errors import SandboxUnavailable
from firstrun.policy.filesystem import SYSTEM_READONLY
from firstrun.sandbox.base import Capability
from firstrun.sandbox.hostfs import host_filesystem_policy
from firstrun.sandbox.select import (
    REGISTRY,
    BackendOptions,
    probe_backend,
    resolve_backend,
)

# The backend whose verdict is doctor's exit status and its ``linux_*`` keys,
# as documented: the one that needs nothing beyond the host's own kernel. Its
# verdict is the registry's finding for it, so the two can never disagree.
VERDICT_BACKEND = "linux"


@dataclass(frozen=True, kw_only=True)
class Exposure:
    """What a default session binds beyond the system directories, and what it hides.

    ``homes`` are absent inside except for ``toolchains`` (bound read-only);
    ``masked`` are the secret paths inside those toolchain roots, covered over.
    """

    homes: tuple[str, ...]
    toolchains: tuple[str, ...]
    masked: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class BackendFinding:
    """One registered backend: usable here or not, and each thing it needs."""

    name: str
    available: bool
    capabilities: tuple[Capability, ...]


def _cap(c: Capability) -> dict[str, object]:
    return {"name": c.name, "available": c.available, "detail": c.detail, "fix": c.fix}


@dataclass(frozen=True, kw_only=True)
class Findings:
    linux_usable: bool
    capabilities: tuple[Capability, ...]
    exposure: Exposure
    backends: tuple[BackendFinding, ...] = ()
    auto: str = ""

    def to_data(self) -> dict[str, object]:
        return {
            "linux_usable": self.linux_usable,
            # Kept for readers of the JSON: what keeps linux from being usable
            # is now always a missing capability, each with its fix.
            "linux_refusal": None,
            "linux_fix": None,
            "capabilities": [_cap(c) for c in self.capabilities],
            "backends": [{"name": b.name, "available": b.available,
                          "capabilities": [_cap(c) for c in b.capabilities]}
                         for b in self.backends],
            "auto": self.auto,
            "exposure": {
                "homes": list(self.exposure.homes),
                "toolchains": list(self.exposure.toolchains),
                "masked": list(self.exposure.masked),
            },
        }


def default_exposure(env: Mapping[str, str]) -> Exposure:
    """The home-directory binds and masks a default session would get, from this environment."""
    with tempfile.TemporaryDirectory(prefix="firstrun-doctor-") as workspace:
        fs = host_filesystem_policy(workspace, env, protect=False)
    toolchains = tuple(p for p in fs.readonly if p not in SYSTEM_READONLY)
    return Exposure(homes=fs.real_homes, toolchains=toolchains, masked=fs.hidden)


def probe_backends() -> tuple[BackendFinding, ...]:
    """Every registered backend, probed as a default session would use it (local: not allowed)."""
    found = []
    for entry in REGISTRY:
        try:
            caps = probe_backend(entry.name, BackendOptions())
        except ImportError as exc:
            caps = (Capability(name="module", available=False,
                               detail=f"{entry.cls} cannot be loaded: {exc}",
                               fix="reinstall firstrun"),)
        found.append(BackendFinding(name=entry.name, available=all(c.available for c in caps),
                                    capabilities=caps))
    return tuple(found)


# The same list for code: the conformance suite runs against it.
def available_backends() -> tuple[str, ...]:
    """The backends usable here, unenforced ``local`` never among them."""
    return tuple(b.name for b in probe_backends() if b.available)


def _auto_choice() -> str:
    try:
        return resolve_backend("auto", BackendOptions()).explain()
    except SandboxUnavailable as exc:
        return f"none: {exc.args[0]}"


def gather(env: Mapping[str, str]) -> Findings:
    backends = probe_backends()
    verdict = next(b for b in backends if b.name == VERDICT_BACKEND)
    return Findings(
        linux_usable=verdict.available,
        capabilities=verdict.capabilities,
        exposure=default_exposure(env),
        backends=backends,
        auto=_auto_choice(),
    )


def _plain(findings: Findings) -> list[str]:
    lines = ["linux backend: " + ("usable" if findings.linux_usable else "NOT usable")]

    def section(title: str, caps: Sequence[Capability]) -> None:
        lines.append(title)
        for c in caps:
            lines.append(f"  [{'ok' if c.available else 'missing'}] {c.name}: {c.detail}")
            if not c.available and c.fix:
                lines.append(f"      fix: {c.fix}")

    for backend in findings.backends:
        section(f"backend {backend.name}: {'available' if backend.available else 'NOT available'}",
                backend.capabilities)
    lines.append(f"auto chooses: {findings.auto}")
    lines.append("a default session hides these homes:")
    lines.extend(f"  {p}" for p in findings.exposure.homes or ("(none)",))
    lines.append("except, read-only, what PATH needs (toolchain roots) and CA bundles:")
    lines.extend(f"  {p}" for p in findings.exposure.toolchains or ("(nothing)",))
    lines.append("and inside those it masks (secrets):")
    lines.extend(f"  {p}" for p in findings.exposure.masked or ("(nothing)",))
    return lines


def _rich(findings: Findings) -> None:
    from rich.table import Table
    from rich.text import Text

    from firstrun.cli.color import rich_console

    console = rich_console(sys.stdout, color=True)
    verdict = "[green]usable[/]" if findings.linux_usable else "[red]NOT usable[/]"
    console.print(f"linux backend: {verdict}")
    for title, caps in (
        *((f"Backend {b.name}: {'available' if b.available else 'NOT available'}",
           b.capabilities) for b in findings.backends),
    ):
        table = Table(title=title, title_justify="left")
        table.add_column("")
        table.add_column("capability")
        table.add_column("detail")
        table.add_column("fix")
        for c in caps:
            table.add_row(
                Text("ok", style="green") if c.available else Text("missing", style="red"),
                Text(c.name), Text(c.detail), Text("" if c.available else (c.fix or "")),
            )
        console.print(table)
    console.print(f"auto chooses: {findings.auto}", markup=False, highlight=False)
    table = Table(title="What a default session exposes from the homes", title_justify="left")
    table.add_column("")
    table.add_column("path")
    for p in findings.exposure.homes:
        table.add_row("hidden", Text(p))
    for p in findings.exposure.toolchains:
        table.add_row("bound read-only", Text(p))
    for p in findings.exposure.masked:
        table.add_row("masked (secret)", Text(p))
    console.print(table)


def run_doctor(*, as_json: bool, color: str = "auto") -> int:
    from firstrun.cli.color import colors

    findings = gather(os.environ)
    if as_json:
        sys.stdout.write(json.dumps(findings.to_data(), indent=2) + "\n")
    elif colors(color, sys.stdout):
        _rich(findings)
    else:
        print("\n".join(_plain(findings)))
    return 0 if findings.linux_usable else 1
