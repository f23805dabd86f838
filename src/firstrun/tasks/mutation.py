"""A mutant of a task: its replay with one step removed, or one version pin made impossible.

Guarantee: a ``Mutation`` names one step by its 1-based position in the order
the unmutated replay ran the steps, and either drops it or replaces one pin it
writes (``==1.2.3``, ``@1.2.3``) by a version no registry publishes. The step's
command travels with it, so the agent can refuse a step that is no longer the
one the mutant was made from. A mutant is a task of its own name
(``NAME.drop-2``, ``NAME.pin-2-1``), so results and resume key on it as on any task.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from firstrun.tasks.model import Task

# ``==1.2.3`` (pip) and ``name@1.2.3`` (npm, pipx, go): a version of digits and
# dots, with any pre-release or local suffix a registry would also match on.
_PIN = re.compile(r"(?:(?<![=<>!~])==\s*|(?<=[\w\]])@)(v?\d+(?:\.\d+)+(?:[-+.]?[A-Za-z0-9]+)*)")
_RELEASE = re.compile(r"v?(\d+(?:\.\d+)+)")
# No registry publishes a major version this high, and every ecosystem parses it.
_IMPOSSIBLE_MAJOR = "99999"


@dataclass(frozen=True, kw_only=True)
class Mutation:
    """One change to a replay: ``step`` dropped, or ``pin`` (as written, replacement) in it."""

    of: str
    step: int
    command: str
    where: str
    pin: tuple[str, str] | None = None
    number: int = 0

    @property
    def kind(self) -> str:
        return "drop" if self.pin is None else "pin"

    @property
    def name(self) -> str:
        """The mutant's task name: the task's, and which change."""
        if self.pin is None:
            return f"{self.of}.drop-{self.step}"
        return f"{self.of}.pin-{self.step}-{self.number}"

    def to_data(self) -> dict[str, Any]:
        return {"of": self.of, "step": self.step, "kind": self.kind, "command": self.command,
                "where": self.where, "pin": list(self.pin) if self.pin is not None else None}


@dataclass(frozen=True, kw_only=True)
class RanStep:
    """One replay step as the unmutated run ran it, and where it came from."""

    command: str
    where: str


def version_pins(command: str) -> list[tuple[str, str]]:
    """Each distinct pin in ``command`` as written, with a version of it that does not exist."""
    pins: list[tuple[str, str]] = []
    for match in _PIN.finditer(command):
        written = match.group(0)
        version = match.group(1)
        release = _RELEASE.match(version)
        assert release is not None  # _PIN's group is a release and a suffix
        impossible = ("v" if version.startswith("v") else "") + ".".join(
            [_IMPOSSIBLE_MAJOR] + ["0"] * release.group(1).count("."))
        pin = (written, written[: len(written) - len(version)] + impossible)
        if pin not in pins:
            pins.append(pin)
    return pins


def mutations(task_name: str, steps: list[RanStep]) -> list[Mutation]:
    """Every mutant of a replay that ran ``steps``: each step dropped, each pin made impossible."""
    found: list[Mutation] = []
    for number, step in enumerate(steps, start=1):
        base = Mutation(of=task_name, step=number, command=step.command, where=step.where)
        found.append(base)
        for index, pin in enumerate(version_pins(step.command), start=1):
            found.append(replace(base, pin=pin, number=index))
    return found


def mutant(task: Task, mutation: Mutation) -> Task:
    """``task`` under ``mutation``: the same file and check, its own name."""
    return replace(task, spec=task.spec.model_copy(update={"name": mutation.name}),
                   mutation=mutation)
