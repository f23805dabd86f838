"""Where a check script's failures can go unnoticed, found by reading its shell.

Guarantee: precision over recall. ``analyse`` reports only what follows from
bash's rules: an assertion before the last command without ``set -e``, a
command before ``&&`` under ``set -e``, ``|| true`` or a pipeline ending in a
filter without ``pipefail``, a script with no command that can fail. A
construct it cannot follow counts as one that can fail, and a script it cannot
tokenize yields nothing: a wrong warning costs more than a missing one. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

# Commands whose only job is to succeed or fail.
ASSERTIONS = frozenset({"test", "[", "[[", "grep", "egrep", "fgrep", "diff", "cmp"})

# Builtins that cannot fail in a check: the status they leave is always 0.
ALWAYS_SUCCEED = frozenset({"true", ":", "echo", "printf"})

# A pipeline ending in one of these reports the filter's status, which is 0
# for any input, so without pipefail whatever fed it cannot fail the line.
FILTERS = frozenset(
    {"cat", "head", "tail", "tee", "sort", "uniq", "wc", "tr", "cut", "sed", "awk", "nl", "column"}
    | ALWAYS_SUCCEED
)

# Housekeeping whose failure is deliberately ignored (``kill $pid || true``).
HOUSEKEEPING = frozenset(
    {
        "kill",
        "pkill",
        "killall",
        "rm",
        "rmdir",
        "wait",
        "umount",
        "mkdir",
        "cd",
        "pushd",
        "popd",
        "cp",
        "mv",
        "touch",
        "ln",
        "chmod",
        "sleep",
        "deactivate",
    }
)

# The check helpers (and exit/return) that end the script themselves on failure.
SELF_FAILING = frozenset({"qs_fail", "qs_wait_http", "qs_expect_output"})

_OPERATORS = (
    "&&",
    "||",
    ";;",
    "|&",
    "&>>",
    "&>",
    "<<-",
    "<<<",
    "<<",
    ">>",
    "<&",
    ">&",
    "<>",
    ">|",
    "|",
    "&",
    ";",
    "(",
    ")",
    "<",
    ">",
)
_REDIRECTS = frozenset({"&>>", "&>", "<<<", ">>", "<&", ">&", "<>", ">|", "<", ">"})
_HEREDOCS = frozenset({"<<", "<<-"})
_SEPARATORS = frozenset({";", "&", "\n", ";;"})
_OPENERS = {"if": "fi", "case": "esac", "{": "}"}
_LOOPS = frozenset({"for", "while", "until", "select"})
# Words after which the next word is in command position (where keywords count).
_BEFORE_COMMAND = frozenset(
    {"then", "do", "else", "elif", "if", "while", "until", "!", "{", "}", "fi", "done", "esac"}
)


class ParseError(Exception):
    """The script uses shell this reader does not follow; no findings are made."""


@dataclass(frozen=True, kw_only=True)
class Token:
    text: str
    line: int
    op: bool


class Kind(StrEnum):
    SIMPLE = "simple"
    COMPOUND = "compound"
    FUNCTION = "function"


@dataclass(frozen=True, kw_only=True)
class Command:
    kind: Kind
    words: tuple[str, ...]
    line: int

    @property
    def name(self) -> str:
        for word in self.words:
            if "=" in word and not word.startswith("=") and word.split("=", 1)[0].isidentifier():
                continue
            return word.rsplit("/", 1)[-1] if word.startswith("/") else word
        return ""

    @property
    def is_assignment(self) -> bool:
        return self.kind is Kind.SIMPLE and not self.name and bool(self.words)

    def text(self) -> str:
        joined = " ".join(self.words)
        return joined if len(joined) <= 60 else joined[:57] + "..."


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    commands: tuple[Command, ...]
    negated: bool = False


@dataclass(frozen=True, kw_only=True)
class Statement:
    """An and-or list: ``pipelines[0] ops[0] pipelines[1] ...``."""

    pipelines: tuple[Pipeline, ...]
    ops: tuple[str, ...]
    line: int


# --- tokens ---------------------------------------------------------------------


def tokenize(script: str) -> list[Token]:
    tokens: list[Token] = []
    pending_heredocs: list[tuple[str, bool]] = []
    i, line, n = 0, 1, len(script)
    while i < n:
        c = script[i]
        if c == "\n":
            tokens.append(Token(text="\n", line=line, op=True))
            i += 1
            line += 1
            for delimiter, strip_tabs in pending_heredocs:
                i, line = _skip_heredoc(script, i, line, delimiter, strip_tabs)
            pending_heredocs.clear()
            continue
        if c in " \t":
            i += 1
            continue
        if c == "\\" and i + 1 < n and script[i + 1] == "\n":
            i += 2
            line += 1
            continue
        if c == "#":
            while i < n and script[i] != "\n":
                i += 1
            continue
        op = next((o for o in _OPERATORS if script.startswith(o, i)), None)
        if op is not None:
            # ``2>&1``: the fd number belongs to the redirection, not the words.
            if (
                op in _REDIRECTS | _HEREDOCS
                and tokens
                and not tokens[-1].op
                and tokens[-1].text.isdigit()
                and i > 0
                and script[i - 1].isdigit()
            ):
                tokens.pop()
            tokens.append(Token(text=op, line=line, op=True))
            i += len(op)
            if op in _HEREDOCS:
                while i < n and script[i] in " \t":
                    i += 1
                start = i
                i, line = _scan_word(script, i, line)
                delimiter = script[start:i].replace("'", "").replace('"', "").replace("\\", "")
                if not delimiter:
                    raise ParseError("heredoc without a delimiter")
                tokens.append(Token(text=delimiter, line=line, op=False))
                pending_heredocs.append((delimiter, op == "<<-"))
            continue
        start, start_line = i, line
        i, line = _scan_word(script, i, line)
        tokens.append(Token(text=_unquote(script[start:i]), line=start_line, op=False))
    if pending_heredocs:
        raise ParseError("heredoc never closed")
    return tokens


def _scan_word(s: str, i: int, line: int) -> tuple[int, int]:
    n = len(s)
    while i < n:
        c = s[i]
        if c in " \t\n" or any(s.startswith(o, i) for o in _OPERATORS):
            return i, line
        if c == "\\":
            if i + 1 < n and s[i + 1] == "\n":
                line += 1
            i += 2
        elif c == "'":
            end = s.find("'", i + 1)
            if end < 0:
                raise ParseError("unclosed single quote")
            line += s.count("\n", i, end)
            i = end + 1
        elif c == '"':
            i, line = _scan_double(s, i + 1, line)
        elif c == "$" and s.startswith("$(", i):
            i, line = _scan_group(s, i + 2, line, ")")
        elif c == "$" and s.startswith("${", i):
            i, line = _scan_group(s, i + 2, line, "}")
        elif c == "`":
            end = s.find("`", i + 1)
            if end < 0:
                raise ParseError("unclosed backquote")
            line += s.count("\n", i, end)
            i = end + 1
        else:
            i += 1
    return i, line


def _scan_double(s: str, i: int, line: int) -> tuple[int, int]:
    n = len(s)
    while i < n:
        c = s[i]
        if c == '"':
            return i + 1, line
        if c == "\\":
            i += 2
            continue
        if c == "\n":
            line += 1
        if s.startswith("$(", i):
            i, line = _scan_group(s, i + 2, line, ")")
            continue
        if s.startswith("${", i):
            i, line = _scan_group(s, i + 2, line, "}")
            continue
        i += 1
    raise ParseError("unclosed double quote")


def _scan_group(s: str, i: int, line: int, close: str) -> tuple[int, int]:
    """Past the ``close`` that ends a ``$(``/``${`` opened just before ``i``."""
    n = len(s)
    depth = 1
    opener = "(" if close == ")" else "{"
    while i < n:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "\n":
            line += 1
        if c == "'" and close == ")":
            end = s.find("'", i + 1)
            if end < 0:
                raise ParseError("unclosed single quote")
            line += s.count("\n", i, end)
            i = end + 1
            continue
        if c == '"':
            i, line = _scan_double(s, i + 1, line)
            continue
        if c == opener:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1, line
        i += 1
    raise ParseError(f"unclosed {opener}")


def _skip_heredoc(s: str, i: int, line: int, delimiter: str, strip_tabs: bool) -> tuple[int, int]:
    n = len(s)
    while i < n:
        end = s.find("\n", i)
        end = n if end < 0 else end
        body_line = s[i:end]
        if (body_line.lstrip("\t") if strip_tabs else body_line) == delimiter:
            return min(end + 1, n), line + 1
        i = end + 1
        line += 1
    raise ParseError(f"heredoc {delimiter!r} never closed")


def _unquote(word: str) -> str:
    # Enough to read a command's name (``"test"``, ``'['``); arguments stay as written.
    if len(word) >= 2 and word[0] == word[-1] and word[0] in "'\"":
        return word[1:-1]
    return word


# --- statements -------------------------------------------------------------------


# Enough of the shell to follow the exit status: quotes, ``$(...)``, heredocs,
# comments, ``&&``/``||`` lists, pipelines, ``set -e``/``set -o pipefail``/
# ``set +e`` and compound commands. An ``if`` body, a function or a loop is not
# followed; ``analyse`` treats it as something that can fail.
class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.i = 0

    def peek(self) -> Token | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def skip_newlines(self) -> None:
        while (tok := self.peek()) is not None and tok.op and tok.text == "\n":
            self.i += 1

    def statements(self) -> list[Statement]:
        out: list[Statement] = []
        while True:
            while (tok := self.peek()) is not None and tok.op and tok.text in _SEPARATORS:
                self.i += 1
            if self.peek() is None:
                return out
            out.append(self.statement())

    def statement(self) -> Statement:
        first = self.peek()
        assert first is not None
        pipelines = [self.pipeline()]
        ops: list[str] = []
        while (tok := self.peek()) is not None and tok.op and tok.text in ("&&", "||"):
            ops.append(self.take().text)
            self.skip_newlines()
            pipelines.append(self.pipeline())
        return Statement(pipelines=tuple(pipelines), ops=tuple(ops), line=first.line)

    def pipeline(self) -> Pipeline:
        negated = False
        tok = self.peek()
        if tok is not None and not tok.op and tok.text == "!":
            self.i += 1
            negated = True
        commands = [self.command()]
        while (tok := self.peek()) is not None and tok.op and tok.text in ("|", "|&"):
            self.i += 1
            self.skip_newlines()
            commands.append(self.command())
        return Pipeline(commands=tuple(commands), negated=negated)

    def command(self) -> Command:
        tok = self.peek()
        if tok is None:
            raise ParseError("a command is missing")
        if tok.op and tok.text == "(":
            return self.compound(tok)
        if not tok.op and (tok.text in _OPENERS or tok.text in _LOOPS):
            return self.compound(tok)
        if not tok.op and tok.text == "[[":
            return self.test_expression(tok)
        if not tok.op and tok.text == "function":
            self.take()
            name = self.take()
            nxt = self.peek()
            if nxt is not None and nxt.op and nxt.text == "(":
                return self.function(name.text, tok.line)
            self.skip_newlines()
            body = self.command()
            return Command(kind=Kind.FUNCTION, words=(name.text, *body.words), line=tok.line)
        if tok.op and tok.text not in _REDIRECTS | _HEREDOCS:
            raise ParseError(f"unexpected {tok.text!r}")
        words: list[str] = []
        line = tok.line
        while (tok := self.peek()) is not None:
            if tok.op:
                if tok.text in _REDIRECTS | _HEREDOCS:
                    self.take()
                    target = self.peek()
                    if target is None or target.op:
                        raise ParseError("redirection without a target")
                    self.take()
                    continue
                if tok.text == "(" and len(words) == 1:
                    return self.function(words[0], line)
                break
            if not words:
                line = tok.line
            words.append(self.take().text)
        if not words:
            raise ParseError("redirection with no command")
        return Command(kind=Kind.SIMPLE, words=tuple(words), line=line)

    def function(self, name: str, line: int) -> Command:
        self.take()
        close = self.peek()
        if close is None or close.text != ")":
            raise ParseError("bad function definition")
        self.take()
        self.skip_newlines()
        body = self.command()
        return Command(kind=Kind.FUNCTION, words=(name, *body.words), line=line)

    def test_expression(self, start: Token) -> Command:
        words: list[str] = []
        while (tok := self.peek()) is not None:
            words.append(self.take().text)
            if not tok.op and tok.text == "]]":
                return Command(kind=Kind.SIMPLE, words=tuple(words), line=start.line)
        raise ParseError("unclosed [[")

    def compound(self, start: Token) -> Command:
        """Consume a compound command whole: ``( )``, ``(( ))``, ``{ }``, if, case, loops.

        Only the construct's own opener and closer are counted, and keywords
        only where a command may start, so ``echo done`` closes nothing.
        """
        parens = start.op
        openers = _LOOPS if start.text in _LOOPS else frozenset({start.text})
        closer = ")" if parens else ("done" if start.text in _LOOPS else _OPENERS[start.text])
        words: list[str] = []
        depth = 0
        command_position = True
        while (tok := self.peek()) is not None:
            self.take()
            words.append(tok.text)
            if parens:
                depth += {"(": 1, ")": -1}.get(tok.text, 0) if tok.op else 0
            elif command_position and not tok.op:
                depth += 1 if tok.text in openers else (-1 if tok.text == closer else 0)
            if depth == 0:
                self._skip_redirects()
                return Command(kind=Kind.COMPOUND, words=tuple(words), line=start.line)
            command_position = (tok.op and tok.text not in _REDIRECTS | _HEREDOCS) or (
                not tok.op and tok.text in _BEFORE_COMMAND
            )
        raise ParseError(f"unclosed {start.text}")

    def _skip_redirects(self) -> None:
        while (tok := self.peek()) is not None and tok.op and tok.text in _REDIRECTS | _HEREDOCS:
            self.take()
            if self.peek() is not None:
                self.take()


def parse(script: str) -> list[Statement]:
    """The top-level statements of ``script``. Raises ParseError for shell it does not follow."""
    return _Parser(tokenize(script)).statements()


# --- judgement -------------------------------------------------------------------


# What bash's rules make of a status: without ``set -e`` only the last
# command's status is the script's, so a failed assertion on an earlier line is
# forgotten (IGNORED), and under ``set -e`` a command before ``&&`` does not
# stop the script (IGNORED too); ``cmd || true``, and a pipeline ending in a filter
# (``| tee``, ``| head``) without ``pipefail``, report success whatever ``cmd``
# did (MASKED); a script with no command that can fail passes every run
# (ALWAYS_PASSES).
class Problem(StrEnum):
    ALWAYS_PASSES = "always_passes"
    IGNORED = "ignored"
    MASKED = "masked"


@dataclass(frozen=True, kw_only=True)
class Issue:
    problem: Problem
    line: int  # 1-based, within the script
    message: str


@dataclass(kw_only=True)
class _State:
    errexit: bool = False
    pipefail: bool = False
    errexit_off_line: int | None = None
    can_fail: bool = False
    issues: list[Issue] = field(default_factory=list)


def _exits_with_failure(cmd: Command) -> bool:
    if cmd.kind is Kind.SIMPLE:
        if cmd.name in SELF_FAILING:
            return True
        if cmd.name in ("exit", "return"):
            rest = cmd.words[cmd.words.index(cmd.name) + 1 :]
            return bool(rest) and rest[0] != "0"
        return False
    if cmd.kind is Kind.COMPOUND:
        return any(w in SELF_FAILING or w in ("exit", "return") for w in cmd.words)
    return False


def _always_succeeds(cmd: Command) -> bool:
    if cmd.kind is Kind.FUNCTION:
        return True
    if cmd.kind is not Kind.SIMPLE:
        return False
    if cmd.is_assignment:
        return not any("$(" in w or "`" in w for w in cmd.words)
    if cmd.name in ("exit", "return"):
        rest = cmd.words[cmd.words.index(cmd.name) + 1 :]
        return bool(rest) and rest[0] == "0"
    return cmd.name in ALWAYS_SUCCEED


def _assertion(pipeline: Pipeline) -> Command | None:
    return next(
        (c for c in pipeline.commands if c.kind is Kind.SIMPLE and c.name in ASSERTIONS), None
    )


def _apply_set(cmd: Command, state: _State) -> None:
    args = list(cmd.words[1:])
    k = 0
    while k < len(args):
        arg = args[k]
        if arg in ("-o", "+o") and k + 1 < len(args):
            on = arg == "-o"
            if args[k + 1] == "errexit":
                state.errexit = on
                state.errexit_off_line = None if on else cmd.line
            elif args[k + 1] == "pipefail":
                state.pipefail = on
            k += 2
            continue
        if arg[:1] in "-+" and len(arg) > 1 and arg[1:].isalpha():
            on = arg[0] == "-"
            if "e" in arg:
                state.errexit = on
                state.errexit_off_line = None if on else cmd.line
            if "o" in arg and k + 1 < len(args) and args[k + 1] == "pipefail":
                state.pipefail = on
                k += 1
        k += 1


def analyse(script: str) -> list[Issue]:
    """Every way ``script``'s failures go unnoticed, by line; empty if it cannot tell."""
    try:
        statements = parse(script)
    except ParseError:
        return []
    statements = _reachable(statements)
    state = _State()
    last_can_fail = False
    for index, statement in enumerate(statements):
        first = statement.pipelines[0].commands[0]
        if _single(statement) and first.kind is Kind.SIMPLE and first.name == "set":
            _apply_set(first, state)
            continue
        last_can_fail = _judge(statement, state, index == len(statements) - 1)
    if not (state.can_fail or last_can_fail):
        state.issues.append(
            Issue(
                problem=Problem.ALWAYS_PASSES,
                line=1,
                message="no command in the check can fail, so it passes every run",
            )
        )
    return state.issues


def _single(statement: Statement) -> bool:
    return len(statement.pipelines) == 1 and len(statement.pipelines[0].commands) == 1


def _reachable(statements: list[Statement]) -> list[Statement]:
    """The statements before a top-level ``exit`` that ends the script with a known status.

    A bare ``exit`` leaves the previous command's status, so the one before it
    is the last; ``exit 0`` is itself the last, and always succeeds.
    """
    for index, statement in enumerate(statements):
        cmd = statement.pipelines[0].commands[0]
        if not _single(statement) or cmd.kind is not Kind.SIMPLE or cmd.name != "exit":
            continue
        args = cmd.words[cmd.words.index("exit") + 1 :]
        if not args:
            return statements[:index]
        if args[0] == "0":
            return statements[: index + 1]
    return statements


def _judge(statement: Statement, state: _State, is_last: bool) -> bool:
    """Record what ``statement`` hides; return whether it can leave a failing status behind.

    Follows the list's possible statuses (ok, fail) through ``&&`` and
    ``||``, remembering which assertion a failing status came from.
    """
    outcomes: dict[str, Command | None] = {}
    for position, pipeline in enumerate(statement.pipelines):
        op = statement.ops[position - 1] if position else None
        if op is None:
            runs, carried = True, {}
        elif op == "&&":
            runs = "ok" in outcomes
            carried = {k: v for k, v in outcomes.items() if k == "fail"}
        else:
            runs = "fail" in outcomes
            carried = {k: v for k, v in outcomes.items() if k == "ok"}
        if not runs:
            outcomes = carried
            continue
        _masking(statement, position, pipeline, state)
        result: dict[str, Command | None] = {"ok": None}
        if any(_exits_with_failure(c) for c in pipeline.commands):
            state.can_fail = True
        elif _pipeline_may_fail(pipeline, state):
            if state.errexit and position == len(statement.pipelines) - 1 and not pipeline.negated:
                # set -e ends the script here, with this failure.
                state.can_fail = True
            else:
                result["fail"] = _assertion(pipeline)
        if carried.get("fail") is not None:
            result["fail"] = carried["fail"]
        outcomes = {**carried, **result}
    if "fail" in outcomes and not is_last and outcomes["fail"] is not None:
        failed = outcomes["fail"]
        state.issues.append(
            Issue(
                problem=Problem.IGNORED, line=failed.line, message=_ignored_message(failed, state)
            )
        )
    return "fail" in outcomes


def _pipeline_may_fail(pipeline: Pipeline, state: _State) -> bool:
    if pipeline.negated:
        return True
    if state.pipefail:
        return not all(_always_succeeds(c) for c in pipeline.commands)
    return not _always_succeeds(pipeline.commands[-1])


def _masking(statement: Statement, position: int, pipeline: Pipeline, state: _State) -> None:
    commands = pipeline.commands
    last = commands[-1]
    if (
        not state.pipefail
        and len(commands) > 1
        and last.kind is Kind.SIMPLE
        and last.name in FILTERS
    ):
        hidden = next(
            (c for c in commands[:-1] if c.kind is not Kind.FUNCTION and c.name not in FILTERS),
            None,
        )
        if hidden is not None:
            state.issues.append(
                Issue(
                    problem=Problem.MASKED,
                    line=hidden.line,
                    message=(
                        f"the pipeline's status is `{last.name}`'s, so a failure of "
                        f"`{hidden.text()}` is ignored; add `set -o pipefail`"
                    ),
                )
            )
    nxt = position + 1
    if nxt < len(statement.pipelines) and statement.ops[position] == "||":
        rescue = statement.pipelines[nxt]
        if all(_always_succeeds(c) for c in rescue.commands):
            hidden_cmd = next(
                (c for c in commands if c.kind is Kind.COMPOUND or c.name not in HOUSEKEEPING), None
            )
            if hidden_cmd is not None:
                state.issues.append(
                    Issue(
                        problem=Problem.MASKED,
                        line=hidden_cmd.line,
                        message=(
                            f"`|| {rescue.commands[0].text()}` turns a failure of "
                            f"`{hidden_cmd.text()}` into success"
                        ),
                    )
                )


def _ignored_message(cmd: Command, state: _State) -> str:
    if state.errexit:
        return (
            f"a failure of `{cmd.text()}` is ignored: under `set -e` a command before `&&` "
            'does not stop the script; write `... || qs_fail "why"`'
        )
    why = (
        f"`set +e` at line {state.errexit_off_line}"
        if state.errexit_off_line is not None
        else "there is no `set -e`"
    )
    return (
        f"a failure of `{cmd.text()}` is ignored: {why} and it is not the last command; "
        'write `... || qs_fail "why"`'
    )
