"""``firstrun audit``: the matrix of action by configuration, measured, with the model beside it.

Guarantee: what is printed is exactly the measured ``AuditResult``: every cell
comes from the battery's evidence, the counts from those cells, and every cell
the model predicted otherwise is listed. Exit 0 only when model and measurement
agree on every cell that ran, 1 when any disagree (either one is a bug), 125
when a backend asked for by name cannot start.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from firstrun.audit.battery import (
    AUDITED_BACKENDS,
    CONTROLS,
    AuditResult,
    Configuration,
    Residual,
    backend_unavailable,
    run_audit,
)
from firstrun.audit.model import ACTIONS, ActionResult, AuditedLayer
from firstrun.errors import SandboxUnavailable, UsageError

# json is the schema-stable form (schema: firstrun.audit/2); markdown is a
# table for a README or a CI summary.
FORMATS = ("text", "json", "markdown")
EXIT_DISAGREE = 1

_MARK = {ActionResult.STOPPED: "stopped", ActionResult.THROUGH: "THROUGH", None: "not run"}
# One letter per layer, for compact column headings.
_LETTER = {AuditedLayer.FILESYSTEM: "F", AuditedLayer.NAMESPACES: "N", AuditedLayer.SECCOMP: "S",
           AuditedLayer.LANDLOCK: "L", AuditedLayer.NETWORK: "W", AuditedLayer.METHOD_RULES: "M",
           AuditedLayer.CREDENTIAL_MASKING: "C"}


def column(config: Configuration) -> str:
    """A configuration's short heading: its backend and the letters of its layers."""
    letters = "".join(_LETTER[layer] for layer in AuditedLayer if layer in config.layers)
    return f"{config.backend}:{letters or '-'}"


def _cell(result: AuditResult, name: str, action: str) -> str:
    for r in result.results:
        if r.configuration.name == name:
            for cell in r.cells:
                if cell.action == action:
                    mark = _MARK[cell.observed]
                    return mark + ("!" if not cell.agrees else "")
    return "?"


def _closers(res: Residual) -> str:
    if not res.closed_by:
        return "no layer the model knows"
    return "; ".join(
        layer.value + (f" ({CONTROLS[layer]})" if layer in CONTROLS else "")
        + ("" if layer in res.available else f", which {res.backend} cannot apply")
        for layer in res.closed_by)


def render_text(result: AuditResult) -> str:
    configs = [r.configuration for r in result.results]
    width = max(len(a.id) for a in ACTIONS) + 2
    cols = [column(c) for c in configs]
    colw = max([len("THROUGH!")] + [len(c) for c in cols]) + 1
    lines = ["Layers: " + ", ".join(f"{_LETTER[layer]} {layer.value}" for layer in AuditedLayer), ""]
    lines.append(" " * (width + 9) + "".join(c.ljust(colw) for c in cols))
    for act in ACTIONS:
        lines.append(act.id.ljust(width) + ("needed   " if act.needed else "unneeded ")
                     + "".join(_cell(result, c.name, act.id).ljust(colw) for c in configs))
    lines.append("")
    namew = max([len("configuration")] + [len(c.name) for c in configs])
    lines.append(f"{'column':{colw}}{'configuration':{namew}} {'unneeded open':>13} "
                 f"{'needed broken':>13} {'not run':>7}")
    for r in result.results:
        lines.append(f"{column(r.configuration):{colw}}{r.configuration.name:{namew}} "
                     f"{r.unneeded_open:>13} {r.needed_broken:>13} {r.not_run:>7}")
    for r in result.results:
        if r.configuration.host_refuses:
            lines.append(f"{r.configuration.name}: the harness already refuses, beneath every layer, "
                         + ", ".join(sorted(reach.value for reach in r.configuration.host_refuses))
                         + " (no layer needed)")
    lines.append("")
    lines.append("Residual: open under a configuration that omits no layer, and what closes it:")
    for config in configs:
        if config.omitted or not config.layers:
            continue
        open_ = [res for res in result.residual if res.configuration == config.name]
        lines.append(f"  {config.name}: " + ("nothing open" if not open_ else ""))
        for res in open_:
            lines.append(f"    {res.action}: closed by {_closers(res)}")
    for skipped in result.skipped:
        lines.append(f"Skipped {skipped.backend}: {skipped.reason}")
    lines.append("")
    if result.disagreements:
        lines.append("Model and measurement DISAGREE (marked ! above):")
        for name, cell in result.disagreements:
            lines.append(f"  {name}: {cell.action}: predicted {cell.predicted.value}, observed "
                         f"{cell.observed.value if cell.observed else '-'} ({cell.evidence})")
    else:
        lines.append("Model and measurement agree on every cell that ran.")
    return "\n".join(lines) + "\n"


def render_markdown(result: AuditResult) -> str:
    configs = [r.configuration for r in result.results]
    out = ["| action | needed | " + " | ".join(f"`{column(c)}`" for c in configs) + " |",
           "|---|---|" + "---|" * len(configs)]
    for act in ACTIONS:
        out.append(f"| {act.title} | {'yes' if act.needed else 'no'} | "
                   + " | ".join(_cell(result, c.name, act.id) for c in configs) + " |")
    out.append("| **unneeded open** | | "
               + " | ".join(str(r.unneeded_open) for r in result.results) + " |")
    out.append("| **needed broken** | | "
               + " | ".join(str(r.needed_broken) for r in result.results) + " |")
    out.append("")
    out.append("Layers: " + ", ".join(f"`{_LETTER[layer]}` {layer.value}" for layer in AuditedLayer)
               + ". `!` marks a cell where the model predicted otherwise.")
    if result.residual:
        out.append("")
        out.append("Residual (open under a configuration that omits no layer):")
        for res in result.residual:
            out.append(f"- {res.configuration}: `{res.action}`, closed by {_closers(res)}")
    for skipped in result.skipped:
        out.append(f"\nSkipped {skipped.backend}: {skipped.reason}")
    return "\n".join(out) + "\n"


def render_json(result: AuditResult) -> str:
    data = result.to_data()
    data["controls"] = {layer.value: how for layer, how in CONTROLS.items()}
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def audit_command(backend: str, fmt: str) -> int:
    """Run the audit for ``backend`` (a name or ``all``) and print it in ``fmt``."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if backend == "all":
        backends: Sequence[str] = AUDITED_BACKENDS
    else:
        if backend not in AUDITED_BACKENDS:
            raise UsageError(f"--backend {backend!r}: the audit covers "
                             f"{', '.join(AUDITED_BACKENDS)} (or all)")
        why = backend_unavailable(backend)
        if why is not None:
            raise SandboxUnavailable(f"cannot audit {backend}: {why}", who="audit",
                                     fix="run `firstrun doctor` for the fix")
        backends = (backend,)
    result = run_audit(backends, on_configuration=lambda c: print(
        f"firstrun audit: {c.name}", file=sys.stderr, flush=True))
    render = {"text": render_text, "json": render_json, "markdown": render_markdown}[fmt]
    sys.stdout.write(render(result))
    return exit_status(result)


def exit_status(result: AuditResult) -> int:
    """0 when the model and the measurement agree on every cell that ran; 1 otherwise."""
    return EXIT_DISAGREE if result.disagreements else 0
