"""Reading task files: YAML with line numbers in, a validated ``Task`` or one located error out.

Guarantee: whatever is wrong with a task file comes out as exactly one
``TaskError`` whose message is a single line, ``file:line: what is wrong``,
with a did-you-mean for an unknown key; never a traceback, never a PyYAML or
pydantic message shape. A ``success.file`` is read here, only from inside the
task's project, and kept in memory. ``load_task`` also refuses a task whose
lint has an error-level finding; ``read_task`` stops short of that.
"""

from __future__ import annotations

import difflib
import glob
import hashlib
import os
import stat
import types
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from firstrun.errors import TaskError, UsageError
from firstrun.tasks.model import RULE, UNION_TAGS, KeyPath, Locations, Task, TaskSpec

TASK_SUFFIXES = (".yaml", ".yml")

# Where ``run`` and ``validate`` look when given no paths.
DEFAULT_TASK_DIR = "tasks"

# What an error type means, in the task author's words. Keyed on pydantic's
# stable error ``type``, never on its message text.
_EXPECTED = {
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "a whole number",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping of keys",
    "model_type": "a mapping of keys",
    "model_attributes_type": "a mapping of keys",
}


def read_task(path: str | os.PathLike[str]) -> Task:
    """Parse and validate one task file, without judging it. Raises ``TaskError``."""
    name = os.fspath(path)
    raw, text = read_text_file(name)
    data, locations = parse_yaml(text, name)
    try:
        spec = TaskSpec.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, locations, name) from None
    check, check_path = _read_check(spec, Path(name), locations, name)
    return Task(
        spec=spec,
        path=name,
        sha256=hashlib.sha256(raw).hexdigest(),
        check=check,
        check_path=check_path,
        locations=locations,
    )


# Far beyond any task file, check or project config; a file this big is a
# mistake (a log, a device), and reading it whole would only exhaust memory.
MAX_FILE_BYTES = 1 << 20


def read_file_bytes(name: str) -> bytes:
    """The bytes of the regular file ``name``; ``OSError`` (with ``strerror``) otherwise.

    Opened non-blocking so a FIFO is refused instead of waiting for a writer,
    and read no further than ``MAX_FILE_BYTES`` so ``/dev/zero`` is refused too.
    """
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, "is a directory")
        if not stat.S_ISREG(mode):
            raise OSError(0, "not a regular file")
        with os.fdopen(os.dup(fd), "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_FILE_BYTES:
        raise OSError(0, f"larger than {MAX_FILE_BYTES >> 20} MiB")
    return raw


def read_text_file(name: str) -> tuple[bytes, str]:
    """The bytes and UTF-8 text (a BOM dropped) of a file firstrun reads as YAML. Raises ``TaskError``."""
    try:
        raw = read_file_bytes(name)
    except FileNotFoundError:
        raise TaskError("no such file", path=name, line=None) from None
    except ValueError:
        raise TaskError("cannot read: the path holds a NUL character", path=name, line=None) from None
    except OSError as exc:
        raise TaskError(f"cannot read: {exc.strerror}", path=name, line=None) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TaskError(
            "not UTF-8 text", path=name, line=raw.count(b"\n", 0, exc.start) + 1
        ) from None
    return raw, text


def load_task(path: str | os.PathLike[str]) -> Task:
    """A task that is valid and can produce evidence. Raises ``TaskError``."""
    from firstrun.tasks.lint import Severity, lint_task

    # A task that cannot produce evidence, run anyway, would count a guess as a
    # pass. ``validate`` calls ``read_task`` instead, to report every finding
    # rather than the first.
    task = read_task(path)
    for finding in lint_task(task):
        if finding.severity is Severity.ERROR:
            raise TaskError(finding.message, path=finding.file, line=finding.line)
    return task


def expand_task_paths(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[str], list[str]]:
    """Task files named by ``paths`` (files, directories, globs), in order, each once.

    A directory contributes its ``*.yaml``/``*.yml`` files (not recursive),
    and a glob is expanded here as well as by the shell, because some shells
    hand it over literally. No paths means ``tasks/``. Returns the files and
    the arguments that matched nothing.
    """
    found: list[str] = []
    unmatched: list[str] = []
    seen: set[str] = set()

    def add(candidate: str) -> None:
        key = os.path.realpath(candidate)
        if key not in seen:
            seen.add(key)
            found.append(candidate)

    for arg in [os.fspath(p) for p in paths] or [DEFAULT_TASK_DIR]:
        if os.path.isdir(arg):
            entries = sorted(
                e.path for e in os.scandir(arg) if e.name.endswith(TASK_SUFFIXES) and e.is_file()
            )
            for entry in entries:
                add(entry)
            if not entries:
                unmatched.append(arg)
        elif os.path.exists(arg):
            add(arg)
        elif glob.has_magic(arg):
            matches = sorted(m for m in glob.glob(arg, recursive=True) if os.path.isfile(m))
            for match in matches:
                add(match)
            if not matches:
                unmatched.append(arg)
        else:
            unmatched.append(arg)
    return found, unmatched


def load_tasks(paths: Sequence[str | os.PathLike[str]]) -> list[Task]:
    """Every task named by ``paths``; the first problem raises.

    Raises ``UsageError`` for an argument that names no task file, and
    ``TaskError`` for an invalid task or two tasks sharing a name (their
    results would land in the same directory).
    """
    files, unmatched = expand_task_paths(paths)
    if unmatched:
        raise UsageError(f"no task files at {unmatched[0]}")
    tasks = [load_task(f) for f in files]
    for error in duplicate_names(tasks):
        raise error
    return tasks


def duplicate_names(tasks: Iterable[Task]) -> list[TaskError]:
    """One error per task whose name an earlier task already has."""
    first: dict[str, Task] = {}
    errors = []
    for task in tasks:
        other = first.setdefault(task.name, task)
        if other is not task:
            errors.append(
                TaskError(
                    f"task name {task.name!r} is also the name of {other.path}",
                    path=task.path,
                    line=task.locations.line(("name",)),
                )
            )
    return errors


# --- YAML ---------------------------------------------------------------------


def parse_yaml(
    text: str,
    name: str,
    *,
    empty: str = "the file is empty; a task needs name, goal, docs and success",
    top: str = "the top level must be a mapping of keys (name, goal, docs, success, ...)",
) -> tuple[Any, Locations]:
    """A YAML mapping and the line of every key; ``empty``/``top`` say what the file should hold.

    Any other YAML file firstrun reads (the project config) comes through
    here too, so it gets the same duplicate-key refusal and file:line errors.
    """
    try:
        _refuse_bombs(text, name)
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                raise TaskError(empty, path=name, line=1)
            _refuse_duplicate_keys(node, name)
            data = loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.reader.ReaderError as exc:
        raise TaskError(f"invalid YAML: {exc.reason} (U+{exc.character:04X})", path=name,
                        line=text.count("\n", 0, exc.position) + 1) from None
    except yaml.MarkedYAMLError as exc:
        raise TaskError(_yaml_message(exc), path=name, line=_yaml_line(exc)) from None
    except yaml.YAMLError as exc:
        raise TaskError(f"invalid YAML: {exc}".splitlines()[0], path=name, line=1) from None
    if not isinstance(data, dict):
        raise TaskError(top, path=name, line=node.start_mark.line + 1)
    keys: dict[KeyPath, int] = {}
    blocks: dict[KeyPath, int] = {}
    _index(node, (), keys, blocks)
    return data, Locations(keys=types.MappingProxyType(keys), blocks=types.MappingProxyType(blocks))


# Task files nest a handful of levels and hold hundreds of values; these
# bounds are far beyond that and far below what exhausts the stack (PyYAML
# composes recursively) or memory (an alias expands to its anchor's whole
# value wherever it is used, so nested aliases grow exponentially).
MAX_DEPTH = 64
MAX_VALUES = 100_000


def _refuse_bombs(text: str, name: str) -> None:
    """Refuse, from the event stream alone, a document that is too deep, whose aliases
    expand past ``MAX_VALUES``, with an alias inside its own anchor, or with a NUL
    character in a string (which no path, command or URL can hold).

    The event parser is iterative, so this is safe to run on any input, and it
    runs before anything recursive (composing, walking nodes, validating) sees it.
    """
    loader = yaml.SafeLoader(text)
    sizes: dict[str, int] = {}
    # One [anchor, values so far] per collection still open.
    open_: list[list[Any]] = []

    def add(count: int, line: int) -> None:
        if open_:
            open_[-1][1] += count
            if open_[-1][1] > MAX_VALUES:
                raise TaskError(f"the document expands to more than {MAX_VALUES} values "
                                "(aliases repeating aliases?)", path=name, line=line)

    try:
        while (event := loader.get_event()) is not None:
            line = event.start_mark.line + 1
            if isinstance(event, yaml.CollectionStartEvent):
                if len(open_) >= MAX_DEPTH:
                    raise TaskError(f"nested more than {MAX_DEPTH} levels deep", path=name, line=line)
                open_.append([event.anchor, 1])
            elif isinstance(event, yaml.CollectionEndEvent):
                anchor, count = open_.pop()
                if anchor is not None:
                    sizes[anchor] = count
                add(count, line)
            elif isinstance(event, yaml.ScalarEvent):
                if "\x00" in event.value:
                    raise TaskError("a string holds a NUL character ('\\0'), which no path, "
                                    "command or URL can contain", path=name, line=line)
                if event.anchor is not None:
                    sizes[event.anchor] = 1
                add(1, line)
            elif isinstance(event, yaml.AliasEvent):
                if any(anchor == event.anchor for anchor, _ in open_):
                    raise TaskError(f"alias *{event.anchor} is inside the value it names "
                                    "(a cycle)", path=name, line=line)
                # An undefined alias is the composer's to report, with its line.
                add(sizes.get(event.anchor, 1), line)
            if isinstance(event, yaml.StreamEndEvent):
                break
    finally:
        loader.dispose()


def _yaml_line(exc: yaml.MarkedYAMLError) -> int:
    mark = exc.problem_mark or exc.context_mark
    return mark.line + 1 if mark is not None else 1


def _yaml_message(exc: yaml.MarkedYAMLError) -> str:
    problem = exc.problem or exc.context or "unreadable"
    message = f"invalid YAML: {problem}"
    if exc.context and exc.problem and exc.context_mark is not None:
        message += f" ({exc.context} at line {exc.context_mark.line + 1})"
    return message


# YAML says keys are unique; PyYAML silently keeps the last, so one of two
# ``script:`` blocks would vanish.
def _refuse_duplicate_keys(node: yaml.Node, name: str) -> None:
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            # ``<<`` merges are legitimately overridden by the keys beside them.
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                line = key_node.start_mark.line + 1
                if key_node.tag != "tag:yaml.org,2002:str":
                    # ``1:``, ``~:`` or ``on:`` would reach validation as an int, None or
                    # True, which has no line to name; every key here is a name.
                    raise TaskError(f"key {key_node.value!r} is not a name; quote it if it "
                                    "should be one", path=name, line=line)
                if key_node.value in first:
                    raise TaskError(
                        f"duplicate key '{key_node.value}' (first at line {first[key_node.value]})",
                        path=name,
                        line=line,
                    )
                first[key_node.value] = line
            _refuse_duplicate_keys(value_node, name)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_duplicate_keys(item, name)


def _index(
    node: yaml.Node, path: KeyPath, keys: dict[KeyPath, int], blocks: dict[KeyPath, int]
) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
            child = (*path, key)
            keys[child] = key_node.start_mark.line + 1
            _index(value_node, child, keys, blocks)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            child = (*path, i)
            keys[child] = item.start_mark.line + 1
            _index(item, child, keys, blocks)
    elif isinstance(node, yaml.ScalarNode):
        if node.style == "|":
            # The indicator's line is not content; the block starts below it.
            blocks[path] = node.start_mark.line + 2
        elif node.start_mark.line == node.end_mark.line:
            blocks[path] = node.start_mark.line + 1


# --- validation errors ----------------------------------------------------------


def validation_error(
    exc: ValidationError, locations: Locations, name: str, *, root: type[BaseModel] = TaskSpec
) -> TaskError:
    """The one error to show for ``exc``, located in the file; ``root`` is the model validated."""
    errors = exc.errors(include_url=False)

    def rank(item: tuple[int, ErrorDetails]) -> tuple[bool, int, int]:
        # A misspelt key also leaves its correct spelling missing; the typo is the news.
        order, err = item
        return (err["type"] == "missing", locations.line(_loc(err)), order)

    _, err = min(enumerate(errors), key=rank)
    loc = _loc(err)
    if err["type"] not in ("extra_forbidden", "missing"):
        # Name what the file spells out: a lone string validated as a one-item
        # list has no ``[0]`` the author could find.
        while len(loc) > 1 and loc not in locations.keys and isinstance(loc[-1], int):
            loc = loc[:-1]
    return TaskError(_describe(err, loc, root), path=name, line=locations.line(loc))


def _loc(err: ErrorDetails) -> KeyPath:
    loc: KeyPath = tuple(part for part in err["loc"] if part not in UNION_TAGS)
    if err["type"] == RULE:
        key = (err.get("ctx") or {}).get("key")
        if key:
            loc = (*loc, key)
    return loc


def _dotted(loc: KeyPath) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _shown(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return text.replace("\n", "\\n")


def _describe(err: ErrorDetails, loc: KeyPath, root: type[BaseModel]) -> str:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        key = str(loc[-1])
        parent = loc[:-1]
        message = f"unknown key '{key}'" + (f" in {_dotted(parent)}" if parent else "")
        close = difflib.get_close_matches(key, _known_keys(parent, root), n=1, cutoff=0.6)
        return message + (f"; did you mean '{close[0]}'?" if close else "")
    if kind == "missing":
        parent = loc[:-1]
        return f"missing required key '{loc[-1]}'" + (f" in {_dotted(parent)}" if parent else "")
    where = _dotted(loc) or "task"
    if kind == RULE:
        return f"{where}: {ctx['detail']}"
    if kind in _EXPECTED:
        return f"{where}: expected {_EXPECTED[kind]}, got {_shown(err['input'])}"
    for bound, words in (
        ("gt", "greater than"),
        ("ge", "at least"),
        ("lt", "less than"),
        ("le", "at most"),
    ):
        if bound in ctx:
            return f"{where}: must be {words} {ctx[bound]}, got {_shown(err['input'])}"
    return f"{where}: {err['msg']}"


def _known_keys(parent: KeyPath, root: type[BaseModel]) -> list[str]:
    """The keys the model accepts at ``parent``, as a file spells them."""
    model: type[BaseModel] | None = root
    for part in parent:
        if model is None or isinstance(part, int):
            continue
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        model = _model_in(field.annotation) if field is not None else None
    if model is None:
        return []
    return [f.alias or n for n, f in model.model_fields.items()]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


# --- the check file -------------------------------------------------------------


def _project_root(task_dir: Path) -> Path:
    """The nearest directory at or above ``task_dir`` that marks a project, else ``task_dir``.

    A project is marked by ``.git`` or ``firstrun.yaml``, so checks shared by
    sibling task directories (``../checks/x.sh``) are found. A home directory
    and ``/`` never count, even with a ``.git`` (a dotfiles repository would
    otherwise open the home's secrets to a check).
    """
    never = {Path("/"), Path("/root"), Path.home().resolve()}
    for candidate in (task_dir, *task_dir.parents):
        if candidate in never or candidate.parent == Path("/home"):
            break
        if (candidate / ".git").exists() or (candidate / "firstrun.yaml").is_file():
            return candidate
    return task_dir


def _read_check(
    spec: TaskSpec, task_path: Path, locations: Locations, name: str
) -> tuple[str, str | None]:
    ref = spec.success.file
    if ref is None:
        return spec.success.script or "", None
    line = locations.line(("success", "file"))
    check_path = task_path.parent / ref
    try:
        # Inside the task's project, symlinks resolved: a task file from
        # elsewhere must not be able to read this machine's files into a check.
        root = _project_root(task_path.parent.resolve())
        if not check_path.resolve().is_relative_to(root):
            raise TaskError(f"success.file {ref!r} leads outside {os.fspath(root)!r}, the task's "
                            "project (the nearest directory above the task file holding .git "
                            "or firstrun.yaml, else the task file's own)", path=name, line=line)
        text = read_file_bytes(os.fspath(check_path)).decode("utf-8")
    except FileNotFoundError:
        raise TaskError(
            f"success.file {ref!r} does not exist (looked for {check_path})", path=name, line=line
        ) from None
    except UnicodeDecodeError:
        raise TaskError(f"success.file {ref!r} is not UTF-8 text", path=name, line=line) from None
    except (OSError, RuntimeError) as exc:
        # RuntimeError: resolve() on a symlink loop, on Pythons before 3.13.
        why = exc.strerror if isinstance(exc, OSError) else "a symlink loop"
        raise TaskError(f"success.file {ref!r}: {why}", path=name, line=line) from None
    if not text.strip():
        raise TaskError(f"success.file {ref!r} is empty", path=name, line=line)
    return text, os.fspath(check_path)
