"""``firstrun show``: a saved trace told in order, as a person would retell the run.

Guarantee: the narration is a pure function of the events in ``trace.jsonl``,
in their recorded order, never of a live run. Every event appears, blocked
egress marked ``BLOCKED`` and refused agent calls ``REFUSED``; what this version
cannot read (an unknown kind, a line that is not an event, fields of types it
never writes) is shown as such, so a newer trace is never silently shortened.
A results directory's traces are read only from inside it, and only regular files.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from firstrun.errors import UsageError
from firstrun.policy.network import destination_label
from firstrun.results.store import RESULTS_FILE, load_results
from firstrun.run.events import TRACE_FILE, read_trace

# Lines of a command's output shown under it; the trace keeps all of it.
_OUTPUT_TAIL = 6


class Style(StrEnum):
    """How a line should stand out; renderers map these to colours or leave them plain."""

    PLAIN = "plain"
    HEADING = "heading"
    OK = "ok"
    BAD = "bad"
    DIM = "dim"


@dataclass(frozen=True, kw_only=True)
class Line:
    text: str
    style: Style = Style.PLAIN


def trace_paths(target: str | os.PathLike[str]) -> list[Path]:
    """The traces ``firstrun show TARGET`` narrates.

    TARGET is a ``trace.jsonl``, a run directory holding one, or a results
    directory (``--out``), whose runs are narrated in the order they finished.
    """
    path = Path(target)
    if path.is_file():
        return [path]
    if (path / TRACE_FILE).is_file():
        return [path / TRACE_FILE]
    if (path / RESULTS_FILE).is_file():
        runs = load_results(path / RESULTS_FILE)["runs"]
        root = path.resolve()
        traces = []
        for i, run in enumerate(runs, start=1):
            trace = run.get("trace") if isinstance(run, dict) else None
            if not trace:
                continue
            if not isinstance(trace, str) or not (root / trace).resolve().is_relative_to(root):
                # A results file written elsewhere must not make show print this machine's files.
                raise UsageError(f"{path / RESULTS_FILE}: run {i}'s trace {trace!r} leads "
                                 "outside the results directory; not read")
            traces.append(path / trace)
        if not traces:
            raise UsageError(f"{path / RESULTS_FILE}: no run in it has a trace")
        return traces
    if path.is_dir():
        raise UsageError(
            f"{path}: neither a trace ({TRACE_FILE}), a run directory holding one, "
            f"nor a results directory ({RESULTS_FILE})"
        )
    raise UsageError(f"{path}: no such trace or directory")


def narrate_file(path: Path) -> list[Line]:
    """Narrate one saved trace; an unreadable file is a one-line ``UsageError``."""
    if path.exists() and not path.is_file():
        # Checked before opening: a FIFO would block the read forever.
        raise UsageError(f"{path}: cannot read the trace (not a regular file)")
    try:
        events = read_trace(path)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such trace") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the trace ({exc})") from None
    if not events:
        raise UsageError(f"{path}: not a trace (no event in it)")
    return narrate(events)


def narrate(events: Sequence[Mapping[str, Any]]) -> list[Line]:
    """The narration of one run's events, one or more lines per event, in order."""
    start = next((e["mono"] for e in events
                  if isinstance(e, Mapping) and isinstance(e.get("mono"), int | float)), None)
    lines: list[Line] = []
    for event in events:
        if not isinstance(event, Mapping):
            lines.append(Line(text=" " * 11 + f"(a line that is not an event: {_clip(event)})",
                              style=Style.DIM))
            continue
        mono = event.get("mono")
        at = " " * 9
        if start is not None and isinstance(mono, int | float) and abs(mono - start) < 1e9:
            at = f"{mono - start:8.2f}s"
        try:
            told = _TELLERS.get(str(event.get("kind")), _unknown)(event)
        except (AttributeError, KeyError, TypeError, ValueError, IndexError, OverflowError):
            # A field of a type this version never writes: say so, and go on.
            told = [Line(text=f"malformed {str(event.get('kind'))!r} event: {_clip(event)}",
                         style=Style.BAD)]
        first, *rest = told
        lines.append(Line(text=f"{at}  {first.text}", style=first.style))
        lines.extend(Line(text=" " * 11 + line.text, style=line.style) for line in rest)
    if not any(isinstance(e, Mapping) and e.get("kind") == "run_finished" for e in events):
        lines.append(
            Line(text=" " * 11 + "(the trace ends here: the run never finished; it was killed or crashed)",
                 style=Style.BAD)
        )
    return lines


def _clip(value: object) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= 120 else text[:117] + "..."


def _tail(text: str, label: str) -> list[Line]:
    kept = text.rstrip("\n").splitlines()
    if not kept:
        return []
    shown = kept[-_OUTPUT_TAIL:]
    head = f"{label} (last {len(shown)} of {len(kept)} lines):" if len(kept) > len(shown) else f"{label}:"
    return [Line(text=head, style=Style.DIM), *(Line(text=f"  | {s}", style=Style.DIM) for s in shown)]


def _run_started(e: Mapping[str, Any]) -> list[Line]:
    model = f" ({e['model']})" if e.get("model") else ""
    return [
        Line(text=f"run started: task {e.get('task')} attempt {e.get('attempt')}, agent {e.get('agent')}{model}",
             style=Style.HEADING),
        Line(text=f"task file {e.get('task_file')} (sha256 {str(e.get('task_sha256'))[:12]})", style=Style.DIM),
    ]


def _sandbox_started(e: Mapping[str, Any]) -> list[Line]:
    info = e.get("info") or {}
    checks = info.get("attestation") or []
    passed = sum(1 for c in checks if c.get("passed"))
    lines = [
        Line(text=f"sandbox started: backend {info.get('backend')}, enforcement {info.get('enforcement')}, "
                  f"attestation {passed}/{len(checks)} passed, policy {info.get('policy_hash')}")
    ]
    if info.get("downgrades"):
        lines.append(Line(text=f"downgraded layers: {', '.join(info['downgrades'])}", style=Style.BAD))
    lines.extend(
        Line(text=f"attestation failed: {c.get('name')}: {c.get('detail')}", style=Style.BAD)
        for c in checks if not c.get("passed")
    )
    return lines


def _command(e: Mapping[str, Any]) -> list[Line]:
    code = e.get("exit_code")
    failed = bool(e.get("timed_out")) or code != 0
    outcome = "timed out" if e.get("timed_out") else f"exit {code}"
    result = (f"-> {outcome} in {float(e.get('duration_s') or 0):.2f}s"
              + (" (output truncated)" if e.get("truncated") else ""))
    style = Style.BAD if failed else Style.OK
    first, *more = str(e.get("command") or "").splitlines() or [""]
    head = f"[{e.get('source')}] $ {first}"
    if more:
        lines = [Line(text=head), *(Line(text=f"    {line}", style=Style.DIM) for line in more),
                 Line(text=result, style=style)]
    else:
        lines = [Line(text=f"{head}  {result}", style=style)]
    origin = e.get("origin")
    if isinstance(origin, dict):
        # replay: docs names the page and block each step came from.
        lines.insert(1, Line(text=f"    from {origin.get('page')} block {origin.get('block')}",
                             style=Style.DIM))
    # The check's output is told with its verdict (check_finished), not twice.
    if failed and e.get("source") != "check":
        lines += _tail(str(e.get("stdout") or ""), "stdout") + _tail(str(e.get("stderr") or ""), "stderr")
    refusals = e.get("refusals")
    if isinstance(refusals, list):
        lines += [Line(text=f"    {line}", style=Style.BAD) for line in refusals
                  if isinstance(line, str)]
    return lines


def _docs_read(e: Mapping[str, Any]) -> list[Line]:
    page = e.get("page") or {}
    route = " (documented route)" if e.get("route") else ""
    requested, final = page.get("url_requested"), page.get("url_final")
    where = requested if final in (None, requested) else f"{requested} -> {final}"
    if page.get("error"):
        detail = f": {page['detail']}" if page.get("detail") else ""
        return [Line(text=f"docs read{route}: {where}: NOT READ, {page['error']}{detail}", style=Style.BAD)]
    cached = ", from cache" if page.get("from_cache") else ""
    title = f" \"{page['title']}\"" if page.get("title") else ""
    return [Line(text=f"docs read{route}: {where}{title}: {page.get('status')}, "
                      f"{page.get('bytes')} bytes{cached}")]


def _egress(e: Mapping[str, Any]) -> list[Line]:
    r = e.get("record") or {}
    where = destination_label(r.get("host"), r.get("port"), r.get("reason"))
    what = f"{r.get('method') or ''} {where}{r.get('path') or ''}".strip()
    channel = r.get("channel")
    if r.get("decision") == "deny":
        return [Line(text=f"egress BLOCKED ({channel}): {what}: {r.get('reason')} [{r.get('layer')}]",
                     style=Style.BAD)]
    if r.get("would_deny"):
        return [Line(text=f"egress WOULD BE BLOCKED ({channel}, report mode): {what}: {r['would_deny']}",
                     style=Style.BAD)]
    status = f", status {r['status']}" if r.get("status") is not None else ""
    return [Line(text=f"egress allowed ({channel}): {what}: {r.get('reason')}{status}", style=Style.DIM)]


def _agent_finished(e: Mapping[str, Any]) -> list[Line]:
    stop = e.get("stop")
    lines = [Line(text=f"agent finished: {stop} after {e.get('turns')} turns",
                  style=Style.OK if stop == "finished" else Style.BAD)]
    if e.get("detail"):
        lines.append(Line(text=f"detail: {e['detail']}"))
    if e.get("claim"):
        lines.append(Line(text=f"claim: {e['claim']}"))
    return lines


def _check_isolated(e: Mapping[str, Any]) -> list[Line]:
    if e.get("isolation") == "shared":
        return [Line(text="check shares the sandbox with the agent's processes (wait_http with no "
                          "serve): they could forge what it sees", style=Style.BAD)]
    killed = e.get("killed")
    left = f"{killed} process{'es' if killed != 1 else ''}" if isinstance(killed, int) else "what"
    return [Line(text=f"check runs clean: {left} left by setup and the agent killed first",
                 style=Style.DIM)]


def _check_finished(e: Mapping[str, Any]) -> list[Line]:
    code = e.get("exit_code")
    verdict = "no exit code (did not run)" if code is None else f"exit {code}"
    lines = [Line(text=f"check: {verdict} in {float(e.get('duration_s') or 0):.2f}s",
                  style=Style.OK if code == 0 else Style.BAD)]
    if e.get("detail"):
        lines.append(Line(text=f"detail: {e['detail']}"))
    return lines + _tail(str(e.get("output") or ""), "check output")


def _failure(e: Mapping[str, Any]) -> list[Line]:
    kind = "infrastructure" if e.get("infra") else "harness"
    reason = f" [{e['reason']}]" if e.get("reason") else ""
    return [Line(text=f"{kind} failure in {e.get('phase')}{reason} ({e.get('who')}, {e.get('error_type')}): "
                      f"{e.get('message')}", style=Style.BAD)]


def _run_finished(e: Mapping[str, Any]) -> list[Line]:
    classification = e.get("classification")
    return [Line(text=f"classification: {classification} ({e.get('reason')})",
                 style=Style.OK if classification == "passed" else Style.BAD)]


def _model_turn(e: Mapping[str, Any]) -> list[Line]:
    usage = e.get("usage") or {}
    tokens = (f"{usage.get('input_tokens')} in, {usage.get('output_tokens')} out"
              if usage else "tokens unknown")
    spend = f", spend {e['spend']}" if e.get("spend") is not None else ""
    lines = [Line(text=f"model turn {e.get('turn')}: {e.get('stop')} ({tokens}{spend})",
                  style=Style.HEADING)]
    if e.get("text"):
        lines += _tail(str(e["text"]), "said")
    for call in e.get("tool_calls") or ():
        refused = f" -> refused: {call['error']}" if call.get("error") else ""
        lines.append(Line(text=f"asks {call.get('name')} {call.get('arguments')}{refused}",
                          style=Style.BAD if refused else Style.PLAIN))
    return lines


def _permission(e: Mapping[str, Any]) -> list[Line]:
    call = f"{e.get('tool')} {e.get('argument')!r}"
    reason = str(e.get("reason"))
    verdict = {"deny_rule": "deny", "ask_rule": "ask", "allow_rule": "allow"}.get(reason)
    where = f" ({e['origin']})" if e.get("origin") else ""
    why = (f"{e.get('source')} {verdict} rule {e.get('rule')}{where}" if verdict
           else f"not on the {e.get('source')} allow list" if reason == "not_on_allow_list"
           else "no rule covers it")
    if e.get("verdict") == "allow":
        return [Line(text=f"permission: {call} allowed, {why}", style=Style.DIM)]
    nobody = ", and nobody is there to ask (unattended)" if e.get("mode") == "unattended" \
        and reason != "deny_rule" else ""
    return [Line(text=f"permission REFUSED: {call}: {why}{nobody}; it did not run",
                 style=Style.BAD)]


def _affordance_probe(e: Mapping[str, Any]) -> list[Line]:
    summary = e.get("summary") or {}
    found = [name for name, what in summary.items()
             if isinstance(what, Mapping) and (what.get("exists") or what.get("exist"))]
    text = ", ".join(found) if found else "none found"
    return [Line(text=f"docs affordances probed: {text}", style=Style.DIM)]


def _workspace_disk(e: Mapping[str, Any]) -> list[Line]:
    bound = e.get("bound_bytes")
    if not isinstance(bound, int):
        return [Line(text=f"workspace disk: not bounded ({e.get('mechanism')})", style=Style.DIM)]
    peak = int(e.get("peak_bytes") or 0)
    text = f"workspace disk: {peak >> 20} of {bound >> 20} MiB at most ({e.get('mechanism')})"
    if e.get("reached"):
        return [Line(text=text + ": the bound was reached; writes past it failed with ENOSPC",
                     style=Style.BAD)]
    return [Line(text=text, style=Style.DIM)]


def _image_lacked(e: Mapping[str, Any]) -> list[Line]:
    what = [*(f"command {c}" for c in e.get("commands") or ()),
            *(f"library {lib}" for lib in e.get("libraries") or ())]
    return [Line(text=f"image {e.get('image')} lacks {', '.join(what)}, which this host has: "
                      "not evidence about the docs", style=Style.BAD)]


def _unknown(e: Mapping[str, Any]) -> list[Line]:
    return [Line(text=f"event {e.get('kind')!r} (not known to this firstrun version)", style=Style.DIM)]


_TELLERS: dict[str, Callable[[Mapping[str, Any]], list[Line]]] = {
    "run_started": _run_started,
    "sandbox_started": _sandbox_started,
    "command": _command,
    "docs_read": _docs_read,
    "egress": _egress,
    "agent_finished": _agent_finished,
    "check_isolated": _check_isolated,
    "check_finished": _check_finished,
    "failure": _failure,
    "run_finished": _run_finished,
    "model_turn": _model_turn,
    "affordance_probe": _affordance_probe,
    "permission": _permission,
    "workspace_disk": _workspace_disk,
    "image_lacked": _image_lacked,
}
