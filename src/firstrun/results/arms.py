"""Arms: one sweep command measuring several agents, models or affordances side by side.

Guarantee: the arms are the product of the ``--agent``, ``--model`` and
``--affordances`` values, in the order given, each named by the values that
vary, names distinct and safe as one directory name. One arm keeps the old
layout (``OUT/results.json``); several write ``OUT/arms.json`` and each arm is
a whole sweep in ``OUT/NAME/``, so ``--resume`` and ``diff`` work per arm.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from firstrun.errors import UsageError
from firstrun.results.store import SCHEMA_VERSION, write_json_atomic

ARMS_FILE = "arms.json"

# What a directory name may hold; anything else in a value (a model's "/") becomes "-".
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


@dataclass(frozen=True, kw_only=True)
class Arm:
    """One combination of the values that decide who reads the docs, and how."""

    name: str
    agent: str
    model: str | None
    affordances: str


def _safe(value: str) -> str:
    return _UNSAFE.sub("-", value).lstrip(".")


def _distinct(flag: str, values: Sequence[str]) -> None:
    """Refuse a value given twice and, where each names an arm, two that one name would hold."""
    names: dict[str, str] = {}
    for value in values:
        if value in names.values():
            raise UsageError(f"{flag}: {value!r} is given twice; each value is one arm")
        name = _safe(value)
        if len(values) > 1 and not name:
            raise UsageError(f"{flag}: {value!r} has no letter or digit to name its arm by")
        if len(values) > 1 and name in names:
            raise UsageError(f"{flag}: the values {names[name]!r} and {value!r} would share one "
                             "arm directory once made safe as names; give values that differ "
                             "in letters or digits")
        names[name] = value


def sweep_arms(agents: Sequence[str], models: Sequence[str], affordances: Sequence[str], *,
               default_agent: str = "replay", default_affordances: str = "all") -> tuple[Arm, ...]:
    """Every combination of the values given (a flag not given takes its default), in order."""
    for flag, values in (("--agent", agents), ("--model", models), ("--affordances", affordances)):
        _distinct(flag, list(values))
    agent_values = list(agents) or [default_agent]
    model_values: list[str | None] = list(models) or [None]
    affordance_values = list(affordances) or [default_affordances]
    arms = []
    for agent, model, shown in itertools.product(agent_values, model_values, affordance_values):
        # Each part is distinct within its flag, and every name has the same parts.
        parts = ([agent] if len(agent_values) > 1 else []) \
            + ([str(model)] if len(model_values) > 1 else []) \
            + ([f"affordances={shown}"] if len(affordance_values) > 1 else [])
        arms.append(Arm(name="+".join(_safe(part) for part in parts), agent=agent, model=model,
                        affordances=shown))
    return tuple(arms)


def write_arms(out: Path, arms: Sequence[Arm]) -> None:
    """Name the sweep's arms in ``OUT/arms.json``, in the order they run."""
    write_json_atomic(out / ARMS_FILE, {"schema_version": SCHEMA_VERSION,
                                        "arms": [asdict(a) for a in arms]})


def read_arms(out: Path, *, label: str) -> tuple[Arm, ...] | None:
    """The arms saved in ``out``; None when it holds no ``arms.json`` (a sweep of one arm).

    ``UsageError`` naming ``label`` when the file is not an arms list this version reads.
    """
    path = out / ARMS_FILE
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        if document.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"schema version {document.get('schema_version')!r} is not supported")
        arms = tuple(Arm(**a) for a in document["arms"])
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise UsageError(f"{label}: {path}: not a readable arms file ({exc})") from None
    for arm in arms:
        if not arm.name or _UNSAFE.search(arm.name) or arm.name.startswith("."):
            raise UsageError(f"{label}: {path}: arm name {arm.name!r} is not one directory name")
    return arms
