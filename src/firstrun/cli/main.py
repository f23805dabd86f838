"""The ``firstrun`` command: argument wiring, and the only place that exits the process.

Guarantee: every bad input (an unknown flag, a malformed value, a host
pattern that is too broad, a missing workspace or command) ends in one line
naming the flag and exit status 3, never a traceback. A sandbox that refused
or failed ends in exit status 125 with who failed and, when known, the fix.
Everything else is the command's own exit status (124 if it timed out).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from firstrun import __version__
from firstrun.cli.interrupt import Signalled
from firstrun.errors import (
    AttestationFailed,
    FirstrunError,
    PolicyError,
    SandboxUnavailable,
    UsageError,
)
from firstrun.policy.profile import LayerName

EXIT_USAGE = 3
EXIT_SANDBOX = 125

BACKENDS = ("auto", "linux", "local")


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors become a ``UsageError`` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="firstrun",
        description="Run commands inside an enforced sandbox whose only way out is a recording egress proxy.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"firstrun {__version__}")
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")

    sb = sub.add_parser(
        "sandbox",
        help="run one command in a fresh sandbox session",
        usage="firstrun sandbox [OPTIONS] -- COMMAND [ARG...]",
        description="Run one command in a fresh, attested sandbox session. Exit status: the "
        "command's own; 124 if it timed out; 125 if the sandbox refused or failed; 3 for bad usage.",
        allow_abbrev=False,
    )
    sb.add_argument("--backend", choices=BACKENDS, default="auto",
                    help="sandbox backend (default: auto, the strongest available)")
    sb.add_argument("--allow", action="append", default=[], metavar="HOST",
                    help="also allow HOST (exact, or *.suffix, with optional :port); repeatable")
    sb.add_argument("--deny", action="append", default=[], metavar="HOST",
                    help="deny HOST even if allowed (deny wins); repeatable")
    sb.add_argument("--workspace", metavar="DIR",
                    help="existing directory mounted read-write at /workspace (default: a temporary one, removed afterwards)")
    sb.add_argument("--record", metavar="FILE", help="write one JSON line per egress decision to FILE")
    sb.add_argument("--allow-unenforced", action="store_true",
                    help="permit the 'local' backend, which enforces nothing (recorded as unenforced)")
    sb.add_argument("--allow-downgrade", action="append", default=[], metavar="LAYER",
                    choices=[layer.value for layer in LayerName],
                    help=f"run even if LAYER cannot be applied (recorded); one of: {', '.join(sorted(LayerName))}")
    sb.add_argument("--report-only", action="store_true",
                    help="let denied requests through but record would_deny (for writing allow-lists)")
    sb.add_argument("--timeout", type=_positive_seconds, metavar="SECONDS",
                    help="kill the command's whole process tree after SECONDS (default: 600)")
    sb.add_argument("--json", action="store_true",
                    help="print session info and egress records as JSON on stdout; the command's output goes to stderr")

    doc = sub.add_parser(
        "doctor",
        help="show what this machine can enforce, and how to fix what it can't",
        description="Show what this machine can enforce and, for anything missing, the exact fix. "
        "Exit status 0 if the linux backend is usable, 1 otherwise.",
        allow_abbrev=False,
    )
    doc.add_argument("--json", action="store_true", help="print the findings as JSON")
    return parser


def _split_command(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """Options before the first ``--``, the command after it (None when there is no ``--``)."""
    args = list(argv)
    if "--" not in args:
        return args, None
    at = args.index("--")
    return args[:at], args[at + 1 :]


def _run(argv: Sequence[str]) -> int:
    options, command = _split_command(argv)
    args = build_parser().parse_args(options)
    if args.subcommand == "doctor":
        if command is not None:
            raise UsageError("doctor takes no command after '--'")
        from firstrun.cli.doctor import run_doctor

        return run_doctor(as_json=args.json)

    if not command:
        raise UsageError(
            "sandbox: missing command: put it after '--', e.g. firstrun sandbox -- echo hi"
        )
    from firstrun.cli.sandbox import SandboxRequest, run_sandbox

    return run_sandbox(
        SandboxRequest(
            command=tuple(command),
            backend=args.backend,
            allow=tuple(args.allow),
            deny=tuple(args.deny),
            workspace=args.workspace,
            record=args.record,
            allow_unenforced=args.allow_unenforced,
            downgrades=frozenset(LayerName(layer) for layer in args.allow_downgrade),
            report_only=args.report_only,
            timeout_s=args.timeout,
            json=args.json,
        )
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())


def main(argv: Sequence[str] | None = None) -> NoReturn:
    try:
        code = _run(sys.argv[1:] if argv is None else argv)
    except (UsageError, PolicyError) as exc:
        print(f"firstrun: error: {_one_line(exc.args[0])}", file=sys.stderr)
        code = EXIT_USAGE
    except (SandboxUnavailable, AttestationFailed) as exc:
        print(f"firstrun: refused ({exc.who}): {_one_line(exc.args[0])}", file=sys.stderr)
        if isinstance(exc, SandboxUnavailable) and exc.fix:
            print(f"firstrun: fix: {exc.fix}", file=sys.stderr)
        code = EXIT_SANDBOX
    except FirstrunError as exc:
        print(f"firstrun: {exc.who} failed: {_one_line(exc.args[0])}", file=sys.stderr)
        code = EXIT_SANDBOX
    except Signalled as sig:
        print("firstrun: interrupted; the session was closed", file=sys.stderr)
        code = 128 + sig.signum
    except KeyboardInterrupt:
        print("firstrun: interrupted", file=sys.stderr)
        code = 130
    except Exception:
        # A bug in firstrun, not a bad input: keep the traceback, and keep the
        # status apart from any the command could have produced on its own.
        traceback.print_exc()
        print("firstrun: internal error (a bug in firstrun); the traceback is above", file=sys.stderr)
        code = EXIT_SANDBOX
    sys.stdout.flush()
    sys.exit(code)
