"""The project config, ``firstrun.yaml``: the flags a project would repeat on every run, kept in one file.

Guarantee: a project config never sets who is measured or how often: every key
``options.REFUSED_KEYS`` names (``agent``, ``model``, ``repeat``, ...) is refused
with its file and line. The task defaults, permission rules and isolation it sets
are part of the sweep's identity. Every problem in the file is one ``file:line``
error raised before any run starts; a flag given on the command line wins over
the file, and relative paths are taken from the file's own directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
)

from firstrun.docs import Mirror
from firstrun.errors import TaskError, UsageError
from firstrun.policy.filesystem import PROTECTED_NAMES
from firstrun.policy.permissions import RuleSet
from firstrun.run.options import REFUSED_KEYS, RunOption
from firstrun.sandbox.select import BACKENDS
from firstrun.tasks.load import parse_yaml, read_text_file, validation_error
from firstrun.tasks.model import Budgets, HostEntry, Isolation, Permissions, Task

CONFIG_FILE = "firstrun.yaml"

def _backend(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return name


def _protected_entry(name: str) -> str:
    if name not in PROTECTED_NAMES:
        raise ValueError(f"{name!r} is not a protected workspace entry; they are: "
                         f"{', '.join(PROTECTED_NAMES)}")
    return name


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NetworkDefaults(_Section):
    allow: tuple[HostEntry, ...] = Field(
        (), description="Hosts every task's shell may also reach (added to each task's network.allow)."
    )


class TaskDefaults(_Section):
    """What every task starts from; a key the task file sets itself wins."""

    budgets: Budgets = Budgets()
    network: NetworkDefaults = NetworkDefaults()


# Read by the same YAML machinery as task files: duplicate keys refused,
# did-you-mean for a misspelt key, unknown keys refused (extra="forbid"), so a
# rule this firstrun cannot enforce is never silently ignored.
class ProjectSpec(_Section):
    """The keys of ``firstrun.yaml``."""

    backend: Annotated[str, AfterValidator(_backend)] | None = None
    out: str | None = Field(None, description="The results directory (--out).")
    cache_dir: str | None = Field(None, description="Where fetched docs pages are cached (--cache-dir).")
    docs_mirrors: dict[str, str] = Field(
        {}, description="HOST: DIR or loopback URL, as --docs-mirror HOST=SRC."
    )
    workers: PositiveInt | None = None
    engine: Literal["local", "ray"] | None = Field(
        None, description="Where runs are carried out (--engine): local, or ray.")
    ray_address: str | None = Field(
        None, description="The Ray cluster to join under engine: ray (--ray-address).")
    # --no-inspect-tls on the command line wins over it.
    inspect_tls: bool | None = Field(None, description="--inspect-tls on every run.")
    isolation: Isolation | None = Field(
        None, description="kernel (or vm): every task runs only where commands get a kernel "
        "of their own (--backend gvisor, or microvm with KVM), whatever the task file says.")
    # For ``firstrun check --sandbox DIR``; --allow-write on the command line
    # replaces the list.
    allow_write: tuple[Annotated[str, AfterValidator(_protected_entry)], ...] = Field(
        (), description="Protected workspace entries a sandbox over a directory of the user's "
        "own may write (--allow-write NAME).")
    task_defaults: TaskDefaults = TaskDefaults()
    # Rules over the agent's tool calls (allow, deny, ask, in the task file's
    # syntax), each parsed when the file loads and named by its line. They apply
    # to every run beside each task's own rules, the strictest decision winning,
    # so a deny here holds whatever a task allows.
    permissions: Permissions = Permissions()


@dataclass(frozen=True, kw_only=True)
class ProjectConfig:
    """A loaded project config: where it came from, its hash, and its values made absolute."""

    path: str
    sha256: str
    spec: ProjectSpec
    out: str | None
    cache_dir: str | None
    mirrors: Mapping[str, Mirror]
    permissions: RuleSet = RuleSet(source="project")

    def task_defaults_sha256(self) -> str:
        """A hash of the task defaults, permission rules and isolation: what of this file
        changes what a run measures (a file without rules or isolation hashes as before
        either existed, so sweeps saved then stay resumable)."""
        data: dict[str, Any] = self.spec.task_defaults.model_dump(mode="json", exclude_unset=True)
        rules = self.spec.permissions.model_dump(mode="json", exclude_defaults=True)
        if rules or self.spec.isolation is not None:
            data = {"task_defaults": data, "permissions": rules}
            if self.spec.isolation is not None:
                data["isolation"] = self.spec.isolation
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    def option_value(self, key: str) -> Any:
        """The value this file gives run option key ``key``, a directory made absolute."""
        if key == "out":
            return self.out
        if key == "cache_dir":
            return self.cache_dir
        return getattr(self.spec, key)

    def to_record(self) -> dict[str, str]:
        return {"path": os.path.abspath(self.path), "sha256": self.sha256}


def find_project_config(explicit: str | None, cwd: str | os.PathLike[str] = ".") -> ProjectConfig | None:
    """``--config FILE`` when given, else the nearest ``firstrun.yaml`` from ``cwd`` up.

    As ruff and pytest look: ``cwd``, then each parent, stopping at the
    project's root (the first directory holding ``.git``), since a file
    above it belongs to another project.
    """
    if explicit is not None:
        if not os.path.isfile(explicit):
            raise UsageError(f"--config: {explicit!r} is not a file")
        return load_project_config(explicit)
    here = Path(cwd)
    for directory in (here, *here.resolve().parents):
        # Named as given in cwd itself, so its messages read as before.
        candidate = directory / CONFIG_FILE
        if os.path.lexists(candidate):
            if not candidate.is_file():
                # A directory, FIFO or dangling link by that name is a mistake, not "no config".
                raise UsageError(f"{os.fspath(candidate)} is not a file; the project config "
                                 "must be one (or name another with --config)")
            return load_project_config(candidate)
        if (directory / ".git").exists():
            return None
    return None


def load_project_config(path: str | os.PathLike[str]) -> ProjectConfig:
    """Read and validate one project config. Raises ``TaskError`` (file:line) or ``UsageError``."""
    name = os.fspath(path)
    raw, text = read_text_file(name)
    data, locations = parse_yaml(
        text, name,
        empty="the file is empty; a project config sets at least one of: "
        + ", ".join(ProjectSpec.model_fields),
        top="the top level must be a mapping of keys (backend, out, cache_dir, ...)",
    )
    for key in data:
        if key in REFUSED_KEYS:
            raise TaskError(
                f"'{key}' cannot be set in a project config: two runs of the same command would "
                f"measure different things; give {REFUSED_KEYS[key]} on the command line",
                path=name, line=locations.line((key,)))
    try:
        spec = ProjectSpec.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, locations, name, root=ProjectSpec) from None
    # Relative paths from the file's own directory: a config means the same
    # thing whichever directory it is used from.
    base = Path(name).resolve().parent
    for key in ("out", "cache_dir"):
        value = getattr(spec, key)
        if value is not None and os.path.exists(base / value) and not os.path.isdir(base / value):
            raise TaskError(f"{key}: {value!r} exists and is not a directory", path=name,
                            line=locations.line((key,)))
    mirrors: dict[str, Mirror] = {}
    for host, source in spec.docs_mirrors.items():
        # A directory is relative to this file; a URL is taken as written.
        local = source if "://" in source else os.fspath(base / source)
        try:
            mirror = Mirror.parse(f"{host}={local}")
        except (UsageError, ValueError) as exc:
            # ValueError: urllib's, for a URL it cannot split ('http://[::1').
            raise TaskError(f"docs_mirrors.{host}: {exc.args[0]}", path=name,
                            line=locations.line(("docs_mirrors", host))) from None
        mirrors[mirror.host] = mirror
    permissions = spec.permissions.rule_set("project", origin=lambda verdict, index: (
        f"{name}:{locations.line(('permissions', verdict.value, index))}"))
    return ProjectConfig(
        path=name,
        sha256=hashlib.sha256(raw).hexdigest(),
        spec=spec,
        out=None if spec.out is None else os.fspath(base / spec.out),
        cache_dir=None if spec.cache_dir is None else os.fspath(base / spec.cache_dir),
        mirrors=mirrors,
        permissions=permissions,
    )


def apply_task_defaults(tasks: Sequence[Task], spec: ProjectSpec) -> list[Task]:
    """Each task with the project's defaults under it: keys the task file sets win,
    except ``isolation``, where the stricter of the project's and the task's holds.

    Budgets merge key by key; ``network.allow`` hosts are added to the task's
    own (a task with ``network.only`` ignores ``allow``, its own included).
    """
    defaults = spec.task_defaults
    budget_defaults = defaults.budgets.model_dump(include=defaults.budgets.model_fields_set)
    out = []
    for task in tasks:
        own = task.spec.budgets.model_dump(include=task.spec.budgets.model_fields_set)
        budgets = Budgets.model_validate({**budget_defaults, **own})
        network = task.spec.network
        allow = tuple(dict.fromkeys((*network.allow, *defaults.network.allow)))
        extensions = task.spec.firstrun
        # A task cannot opt out of the project's requirement of a kernel of its own.
        # "vm" is the only isolation there is, so any requirement is the stricter one.
        isolation = extensions.isolation or spec.isolation
        task_spec = task.spec.model_copy(update={
            "budgets": budgets,
            "network": network.model_copy(update={"allow": allow}),
            "firstrun": extensions.model_copy(update={"isolation": isolation}),
        })
        out.append(replace(task, spec=task_spec))
    return out


def merged_mirrors(project: ProjectConfig | None, flags: Mapping[str, Mirror]) -> dict[str, Mirror]:
    """The project's mirrors, with a ``--docs-mirror`` for the same host winning."""
    mirrors = dict(project.mirrors) if project is not None else {}
    mirrors.update(flags)
    return mirrors


def option_value(option: RunOption, given: Any, project: ProjectConfig | None) -> Any:
    """A run option's value: the command line's, else the project config's, else its fallback."""
    if given is not None:
        return given
    if project is not None and option.project is not None:
        from_file = project.option_value(option.project)
        if from_file is not None:
            return from_file
    return option.fallback
