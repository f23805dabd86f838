"""The ``firstrun`` command: argument wiring, and the only place that exits the process.

Guarantee: every bad input (an unknown flag, a malformed value, a too-broad host
pattern, a missing workspace or command, an invalid task file) ends in one line
naming the flag, or the file and line, and exit status 3, never a traceback.
``sandbox`` exits 125 when the sandbox refused or failed, else with the command's
status (124 on timeout); ``run`` and ``check`` exit 0 when every evidential run
passed, 1 on a docs gap, 2 with no evidence, 128+N on signal N (130 for Ctrl-C).
"""

from __future__ import annotations

import argparse
import atexit
import errno
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from firstrun import __version__
from firstrun.cli.interrupt import Signalled
from firstrun.errors import (
    AttestationFailed,
    FirstrunError,
    PolicyError,
    SandboxUnavailable,
    UsageError,
    one_line,
)
from firstrun.policy.filesystem import PROTECTED_NAMES
from firstrun.policy.process import DEFAULT_DISK_MB, MAX_COMMAND_TIMEOUT_S, MIN_DISK_MB
from firstrun.run.options import INSPECT_TLS_HELP, RUN_OPTION, RUN_OPTIONS, RunOption, usd
from firstrun.sandbox.select import BACKENDS

EXIT_USAGE = 3
# The options of ``run`` that ``mutate`` takes: what a replay sweep needs, no agent or spend.
MUTATE_OPTIONS = ("tasks", "examples", "backend", "image", "out", "resume", "config", "workers",
                  "docs_mirrors", "cache_dir", "refresh", "offline", "allow_unenforced", "inspect_tls",
                  "quiet", "verbose", "color")
# A sandbox that refused or failed: the message says who failed and, when
# known, the fix.
EXIT_SANDBOX = 125


class _Help(argparse.HelpFormatter):
    """argparse's wrapping for descriptions; an epilog of examples keeps its lines as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith(_EXAMPLES_HEAD):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors become a ``UsageError`` instead of exiting."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


_EXAMPLES_HEAD = "examples:\n"
# Every command's help ends with these (build_parser fails on a command without).
EXAMPLES: dict[str, tuple[str, ...]] = {
    "sandbox": ("firstrun sandbox -- python3 -c 'print(1)'",
                "firstrun sandbox --workspace . --allow pypi.org --allow files.pythonhosted.org "
                "-- pip install tabulate"),
    "doctor": ("firstrun doctor", "firstrun doctor --json"),
    "run": ("firstrun run --example all",
            "firstrun run tasks/ --agent claude --repeat 10 --workers 2 --out results/claude"),
    "mutate": ("firstrun mutate --example python-tabulate",
               "firstrun mutate tasks/quickstart.yaml --out results/mutate --json"),
    "check": ("firstrun check tasks/quickstart.yaml --sandbox results/runs/quickstart/1/workspace",),
    "show": ("firstrun show results/runs/quickstart/1",),
    "schema": ("firstrun schema > task.schema.json", "firstrun schema --findings > findings.schema.json"),
    "validate": ("firstrun validate tasks/", "firstrun validate tasks/ --format github"),
    "init": ("firstrun init https://docs.example.com/install/ https://docs.example.com/quickstart/",
             "firstrun init https://docs.example.com/start/ --docs-mirror docs.example.com=./site "
             "--out tasks/start.yaml"),
    "examples": ("firstrun examples", "firstrun run --example python-tabulate"),
    "diff": ("firstrun diff results/before results/after --fail-on-regression",),
    "report": ("firstrun report results --out report.html --markdown -",),
    "findings": ("firstrun findings results", "firstrun findings results --format json > findings.json",
                 "firstrun findings results/claude results/openai"),
    "audit": ("firstrun audit --backend linux", "firstrun audit --format markdown"),
    "images": ("firstrun images build", "firstrun images build --microvm"),
    "completion": ("firstrun completion bash > ~/.local/share/bash-completion/completions/firstrun",
                   "firstrun completion zsh > ~/.zfunc/_firstrun",
                   "firstrun completion fish > ~/.config/fish/completions/firstrun.fish"),
}


def _examples(lines: Sequence[str]) -> str:
    return _EXAMPLES_HEAD + "".join(f"  {line}\n" for line in lines)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    if value > MAX_COMMAND_TIMEOUT_S:
        # The sandbox refuses it too, but only once a session has started.
        raise argparse.ArgumentTypeError(f"must be at most {MAX_COMMAND_TIMEOUT_S:g} seconds (a week): {text!r}")
    return value


def _disk_mb(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of MiB: {text!r}") from None
    if value < 0 or 0 < value < MIN_DISK_MB:
        raise argparse.ArgumentTypeError(f"must be 0 (no bound) or at least {MIN_DISK_MB} MiB: {text!r}")
    return value


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``only="sandbox"``, the top level with that one command.

    The other commands' parsers import what their flags name (images,
    completion, the shared flags), which a sandboxed command's start (and
    ``--version``) would pay for and never use; a ``sandbox`` command line
    parses the same either way.
    """
    parser = _Parser(
        prog="firstrun",
        description="Run documentation quickstarts with an agent (or their documented commands) "
        "in an enforced sandbox whose only way out is a recording egress proxy, let each task's "
        "check decide, and report pass rates and where readers got stuck. 'firstrun sandbox' "
        "runs any one command in the same sandbox.",
        epilog=_examples(("firstrun run --example all", "firstrun doctor",
                          "firstrun sandbox -- npm install")),
        allow_abbrev=False,
    )
    parser.add_argument("-V", "--version", action="version", version=f"firstrun {__version__}")
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
    _add_run_option(sb, RUN_OPTION["image"])
    sb.add_argument("--allow", action="append", default=[], metavar="HOST",
                    help="also allow HOST (exact, or *.suffix, with optional :port); repeatable")
    sb.add_argument("--deny", action="append", default=[], metavar="HOST",
                    help="deny HOST even if allowed (deny wins); repeatable")
    sb.add_argument("--workspace", metavar="DIR",
                    help="existing directory mounted read-write at /workspace (default: a temporary one, removed afterwards)")
    sb.add_argument("--record", metavar="FILE", help="write one JSON line per egress decision to FILE")
    _allow_write_flag(sb)
    sb.add_argument("--allow-unenforced", action="store_true",
                    help="permit the 'local' and 'fake' backends, which enforce nothing (recorded as unenforced)")
    _add_run_option(sb, RUN_OPTION["downgrades"])
    sb.add_argument("--report-only", action="store_true",
                    help="let denied requests through but record would_deny (for writing allow-lists)")
    sb.add_argument("--inspect-tls", action="store_true", help=INSPECT_TLS_HELP)
    sb.add_argument("--timeout", type=_positive_seconds, metavar="SECONDS",
                    help="kill the command's whole process tree after SECONDS (default: 600)")
    sb.add_argument("--max-disk", type=_disk_mb, metavar="MB",
                    help="size of the temporary workspace's own filesystem; past it writes fail "
                    f"with ENOSPC (default: {DEFAULT_DISK_MB}; 0: no bound; not with --workspace)")
    sb.add_argument("--json", action="store_true",
                    help="print session info and egress records as JSON on stdout; the command's output goes to stderr")
    if only != "sandbox":
        _add_other_parsers(sub)
    for name, command in sub.choices.items():
        command.epilog = _examples(EXAMPLES[name])
    return parser


def _add_other_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from firstrun.cli.completion import SHELLS
    from firstrun.cli.flags import color_flag
    from firstrun.cli.images import add_images_parser

    doc = sub.add_parser(
        "doctor",
        help="show what this machine can enforce, and how to fix what it can't",
        description="Show what this machine can enforce and, for anything missing, the exact fix. "
        "Exit status 0 if the linux backend is usable, 1 otherwise.",
        allow_abbrev=False,
    )
    doc.add_argument("--json", action="store_true", help="print the findings as JSON")
    color_flag(doc)

    _add_run_parser(sub)
    _add_task_parsers(sub)
    _add_report_parsers(sub)
    add_images_parser(sub)
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh or fish)",
        description="Print the completion script for SHELL, made from this firstrun's own parser: "
        "its commands, their flags and the choices of flags that have them. Install it where "
        "the shell loads completions (see the examples; for zsh, a directory in $fpath), or "
        "load it in the shell's startup file: eval \"$(firstrun completion bash)\", "
        "source <(firstrun completion zsh), firstrun completion fish | source.",
        allow_abbrev=False,
    )
    completion.add_argument("shell", metavar="SHELL", choices=SHELLS, help="bash, zsh or fish")


def _add_run_option(parser: argparse.ArgumentParser, option: RunOption) -> None:
    """``option``'s parser entry, made from its one declaration in ``RUN_OPTIONS``."""
    kwargs: dict[str, Any] = {"help": option.help, "metavar": option.metavar}
    if option.choices is not None:
        kwargs["choices"] = option.choices
    if option.parse is not None:
        kwargs["type"] = _argument_type(option.parse)
    if option.kind == "positional":
        parser.add_argument(option.field, nargs="*", **kwargs)
        return
    assert option.flag is not None
    kwargs["dest"] = option.field
    if option.kind == "switch":
        del kwargs["metavar"]
        kwargs.update(action="store_true")
    elif option.kind == "toggle":
        # Where firstrun.yaml can turn it on, --no-FLAG must be able to win over it.
        del kwargs["metavar"]
        kwargs.update(action=argparse.BooleanOptionalAction, default=None)
    elif option.kind == "repeated":
        kwargs.update(action="append", default=[])
    else:
        kwargs.update(default=option.default)
    names = (option.flag,) if option.short is None else (option.short, option.flag)
    parser.add_argument(*names, **kwargs)


def _argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as argparse's ``type``: its ValueError becomes the message shown beside the flag."""
    def typed(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    typed.__name__ = parse.__name__
    return typed


def _allow_write_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-write", action="append", default=[], metavar="NAME",
        choices=PROTECTED_NAMES,
        help="let the sandbox write one protected entry of a workspace that is not firstrun's "
             f"own (repeatable; recorded): {', '.join(PROTECTED_NAMES)}")


def _add_run_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    run = sub.add_parser(
        "run",
        help="run tasks: sandbox, agent, success check, an honest result for each run",
        usage="firstrun run [TASK|DIR|GLOB...] [--example NAME|all] [OPTIONS]",
        description="Run each task in a fresh sandbox: setup, then the agent, then the success "
        "check, and save every finished run to OUT/results.json with its trace under OUT/runs/. "
        "With no TASK and no --example, runs tasks/*.yaml. Exit status: 0 every evidential run "
        "passed, 1 a docs gap, 2 no run produced evidence, 3 bad usage, 130 interrupted.",
        allow_abbrev=False,
    )
    for option in RUN_OPTIONS:
        _add_run_option(run, option)

    mutate = sub.add_parser(
        "mutate",
        help="prove each task's check can fail: replay it with a step removed or a pin broken",
        usage="firstrun mutate [TASK|DIR|GLOB...] [--example NAME|all] [OPTIONS]",
        description="Replay each task unmutated, then once per mutant: each replay step removed, "
        "each version pin in a step (==1.2.3, @1.2.3) replaced by one that does not exist. A "
        "mutant is killed when its run fails, survives when the check passes anyway (the step "
        "is not needed, or the check does not verify it), or is not run, with the reason. Runs "
        "are saved as by run (OUT/results.json, a trace per mutant; --resume continues). Exit "
        "status: 0 every mutant judged was killed, 1 one survived, 2 none could be judged, 3 "
        "bad usage, 130 interrupted.",
        allow_abbrev=False,
    )
    for field in MUTATE_OPTIONS:
        _add_run_option(mutate, RUN_OPTION[field])
    mutate.add_argument("--json", action="store_true",
                        help="print each task's score and every mutant's verdict as JSON")

    check = sub.add_parser(
        "check",
        help="re-run only a task's success check against a kept workspace",
        usage="firstrun check TASK --sandbox DIR [--backend B] [--image IMAGE] [--allow-unenforced] "
              "[--out DIR] [--allow-write NAME]... [--config FILE] [--[no-]inspect-tls]",
        description="Re-run only the success check of TASK in a fresh sandbox over a workspace "
        "kept by 'firstrun run --keep-sandbox'. Same backend rules as run. Exit status: 0 "
        "passed, 1 failed (a docs gap), 2 no evidence (the check could not run), 3 bad usage.",
        allow_abbrev=False,
    )
    check.add_argument("task", metavar="TASK", help="the task file")
    check.add_argument("--sandbox", required=True, metavar="DIR",
                       help="the kept workspace (OUT/runs/TASK/ATTEMPT/workspace)")
    check.add_argument("--backend", choices=BACKENDS,
                       help="sandbox backend (default: firstrun.yaml's, else auto)")
    check.add_argument("--allow-unenforced", action="store_true",
                       help="permit the 'local' and 'fake' backends, which enforce nothing")
    _add_run_option(check, RUN_OPTION["image"])
    check.add_argument("--out", metavar="DIR",
                       help="where the check's trace goes (default: firstrun.yaml's out, else results)")
    _allow_write_flag(check)
    check.add_argument("--config", metavar="FILE",
                       help="the project config (default: ./firstrun.yaml when it exists); its "
                       "backend, out, inspect_tls, isolation and task_defaults apply, and flags "
                       "given here win")
    _add_run_option(check, RUN_OPTION["inspect_tls"])


def _add_task_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from firstrun.cli.flags import color_flag

    show = sub.add_parser(
        "show",
        help="narrate a saved run trace in order",
        description="Narrate a saved trace: commands with exit codes and durations, docs reads, "
        "egress decisions (blocked ones marked), the check and the classification. TRACE is a "
        "trace.jsonl, a run directory, or a results directory (every run in it).",
        allow_abbrev=False,
    )
    show.add_argument("trace", metavar="TRACE")
    color_flag(show)

    schema = sub.add_parser(
        "schema",
        help="print the task file JSON Schema",
        description="Print the JSON Schema of task files, generated from the model that loads them; "
        "with --findings, the schema of 'firstrun findings --format json' instead.",
        allow_abbrev=False,
    )
    schema.add_argument("--findings", action="store_true",
                        help="print the JSON Schema of 'firstrun findings --format json'")

    validate = sub.add_parser(
        "validate",
        help="lint task files",
        description="Lint task files: invalid fields, checks that cannot fail or fail in silence, "
        "'serve' with no criterion, environments nothing creates, and (with --check-urls) "
        "unreachable docs pages. A task's replay is compared with its route's pages when they can "
        "be read offline (a bundled example, --docs-mirror) or --check-urls is given: drift, and "
        "what replay: docs will run. Exit status 1 if any finding is an error, 3 if no task file "
        "was found.",
        allow_abbrev=False,
    )
    validate.add_argument("tasks", nargs="*", metavar="TASK",
                          help="task files, directories or globs (default: tasks/)")
    validate.add_argument("--check-urls", action="store_true",
                          help="also fetch every page of each documented route")
    validate.add_argument("--docs-mirror", dest="docs_mirrors", action="append", default=[],
                          metavar="HOST=SRC",
                          help="read docs host HOST from directory SRC or a loopback server URL, "
                               "as run does; repeatable")
    validate.add_argument("--format", dest="validate_format", choices=("text", "json", "github"),
                          default="text",
                          help="text (one line per finding), json (a list of findings) or github "
                               "(workflow commands that annotate each file's line in a pull "
                               "request); default: text")

    init = sub.add_parser(
        "init",
        help="draft a task from docs pages, and run it once",
        usage="firstrun init URL [URL ...] [--name NAME] [--out FILE] [--docs-mirror HOST=SRC]... "
              "[--cache-dir DIR] [--backend B] [--allow-unenforced] [--results DIR]",
        description="Read the docs pages URL... (in reading order) as run reads them, and write a "
        "task that replays their own code blocks (replay: docs), with a goal from their titles "
        "and headings and a check drafted from what they show: each console block's output, "
        "loosened where it varies (versions, numbers, times, paths), must be printed, and each "
        "file they write must exist. Then run it once with replay in the sandbox and say what "
        "passed and what did not. 'firstrun validate' reports the check as drafted until it is "
        "edited. Never overwrites a file. Exit status: that of the run (0 passed, 1 a docs gap, "
        "2 no evidence), 3 bad usage.",
        allow_abbrev=False,
    )
    init.add_argument("urls", nargs="+", metavar="URL", help="the pages a reader follows, in order")
    init.add_argument("--name", help="the task name (default: from the first URL's host and path)")
    init.add_argument("--out", metavar="FILE", help="where to write it (default: tasks/NAME.yaml)")
    _add_run_option(init, RUN_OPTION["docs_mirrors"])
    _add_run_option(init, RUN_OPTION["cache_dir"])
    init.add_argument("--backend", choices=BACKENDS, default="auto",
                      help="sandbox backend of the draft's run (default: auto)")
    init.add_argument("--allow-unenforced", action="store_true",
                      help="permit the 'local' and 'fake' backends, which enforce nothing")
    init.add_argument("--results", metavar="DIR",
                      help="where the draft's run is saved (default: results/init/NAME); must be "
                           "new or empty")

    sub.add_parser(
        "examples",
        help="list the bundled examples",
        description="List the bundled examples, one per line: the name, then what it does. "
        "Run one with: firstrun run --example NAME",
        allow_abbrev=False,
    )


def _alpha(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive): {text!r}")
    return value


def _add_report_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from firstrun.cli.flags import color_flag, github_summary_flags

    diff = sub.add_parser(
        "diff",
        help="compare two sweeps task by task (Fisher exact test)",
        usage="firstrun diff BEFORE AFTER [--alpha A] [--fail-on-regression] [--color WHEN]",
        description="Compare the pass rates of two sweeps per task with a two-sided Fisher exact "
        "test over evidential runs. A task whose samples are too small for any outcome to be "
        "significant says so, with the sample per side that could. Then the findings "
        "('firstrun findings') that appeared, grew, shrank or disappeared, by their share of "
        "evidential runs. BEFORE and AFTER are results directories or results.json files. Exit status: 0, or 1 with --fail-on-regression when "
        "a task's pass rate dropped significantly; 3 bad usage.",
        allow_abbrev=False,
    )
    diff.add_argument("before", metavar="BEFORE", help="the earlier results directory or results.json")
    diff.add_argument("after", metavar="AFTER", help="the later results directory or results.json")
    diff.add_argument("--alpha", type=_alpha, default=0.05, metavar="A",
                      help="significance level of each test (default: 0.05)")
    diff.add_argument("--fail-on-regression", action="store_true",
                      help="exit 1 when any task's pass rate dropped significantly (the CI form)")
    color_flag(diff)

    report = sub.add_parser(
        "report",
        help="write an HTML report (and/or a markdown summary) of saved results",
        usage="firstrun report RESULTS_DIR [--out FILE.html] [--markdown FILE|-] "
        "[--github-summary | --github-summary-file FILE]",
        description="Render saved results: --out writes one self-contained HTML page (no network "
        "needed to view it); --markdown writes a markdown summary ('-' for stdout); "
        "--github-summary appends that summary to the file $GITHUB_STEP_SUMMARY names (the job "
        "summary in GitHub Actions), --github-summary-file to FILE; give one of the two. "
        "Exit status: 0, or 3 bad usage.",
        allow_abbrev=False,
    )
    report.add_argument("results", metavar="RESULTS_DIR", help="a results directory or its results.json")
    report.add_argument("--out", metavar="FILE", help="write the HTML report to FILE")
    report.add_argument("--markdown", metavar="FILE", help="write the markdown summary to FILE ('-': stdout)")
    github_summary_flags(report)

    findings = sub.add_parser(
        "findings",
        help="print what a docs team can act on: where runs broke, steps no page gave, the figures",
        usage="firstrun findings RESULTS_DIR [RESULTS_DIR...] [--format text|markdown|json|github] "
              "[--suggest [--agent A] [--model MODEL] [--base-url URL] [--max-spend USD] [--price-file FILE]]",
        description="From saved results and their traces: in each failing evidential run, the "
        "command it never got past, grouped by the page and code block it came from and by its "
        "error; the commands agents ran that no page read gives (improvised steps), counted across "
        "runs; the agents' final reports beside them; and pass^k, pass@k, time to success and cost "
        "per success. A run without its trace, or whose pages were saved without their code "
        "blocks, is named as a gap. The JSON follows 'firstrun schema --findings'; github prints "
        "one GitHub Actions warning per finding on its task file. Several results directories "
        "are arms (a sweep each, for example one per --model or --affordances): the arm x task "
        "matrix of pass rates with Wilson intervals, and Fisher's exact test per task between "
        "each pair of arms, come first. --suggest has the sweep's own model (or --agent/--model) "
        "draft the smallest docs change that would have prevented each shown finding, one call "
        "per finding without a current draft, under --max-spend; the drafts, their tokens and "
        "spend are saved in RESULTS_DIR/suggestions.json and shown beside the evidence, never "
        "in a figure. Exit status: 0, or 3 bad usage.",
        allow_abbrev=False,
    )
    findings.add_argument("results", metavar="RESULTS_DIR", nargs="+",
                          help="a results directory or its results.json; several: one per arm")
    findings.add_argument("--format", dest="findings_format", default="text",
                          choices=("text", "markdown", "json", "github"), help="output format (default: text)")
    findings.add_argument("--suggest", action="store_true",
                          help="draft a docs change per finding with a model, and save it (one RESULTS_DIR)")
    findings.add_argument("--agent", dest="suggest_agent", choices=("claude", "openai", "gemini"),
                          help="the vendor that drafts (default: the sweep's agent)")
    findings.add_argument("--model", dest="suggest_model", metavar="MODEL",
                          help="the model that drafts (default: the sweep's; a replay sweep needs it)")
    findings.add_argument("--base-url", dest="suggest_base_url", metavar="URL",
                          help="send the drafting calls to URL (a proxy, a compatible server); a URL "
                               "saved in the results is never used")
    findings.add_argument("--max-spend", dest="suggest_max_spend", metavar="USD",
                          type=_argument_type(usd),
                          help="make no drafting call that could take the spend past USD")
    findings.add_argument("--price-file", dest="suggest_price_file", metavar="FILE",
                          help=RUN_OPTION["price_file"].help)

    audit = sub.add_parser(
        "audit",
        help="measure what each sandbox layer stops, beside the model's prediction",
        usage="firstrun audit [--backend linux|docker|gvisor|local|all] [--format text|json|markdown]",
        description="Run a battery of actions a task needs and actions it does not inside each "
        "available backend, under every combination of the layers it can really turn off, and "
        "print the matrix (judged by evidence), the counts per configuration, the residual paths "
        "and every cell where the model disagrees. Exit status: 0 model and measurement agree; "
        "1 they disagree; 125 a backend named could not start; 3 bad usage.",
        allow_abbrev=False,
    )
    audit.add_argument("--backend", default="all", metavar="B",
                       help="linux, docker, gvisor, local (the unenforced baseline) or all "
                       "(default: all)")
    audit.add_argument("--format", dest="audit_format", default="text",
                       choices=("text", "json", "markdown"), help="output format (default: text)")


def _split_command(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """Options before the first ``--``, the command after it (None when there is no ``--``)."""
    args = list(argv)
    if "--" not in args:
        return args, None
    at = args.index("--")
    return args[:at], args[at + 1 :]


def _run(argv: Sequence[str]) -> int:
    if not argv:
        # A bare ``firstrun`` asks what it can do: the help, not an error.
        build_parser().print_help()
        return 0
    options, command = _split_command(argv)
    args = build_parser(only="sandbox" if options[:1] in (["sandbox"], ["-V"], ["--version"])
                        else None).parse_args(options)
    if args.subcommand != "sandbox" and command is not None:
        raise UsageError(f"{args.subcommand} takes no command after '--'")
    if args.subcommand == "doctor":
        from firstrun.cli.doctor import run_doctor

        return run_doctor(as_json=args.json, color=args.color)
    if args.subcommand in _COMMANDS:
        return _COMMANDS[args.subcommand](args, argv)
    if args.subcommand == "images":
        from firstrun.cli.images import images_command

        return images_command(args)

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
            downgrades=RUN_OPTION["downgrades"].request_value(args.downgrades),
            report_only=args.report_only,
            inspect_tls=args.inspect_tls,
            timeout_s=args.timeout,
            json=args.json,
            image=args.image,
            allow_write=tuple(args.allow_write),
            max_disk_mb=args.max_disk,
        )
    )


def _cmd_run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from firstrun.cli.run import RunRequest, run_sweep_command

    return run_sweep_command(RunRequest(
        **{option.field: option.request_value(getattr(args, option.field)) for option in RUN_OPTIONS},
        argv=("firstrun", *argv),
    ))


def _cmd_mutate(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from firstrun.cli.mutate import mutate_command
    from firstrun.cli.run import RunRequest

    return mutate_command(RunRequest(
        **{field: RUN_OPTION[field].request_value(getattr(args, field)) for field in MUTATE_OPTIONS},
        argv=("firstrun", *argv),
    ), as_json=args.json)


def _cmd_check(args: argparse.Namespace, _argv: Sequence[str]) -> int:
    from firstrun.cli.run import check_command

    return check_command(
        args.task, sandbox=args.sandbox, backend=args.backend,
        allow_unenforced=args.allow_unenforced, out=args.out, image=args.image,
        inspect_tls=args.inspect_tls, config=args.config, allow_write=tuple(args.allow_write),
    )


def _cmd_show(args: argparse.Namespace, _argv: Sequence[str]) -> int:
    from firstrun.cli.show import show

    return show(args.trace, color=args.color)


def _cmd_schema(args: argparse.Namespace, _argv: Sequence[str]) -> int:
    if args.findings:
        from firstrun.cli.report import findings_schema_text

        sys.stdout.write(findings_schema_text())
        return 0
    from firstrun.tasks.cli_support import schema_text

    sys.stdout.write(schema_text())
    return 0


def _cmd_validate(args: argparse.Namespace, _argv: Sequence[str]) -> int:
    from firstrun.cli.route_check import route_findings
    from firstrun.docs import parse_mirrors
    from firstrun.tasks.cli_support import validate_paths

    mirrors = parse_mirrors(args.docs_mirrors)
    findings, code = validate_paths(
        args.tasks, check_urls=args.check_urls,
        also=lambda task: route_findings(task, mirrors=mirrors, online=args.check_urls))
    if args.validate_format == "json":
        print(json.dumps([finding.to_data() for finding in findings], indent=2))
    elif args.validate_format == "github":
        for finding in findings:
            print(finding.github_annotation())
    else:
        for finding in findings:
            print(one_line(str(finding)))
    return code


def _cmd_init(args: argparse.Namespace, _argv: Sequence[str]) -> int:
    from firstrun.cli.scaffold import init_task, results_dir, task_name_for, try_draft
    from firstrun.docs import parse_mirrors

    mirrors = parse_mirrors(args.docs_mirrors)
    results = results_dir(args.results, args.name or task_name_for(args.urls[0]))
    path = init_task(args.urls, name=args.name, out=args.out, mirrors=mirrors, cache_dir=args.cache_dir)
    print(f"wrote {path}: its check is drafted from the docs; read and edit it "
          f"(firstrun validate {path} says so until then). Running it once with replay:")
    return try_draft(path, out=results, mirrors=mirrors, cache_dir=args.cache_dir,
                     backend=args.backend, allow_unenforced=args.allow_unenforced)


def _cmd_examples(_args: argparse.Namespace, _argv: Sequence[str]) -> int:
    from firstrun.examples import list_examples

    examples = list_examples()
    width = max(len(e.name) for e in examples)
    for example in examples:
        print(f"{example.name.ljust(width)}  {example.summary}")
    return 0


def _cmd_diff(args: argparse.Namespace, _argv: Sequence[str]) -> int:
    from firstrun.cli.report import diff_command

    return diff_command(args.before, args.after, alpha=args.alpha,
                        fail_on_regression=args.fail_on_regression, color=args.color)


def _cmd_report(args: argparse.Namespace, _argv: Sequence[str]) -> int:
    from firstrun.cli.report import report_command

    return report_command(args.results, out=args.out, markdown=args.markdown,
                          github_summary=args.github_summary,
                          github_summary_file=args.github_summary_file)


def _cmd_findings(args: argparse.Namespace, _argv: Sequence[str]) -> int:
    from firstrun.cli.report import findings_command

    return findings_command(args.results, fmt=args.findings_format, suggest=args.suggest,
                            agent=args.suggest_agent, model=args.suggest_model,
                            base_url=args.suggest_base_url, max_spend=args.suggest_max_spend,
                            price_file=args.suggest_price_file)


def _cmd_audit(args: argparse.Namespace, _argv: Sequence[str]) -> int:
    from firstrun.cli.audit import audit_command

    return audit_command(args.backend, args.audit_format)


def _cmd_completion(args: argparse.Namespace, _argv: Sequence[str]) -> int:
    from firstrun.cli.completion import completion_script

    sys.stdout.write(completion_script(build_parser(), args.shell))
    return 0


_COMMANDS = {
    "completion": _cmd_completion,
    "audit": _cmd_audit,
    "run": _cmd_run,
    "mutate": _cmd_mutate,
    "check": _cmd_check,
    "show": _cmd_show,
    "schema": _cmd_schema,
    "validate": _cmd_validate,
    "init": _cmd_init,
    "examples": _cmd_examples,
    "diff": _cmd_diff,
    "report": _cmd_report,
    "findings": _cmd_findings,
}


def main(argv: Sequence[str] | None = None) -> NoReturn:
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        code = _run(args)
    except (UsageError, PolicyError) as exc:
        print(f"firstrun: error: {one_line(exc.args[0])}", file=sys.stderr)
        code = EXIT_USAGE
    except (SandboxUnavailable, AttestationFailed) as exc:
        print(f"firstrun: refused ({exc.who}): {one_line(exc.args[0])}", file=sys.stderr)
        if isinstance(exc, SandboxUnavailable) and exc.fix:
            print(f"firstrun: fix: {exc.fix}", file=sys.stderr)
        code = EXIT_SANDBOX
    except FirstrunError as exc:
        print(f"firstrun: {exc.who} failed: {one_line(exc.args[0])}", file=sys.stderr)
        code = EXIT_SANDBOX
    except Signalled as sig:
        print("firstrun: interrupted; the session was closed", file=sys.stderr)
        code = 128 + sig.signum
    except KeyboardInterrupt:
        print("firstrun: interrupted", file=sys.stderr)
        code = 130
    except BrokenPipeError:
        # The reader left (``firstrun show RUN | head``): nothing is wrong, and
        # nothing more can be said to it.
        code = _reader_gone()
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            _print_traceback()
            print("firstrun: internal error (a bug in firstrun); the traceback is above", file=sys.stderr)
            code = EXIT_SANDBOX
        else:
            # Only a path given on the command line or in a file can be too long
            # for the filesystem, and pathlib's checks raise it from anywhere.
            print(f"firstrun: error: {one_line(os.fsdecode(exc.filename or ''))}: {exc.strerror}",
                  file=sys.stderr)
            code = EXIT_USAGE
    except Exception:
        # A bug in firstrun, not a bad input: keep the traceback, and keep the
        # status apart from any the command could have produced on its own.
        _print_traceback()
        print("firstrun: internal error (a bug in firstrun); the traceback is above", file=sys.stderr)
        code = EXIT_SANDBOX
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = _reader_gone()
    if argv is None and args[:1] == ["sandbox"]:
        _exit_now(code)
    sys.exit(code)


def _exit_now(code: int) -> NoReturn:
    """End the process with ``code`` once the exit functions ran, without the interpreter's
    teardown of its modules, which for a sandboxed command's (the proxy's, asyncio,
    dnspython) took about 40 ms and does nothing the command needs.

    Only when the command has nothing left running: by then the session is
    closed, the proxy stopped and every file it wrote closed, so no thread
    but this one is alive; otherwise the usual exit, which waits for them.
    """
    if threading.active_count() != 1:
        sys.exit(code)
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(code)


def _print_traceback() -> None:
    import traceback

    traceback.print_exc()


def _reader_gone() -> int:
    """The status of a command whose stdout reader closed the pipe early: 128 + SIGPIPE,
    as a command killed by it would have, with stdout pointed at /dev/null so the
    interpreter's own final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE
