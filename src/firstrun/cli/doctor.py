"""``firstrun doctor``: what this machine can enforce, and the exact fix for what it can't.

Guarantee: doctor only observes. It never changes the machine; every finding
comes from asking the kernel or the daemon directly (the linux backend's own
``probe()``, the docker backend's daemon probe over its socket, an open of
/dev/kvm), never from guesses. Every registered backend is reported with
what it needs (docker: the daemon, its Engine version judged against
CVE-2024-29018 and how that is mitigated, the default image present), and
which one ``auto`` would pick and why it passed the better ones over;
``available_backends`` is that same list for code (the conformance suite
runs against it). Its exit status says whether ``firstrun sandbox
--backend linux`` would be refused: 0 when the linux backend is usable, 1
otherwise. It also shows what a default session would expose from the home
directory (toolchain roots) and what it masks (secrets), computed by the same
function the sandbox uses.
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
    select_backend,
)


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
    linux_refusal: str | None
    linux_fix: str | None
    capabilities: tuple[Capability, ...]
    exposure: Exposure
    backends: tuple[BackendFinding, ...] = ()
    auto: str = ""

    def to_data(self) -> dict[str, object]:
        return {
            "linux_usable": self.linux_usable,
            "linux_refusal": self.linux_refusal,
            "linux_fix": self.linux_fix,
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


def available_backends() -> tuple[str, ...]:
    """The backends usable here, unenforced ``local`` never among them."""
    return tuple(b.name for b in probe_backends() if b.available)


def _auto_choice() -> str:
    try:
        return resolve_backend("auto", BackendOptions()).explain()
    except SandboxUnavailable as exc:
        return f"none: {exc.args[0]}"


def gather(env: Mapping[str, str]) -> Findings:
    refusal: str | None = None
    fix: str | None = None
    capabilities: tuple[Capability, ...] = ()
    try:
        backend = select_backend("linux", allow_unenforced=False)
        capabilities = backend.probe()
    except SandboxUnavailable as exc:
        refusal, fix = str(exc), exc.fix
    return Findings(
        linux_usable=refusal is None and all(c.available for c in capabilities),
        linux_refusal=refusal,
        linux_fix=fix,
        capabilities=capabilities,
        exposure=default_exposure(env),
        backends=probe_backends(),
        auto=_auto_choice(),
    )


def _plain(findings: Findings) -> list[str]:
    lines = ["linux backend: " + ("usable" if findings.linux_usable else "NOT usable")]
    if findings.linux_refusal:
        lines.append(f"  refused: {findings.linux_refusal}")
        if findings.linux_fix:
            lines.append(f"  fix: {findings.linux_fix}")

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
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    verdict = "[green]usable[/]" if findings.linux_usable else "[red]NOT usable[/]"
    console.print(f"linux backend: {verdict}")
    if findings.linux_refusal:
        console.print(f"  refused: {findings.linux_refusal}", markup=False, highlight=False)
        if findings.linux_fix:
            console.print(f"  fix: {findings.linux_fix}", markup=False, highlight=False)
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


def run_doctor(*, as_json: bool) -> int:
    findings = gather(os.environ)
    if as_json:
        sys.stdout.write(json.dumps(findings.to_data(), indent=2) + "\n")
    elif sys.stdout.isatty():
        _rich(findings)
    else:
        print("\n".join(_plain(findings)))
    return 0 if findings.linux_usable else 1
