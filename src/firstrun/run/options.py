"""``firstrun run``'s options, each declared once.

Guarantee: every option of ``firstrun run`` is one entry of ``RUN_OPTIONS``, and
that entry alone says its flag, how its value is read, which ``firstrun.yaml``
key may default it, and whether it is part of the sweep's identity or why not.
The parser, the project-config merge, the keys a project config may not set, the
sweep identity and the meta are all made from this table, so an option cannot be
added to one of them and forgotten in another.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from firstrun.policy.images import image_reference_error
from firstrun.policy.profile import LayerName
from firstrun.sandbox.select import BACKENDS

# Every attempt is queued before the first starts, so an absurd --repeat would
# fill memory instead of running; this is days of runs for even one task.
MAX_REPEAT = 10_000

# Where runs are carried out (``--engine``).
ENGINES = ("local", "ray")

# ``--github-summary`` and ``--github-summary-file``, for every command that writes the summary.
GITHUB_SUMMARY_HELP = ("append a markdown summary to the file $GITHUB_STEP_SUMMARY names (the "
                       "job summary in GitHub Actions); takes no value, and is refused together "
                       "with --github-summary-file")
GITHUB_SUMMARY_FILE_HELP = "append a markdown summary to FILE (refused together with --github-summary)"

# ``--color``, for every command that styles its output (``cli.color`` decides).
COLORS = ("auto", "always", "never")
COLOR_HELP = ("style the output with tables and colour: auto on a terminal (off when $NO_COLOR "
              "is set, on anywhere when $FORCE_COLOR is), always, or never (the plain text a pipe "
              "gets); default: auto")


def positive_int(text: str) -> int:
    """Raises ``ValueError`` naming what is wrong (the parser shows it beside the flag)."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise ValueError(f"must be at least 1: {text!r}")
    return value


def repeat_count(text: str) -> int:
    value = positive_int(text)
    if value > MAX_REPEAT:
        raise ValueError(f"must be at most {MAX_REPEAT}: {text!r}")
    return value


def usd(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"not an amount of USD: {text!r}") from None
    if not value.is_finite() or value <= 0:
        raise ValueError(f"must be a positive amount of USD: {text!r}")
    return value


def image_reference(text: str) -> str:
    if (why := image_reference_error(text)) is not None:
        raise ValueError(why)
    return text


# How a flag takes its value: ``value`` (one, the last given wins), ``switch``
# (present or not), ``toggle`` (--x and --no-x, unset when neither is given),
# ``repeated`` (each use adds one; for --agent, --model and --affordances each
# value is an arm, ``results.arms``) and ``positional`` (the bare arguments).
Kind = Literal["value", "switch", "toggle", "repeated", "positional"]


@dataclass(frozen=True, kw_only=True)
class RunOption:
    """One option: ``field`` names it in ``RunRequest`` (and is the parser's dest).

    ``project`` is the ``firstrun.yaml`` key whose value the option takes when
    the flag is not given, and ``fallback`` its value when neither says one.
    Exactly one of ``identity`` (the ``SweepIdentity`` field it decides) and
    ``exempt`` (why two sweeps that differ in it still measure the same thing)
    is set. ``recorded`` turns the value into what the identity and the meta
    save; ``meta`` copies it into ``results.json``'s meta.
    """

    field: str
    flag: str | None
    kind: Kind
    help: str
    # A one-letter spelling beside ``flag`` (-q for --quiet).
    short: str | None = None
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    # What the request holds from the parsed arguments (a list becomes a tuple).
    convert: Callable[[Any], Any] | None = None
    default: Any = None
    project: str | None = None
    fallback: Any = None
    identity: str | None = None
    exempt: str | None = None
    recorded: Callable[[Any], Any] | None = None
    meta: bool = False

    def __post_init__(self) -> None:
        if (self.identity is None) == (self.exempt is None):
            raise ValueError(f"run option {self.field}: give exactly one of identity and exempt")
        if (self.flag is None) != (self.kind == "positional"):
            raise ValueError(f"run option {self.field}: only the positional arguments have no flag")
        if self.short is not None and (self.flag is None or len(self.short) != 2):
            raise ValueError(f"run option {self.field}: a short spelling is one letter beside a flag")
        if self.fallback is not None and self.project is None:
            raise ValueError(f"run option {self.field}: a fallback needs a project key")

    def request_value(self, parsed: Any) -> Any:
        """The parser's value as ``RunRequest`` holds it."""
        return parsed if self.convert is None else self.convert(parsed)

    def record(self, value: Any) -> Any:
        """``value`` as the identity and the meta save it (plain JSON data)."""
        return value if self.recorded is None else self.recorded(value)


def _layers(values: list[str]) -> frozenset[LayerName]:
    return frozenset(LayerName(v) for v in values)


INSPECT_TLS_HELP = (
    "decrypt HTTPS in the proxy with a per-run CA the sandbox trusts: every host becomes GET/HEAD "
    "only (uploads refused and recorded) unless the task's firstrun.methods opens more, and "
    "firstrun.credentials work (linux, docker and gvisor backends)")

_WHERE = "where the sweep runs or keeps its files, not what it measures"
_HOW_FAST = "how fast the sweep goes, not what one run measures"
_WHAT_IS_PRINTED = "what the command prints and how, not what a run measures"

# A test holds every option to be in the identity or exempt with a reason. The
# identity's own type (results.model.SweepIdentity) lives below this layer,
# because saved results are read without any of the CLI; a test holds its fields
# and the names it shows the user to this table.
RUN_OPTIONS: tuple[RunOption, ...] = (
    RunOption(field="tasks", flag=None, kind="positional", metavar="TASK", convert=tuple, default=(),
              help="task files, directories of them, or globs (default: tasks/*.yaml)",
              exempt="the tasks are identified by their files' and checks' hashes instead"),
    RunOption(field="examples", flag="--example", kind="repeated", metavar="NAME", convert=tuple,
              default=(),
              help="run a bundled example (see 'firstrun examples'), or 'all'; repeatable",
              exempt="the tasks are identified by their files' and checks' hashes instead"),
    RunOption(field="agent", flag="--agent", kind="repeated", convert=tuple, default=(),
              help="who works through the docs (default: replay, which runs the task's replay "
              "steps and needs no model or key); repeatable: each value is an arm",
              identity="agent", meta=True),
    RunOption(field="model", flag="--model", kind="repeated", convert=tuple, default=(),
              help="the model the agent uses (agents that take one); repeatable: each value is "
              "an arm, run on every task (OUT/ARM/ per arm)",
              identity="model", meta=True),
    RunOption(field="base_url", flag="--base-url", kind="value", metavar="URL",
              help="send the model agent's API calls to URL (a proxy, a compatible server)",
              identity="base_url"),
    RunOption(field="max_spend", flag="--max-spend", kind="value", metavar="USD", parse=usd,
              help="stop starting runs once this much could be spent; each run reserves its share "
              "before it starts, so it holds with --workers too",
              exempt="a cap on what the sweep may cost; the runs it lets start are the same runs",
              recorded=lambda value: None if value is None else str(value), meta=True),
    RunOption(field="price_file", flag="--price-file", kind="value", metavar="FILE",
              help="model prices (JSON or YAML: MODEL: {input, output, cached} USD per million "
              "tokens); wins over the bundled genai-prices table",
              exempt="prices change what a run costs, not what it does"),
    RunOption(field="backend", flag="--backend", kind="value", choices=BACKENDS,
              help="sandbox backend (default: firstrun.yaml's, else auto, the strongest available)",
              project="backend", fallback="auto",
              # The identity and the meta save the backend auto resolved to.
              identity="backend", meta=True),
    RunOption(field="image", flag="--image", kind="value", metavar="IMAGE", parse=image_reference,
              help="container image for the docker backend when a task names none (default: "
              "firstrun/python:3.11; build it with 'firstrun images build')",
              identity="image"),
    RunOption(field="out", flag="--out", kind="value", metavar="DIR",
              help="where results.json and runs/TASK/ATTEMPT/trace.jsonl go (default: "
              "firstrun.yaml's, else results)",
              project="out", fallback="results", exempt=_WHERE),
    RunOption(field="resume", flag="--resume", kind="value", metavar="DIR",
              help="continue the interrupted sweep saved in DIR, running only the attempts it has "
              "no finished run for; refused unless the tasks and every option that decides what "
              "a sweep measures match the sweep's",
              exempt="it names the sweep whose identity the command must match"),
    RunOption(field="config", flag="--config", kind="value", metavar="FILE",
              help="the project config (default: ./firstrun.yaml when it exists); its values are "
              "defaults, and flags given here win",
              exempt="what of it changes the tasks is in the identity as task_defaults_sha256"),
    RunOption(field="keep_sandbox", flag="--keep-sandbox", kind="switch", default=False,
              help="keep each run's workspace at OUT/runs/TASK/ATTEMPT/workspace (for 'firstrun check')",
              exempt=_WHERE),
    RunOption(field="repeat", flag="--repeat", kind="value", metavar="N", parse=repeat_count,
              default=1, help=f"run each task N times (default: 1, at most {MAX_REPEAT})",
              identity="repeat"),
    RunOption(field="workers", flag="--workers", kind="value", metavar="N", parse=positive_int,
              help="run up to N runs at once, cluster-wide under --engine ray (default: "
              "firstrun.yaml's, else 1; under --engine ray, the eligible nodes' CPUs)",
              project="workers", exempt=_HOW_FAST),
    RunOption(field="engine", flag="--engine", kind="value", choices=ENGINES,
              help="where runs are carried out: local (threads on this machine) or ray (one "
              "Ray task per run on a cluster's nodes; pip install 'firstrun[ray]') (default: "
              "firstrun.yaml's, else local)",
              project="engine", fallback="local",
              exempt="where each run is carried out; every node runs the sweep's one backend "
              "at this firstrun version", meta=True),
    RunOption(field="ray_address", flag="--ray-address", kind="value", metavar="ADDR",
              help="the Ray cluster to join: HOST:PORT of its head, auto (the cluster this "
              "machine belongs to), or local (a new one on this machine) (default: "
              "firstrun.yaml's, else $RAY_ADDRESS, else auto)",
              project="ray_address", exempt=_WHERE),
    RunOption(field="retry_infra", flag="--retry-infra", kind="switch", default=False,
              help="with --resume: run again the attempts stored as infra_error (a lost node's "
              "node_lost among them); each new record replaces the old",
              exempt="which stored attempts count as finished, not what a run measures"),
    RunOption(field="junit", flag="--junit", kind="value", metavar="FILE",
              help="also write JUnit XML: a docs gap is a failure, trouble that kept a run from "
              "judging is an error, a skip is skipped",
              exempt="a report written from the saved runs"),
    RunOption(field="github_summary", flag="--github-summary", kind="switch", default=False,
              help=GITHUB_SUMMARY_HELP, exempt="a report written from the saved runs"),
    RunOption(field="github_summary_file", flag="--github-summary-file", kind="value", metavar="FILE",
              help=GITHUB_SUMMARY_FILE_HELP, exempt="a report written from the saved runs"),
    RunOption(field="docs_mirrors", flag="--docs-mirror", kind="repeated", metavar="HOST=SRC",
              convert=tuple, default=(),
              help="serve docs host HOST from directory SRC or a loopback server URL; repeatable",
              exempt="where the same pages are served from; firstrun.yaml's docs_mirrors are "
              "merged in, and the flag wins per host"),
    RunOption(field="cache_dir", flag="--cache-dir", kind="value", metavar="DIR",
              help="cache fetched docs pages in DIR (default: firstrun.yaml's, else none)",
              project="cache_dir", exempt=_WHERE),
    RunOption(field="refresh", flag="--refresh", kind="switch", default=False,
              help="fetch every docs page anew and store it in the cache (cached pages never "
              "expire otherwise)",
              exempt="where the same pages are read from, not what a run measures"),
    RunOption(field="offline", flag="--offline", kind="switch", default=False,
              help="read docs pages from the cache only and fetch nothing; a page it lacks "
              "ends the run as infra_error, naming the page",
              exempt="where the same pages are read from, not what a run measures"),
    # The values of firstrun.docs.Affordances, named here so parsing imports no docs code.
    RunOption(field="affordances", flag="--affordances", kind="repeated", choices=("all", "none"),
              convert=tuple, default=(),
              help="none hides llms.txt, llms-full.txt and .md page variants from read_docs "
              "(pages on the task's route excepted), to measure what they are worth (default: "
              "all); give both for an arm each",
              identity="affordances", meta=True),
    RunOption(field="probe_affordances", flag="--probe-affordances", kind="switch", default=False,
              help="record which of llms.txt, llms-full.txt and the route pages' .md variants "
              "exist, and their sizes, without changing what the agent reads",
              identity="probe_affordances", meta=True),
    RunOption(field="allow_unenforced", flag="--allow-unenforced", kind="switch", default=False,
              help="permit the 'local' and 'fake' backends, which enforce nothing (recorded as unenforced)",
              identity="allow_unenforced"),
    RunOption(field="downgrades", flag="--allow-downgrade", kind="repeated", metavar="LAYER",
              choices=tuple(layer.value for layer in LayerName), convert=_layers,
              default=frozenset(),
              help=f"run even if LAYER cannot be applied (recorded); one of: {', '.join(sorted(LayerName))}",
              identity="downgrades", recorded=lambda layers: tuple(sorted(layers))),
    RunOption(field="inspect_tls", flag="--inspect-tls", kind="toggle",
              help=INSPECT_TLS_HELP + "; default: firstrun.yaml's inspect_tls, else off",
              project="inspect_tls", fallback=False, identity="inspect_tls", recorded=bool),
    RunOption(field="quiet", flag="--quiet", short="-q", kind="switch", default=False,
              help="print only the sweep's results line, errors and warnings: no progress board, "
              "no line per run",
              exempt=_WHAT_IS_PRINTED),
    RunOption(field="verbose", flag="--verbose", short="-v", kind="switch", default=False,
              help="also print a line per run on stderr as it finishes: task, attempt, "
              "classification and reason",
              exempt=_WHAT_IS_PRINTED),
    RunOption(field="color", flag="--color", kind="value", choices=COLORS, default="auto",
              help=COLOR_HELP, exempt=_WHAT_IS_PRINTED),
)

RUN_OPTION: Mapping[str, RunOption] = {option.field: option for option in RUN_OPTIONS}

# A key that decides what a sweep measures belongs on the command line, where
# the sweep's identity records it; a project config that set it would make two
# runs of one command measure different things. Each names its flag.
# The key is the flag as a YAML key would spell it (--base-url: base_url).
REFUSED_KEYS: Mapping[str, str] = {
    option.flag.removeprefix("--").replace("-", "_"): option.flag for option in RUN_OPTIONS
    if option.identity is not None and option.project is None and option.flag is not None
}


def recorded_options(values: Mapping[str, Any], *, where: Literal["identity", "meta"]) -> dict[str, Any]:
    """The options' part of the sweep identity (by identity field) or of the meta (by field)."""
    if where == "identity":
        return {o.identity: o.record(values[o.field]) for o in RUN_OPTIONS if o.identity is not None}
    return {o.field: o.record(values[o.field]) for o in RUN_OPTIONS if o.meta}
