"""``firstrun completion bash|zsh|fish``: a shell completion script made from the parser itself.

Guarantee: every subcommand, every flag (each of its spellings), every flag's
choices and whether a flag takes a value are read from the argparse parser when
the script is printed, so the script cannot offer a command, flag or choice that
firstrun's parser lacks, nor lack one it has. The scripts define nothing in the
shell but firstrun's completion and functions named ``_firstrun*`` and
``__firstrun*``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from firstrun import __version__

SHELLS = ("bash", "zsh", "fish")

# What a value completes to, by the metavar the parser shows for it.
# Every metavar the parser uses is named in one of these (a test holds it), so
# a new one cannot silently complete to the wrong thing.
PATHS = frozenset({"FILE", "TASK", "TRACE", "RESULTS_DIR", "BEFORE", "AFTER"})
DIRECTORIES = frozenset({"DIR"})
FREE = frozenset({"A", "ADDR", "AGENT", "B", "HOST", "HOST=SRC", "IMAGE", "MB", "MODEL", "N", "NAME",
                  "SECONDS", "URL", "USD"})

Completes = Literal["files", "dirs", "nothing"]


def _example_names() -> tuple[str, ...]:
    from firstrun.examples import list_examples

    return ("all", *(example.name for example in list_examples()))


def _agent_names() -> tuple[str, ...]:
    from firstrun.agents import AGENTS

    return AGENTS


# Values the parser leaves free but the command checks against a fixed set.
# Each set is read from the code that checks the value.
_HINTS: dict[str, Callable[[], tuple[str, ...]]] = {"--agent": _agent_names, "--example": _example_names}


@dataclass(frozen=True, kw_only=True)
class Value:
    """What a flag or a positional argument takes: choices, or files, directories or free text."""

    metavar: str
    choices: tuple[str, ...] = ()
    completes: Completes = "nothing"


@dataclass(frozen=True, kw_only=True)
class Flag:
    names: tuple[str, ...]
    help: str
    value: Value | None
    repeatable: bool = False
    # What zsh no longer offers once this flag is given: its other spellings and its
    # mutually exclusive group; everything ("-", ":", "*") after -h or -V, which end the command.
    excludes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Positional:
    value: Value
    many: bool


@dataclass(frozen=True, kw_only=True)
class Command:
    """One parser: ``path`` is its words after ``firstrun`` (``()`` for the top level)."""

    path: tuple[str, ...]
    help: str
    flags: tuple[Flag, ...]
    positionals: tuple[Positional, ...]
    commands: tuple[Command, ...]
    # ``firstrun sandbox [OPTIONS] -- COMMAND``: the words after ``--`` are a command line.
    takes_command: bool = False

    def walk(self) -> Iterator[Command]:
        yield self
        for command in self.commands:
            yield from command.walk()


def read_parser(parser: argparse.ArgumentParser, path: tuple[str, ...] = (), help: str = "") -> Command:
    """``parser`` as the completion scripts need it, subcommands included."""
    flags: list[Flag] = []
    positionals: list[Positional] = []
    commands: list[Command] = []
    groups: dict[int, list[str]] = {}
    for group in parser._mutually_exclusive_groups:
        names = [n for action in group._group_actions for n in action.option_strings]
        for action in group._group_actions:
            groups[id(action)] = names
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                commands.append(read_parser(sub, (*path, name), helps.get(name, "")))
        elif action.option_strings:
            flags.append(_flag(action, groups.get(id(action), [])))
        else:
            positionals.append(Positional(value=_value(action, action.metavar or action.dest),
                                          many=action.nargs in ("*", "+", argparse.REMAINDER)))
    return Command(path=path, help=_summary(help or parser.description or ""), flags=tuple(flags),
                   positionals=tuple(positionals), commands=tuple(commands),
                   takes_command="-- COMMAND" in (parser.usage or ""))


def _flag(action: argparse.Action, group: list[str]) -> Flag:
    names = tuple(action.option_strings)
    if isinstance(action, argparse._HelpAction | argparse._VersionAction):
        return Flag(names=names, help=_summary(action.help or ""), value=None, excludes=("-", ":", "*"))
    repeatable = isinstance(action, argparse._AppendAction | argparse._CountAction)
    value = None
    if action.nargs != 0:
        metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
        value = _value(action, metavar)
    excludes = tuple(dict.fromkeys((*names, *group)))
    if repeatable or len(excludes) == 1:
        # A flag given once is not offered again anyway; a repeatable one is.
        excludes = ()
    return Flag(names=names, help=_summary(action.help or ""), value=value, repeatable=repeatable,
                excludes=excludes)


def _value(action: argparse.Action, metavar: str) -> Value:
    choices: tuple[str, ...] = tuple(str(c) for c in action.choices or ())
    if not choices:
        hint = next((_HINTS[n] for n in action.option_strings if n in _HINTS), None)
        choices = hint() if hint is not None else ()
    completes: Completes = "nothing"
    if not choices:
        completes = "files" if metavar in PATHS else "dirs" if metavar in DIRECTORIES else "nothing"
    return Value(metavar=metavar, choices=choices, completes=completes)


def _summary(text: str, limit: int = 100) -> str:
    """A help text as one short line: its first clause (never cut inside parentheses), cut at a word."""
    line = " ".join(text.split())
    at = 0
    while (at := line.find("; ", at + 1)) > 0:
        if line.count("(", 0, at) == line.count(")", 0, at):
            line = line[:at]
            break
    if len(line) <= limit:
        return line
    line = line[: limit - 3].rsplit(" ", 1)[0]
    if line.count("(") != line.count(")"):
        line = line[: line.rfind(" (")]
    return line + "..."


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser`` for ``shell`` (one of ``SHELLS``)."""
    top = read_parser(parser)
    return {"bash": _bash, "zsh": _zsh, "fish": _fish}[shell](top)


def _header(shell: str, install: str) -> str:
    return (f"# {shell} completion for firstrun, made by 'firstrun completion {shell}' from the "
            f"parser of firstrun {__version__}.\n"
            f"# Install: {install}\n")


# --- bash ------------------------------------------------------------------------------------

def _sq(text: str) -> str:
    """``text`` in single quotes for bash or zsh."""
    return "'" + text.replace("'", "'\\''") + "'"


def _key(path: tuple[str, ...]) -> str:
    return " ".join(path)


def _bash_value(value: Value) -> str:
    if value.choices:
        return " ".join(value.choices)
    return {"files": "@files", "dirs": "@dirs", "nothing": "@nothing"}[value.completes]


def _bash(top: Command) -> str:
    commands = list(top.walk())
    out = [_header("bash", "firstrun completion bash > ~/.local/share/bash-completion/completions/"
                   "firstrun (or /etc/bash_completion.d/firstrun)"), "\n"]

    out.append("# The subcommands of a command path ('' is firstrun itself).\n")
    out.append("__firstrun_commands() {\n    case \"$1\" in\n")
    for command in commands:
        if command.commands:
            names = " ".join(c.path[-1] for c in command.commands)
            out.append(f"        {_sq(_key(command.path))}) echo {_sq(names)} ;;\n")
    out.append("    esac\n}\n\n")

    out.append("# Every spelling of every flag of a command path.\n")
    out.append("__firstrun_flags() {\n    case \"$1\" in\n")
    for command in commands:
        names = " ".join(n for flag in command.flags for n in flag.names)
        out.append(f"        {_sq(_key(command.path))}) echo {_sq(names)} ;;\n")
    out.append("    esac\n}\n\n")

    out.append("# What the value of flag $2 of command path $1 completes to (its choices, @files,\n"
               "# @dirs or @nothing); status 1 if the flag takes no value.\n")
    out.append("__firstrun_value() {\n    case \"$1:$2\" in\n")
    for command in commands:
        for flag in command.flags:
            if flag.value is not None:
                keys = " | ".join(_sq(f"{_key(command.path)}:{name}") for name in flag.names)
                out.append(f"        {keys}) echo {_sq(_bash_value(flag.value))} ;;\n")
    out.append("        *) return 1 ;;\n    esac\n}\n\n")

    out.append("# What the positional argument number $2 (from 0) of command path $1 completes to.\n")
    out.append("__firstrun_positional() {\n    case \"$1\" in\n")
    for command in commands:
        if command.positionals:
            cases = []
            for i, positional in enumerate(command.positionals):
                pattern = "*" if positional.many and i == len(command.positionals) - 1 else str(i)
                cases.append(f"{pattern}) echo {_sq(_bash_value(positional.value))} ;;")
            out.append(f"        {_sq(_key(command.path))}) case \"$2\" in {' '.join(cases)} esac ;;\n")
    out.append("    esac\n}\n\n")

    takes = [command for command in commands if command.takes_command]
    out.append("# Whether command path $1 runs the command line that follows '--'.\n")
    out.append("__firstrun_takes_command() {\n    case \"$1\" in\n")
    for command in takes:
        out.append(f"        {_sq(_key(command.path))}) return 0 ;;\n")
    out.append("    esac\n    return 1\n}\n\n")
    out.append(_BASH_MAIN)
    return "".join(out)


_BASH_MAIN = r"""# COMPREPLY from what $1 says ($2 the word so far, $3 a prefix to keep).
__firstrun_reply() {
    local line
    COMPREPLY=()
    case "$1" in
        @files) compopt -o filenames 2>/dev/null
                while IFS= read -r line; do COMPREPLY+=("$3$line"); done < <(compgen -f -- "$2") ;;
        @dirs) compopt -o filenames 2>/dev/null
               while IFS= read -r line; do COMPREPLY+=("$3$line"); done < <(compgen -d -- "$2") ;;
        @commands) while IFS= read -r line; do COMPREPLY+=("$line"); done < <(compgen -c -- "$2") ;;
        @nothing|'') ;;
        *) while IFS= read -r line; do COMPREPLY+=("$3$line"); done < <(compgen -W "$1" -- "$2") ;;
    esac
}

_firstrun() {
    local cur="${COMP_WORDS[COMP_CWORD]}" path='' word pending='' prefix='' i=1 npos=0 dashdash=0
    # Walk the words before the cursor: subcommands, flags and their values, positionals.
    while [ "$i" -lt "$COMP_CWORD" ]; do
        word="${COMP_WORDS[i]}"
        if [ -n "$pending" ]; then
            # This word is the pending flag's value (readline splits --flag=value at '=').
            [ "$word" = "=" ] || pending=''
        elif [ "$dashdash" -gt 0 ]; then
            :
        elif [ "$word" = "--" ]; then
            dashdash=$i
        elif [[ "$word" == -* ]]; then
            if [[ "$word" != *=* ]] && __firstrun_value "$path" "$word" >/dev/null; then
                pending="$word"
            fi
        elif [[ " $(__firstrun_commands "$path") " == *" $word "* ]]; then
            path="${path:+$path }$word"
            npos=0
        else
            npos=$((npos + 1))
        fi
        i=$((i + 1))
    done
    if [ "$dashdash" -gt 0 ]; then
        if __firstrun_takes_command "$path"; then
            if [ "$COMP_CWORD" -eq $((dashdash + 1)) ]; then
                __firstrun_reply @commands "$cur"
            else
                __firstrun_reply @files "$cur"
            fi
        fi
        return 0
    fi
    if [ -z "$pending" ] && [[ "$cur" == -*=* ]]; then
        # --flag=value as one word (COMP_WORDBREAKS without '=').
        pending="${cur%%=*}"
        prefix="$pending="
        cur="${cur#*=}"
    fi
    if [ -n "$pending" ]; then
        [ "$cur" = "=" ] && cur=''
        __firstrun_reply "$(__firstrun_value "$path" "$pending")" "$cur" "$prefix"
    elif [[ "$cur" == -* ]]; then
        __firstrun_reply "$(__firstrun_flags "$path")" "$cur"
    elif [ -n "$(__firstrun_commands "$path")" ]; then
        __firstrun_reply "$(__firstrun_commands "$path")" "$cur"
    else
        __firstrun_reply "$(__firstrun_positional "$path" "$npos")" "$cur"
    fi
    return 0
}

complete -F _firstrun firstrun
"""


# --- zsh -------------------------------------------------------------------------------------

def _zsh_function(path: tuple[str, ...]) -> str:
    return "_firstrun" + "".join("_" + word.replace("-", "_") for word in path)


def _zsh_text(text: str) -> str:
    """An explanation inside ``[...]`` of an ``_arguments`` spec."""
    return text.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")


def _zsh_message(text: str) -> str:
    return text.replace("\\", "\\\\").replace(":", "\\:")


def _zsh_action(value: Value) -> str:
    if value.choices:
        return "(" + " ".join(value.choices) + ")"
    return {"files": "_files", "dirs": "_files -/", "nothing": " "}[value.completes]


def _zsh_flag(flag: Flag) -> list[str]:
    specs = []
    for name in flag.names:
        excludes = f"({' '.join(flag.excludes)})" if flag.excludes else ""
        star = "*" if flag.repeatable else ""
        spec = f"{excludes}{star}{name}"
        arg = ""
        if flag.value is not None:
            spec += "=" if name.startswith("--") else "+"
            arg = f":{_zsh_message(flag.value.metavar)}:{_zsh_action(flag.value)}"
        specs.append(_sq(f"{spec}[{_zsh_text(flag.help)}]{arg}"))
    return specs


def _zsh_command(command: Command) -> str:
    name = _zsh_function(command.path)
    specs = [spec for flag in command.flags for spec in _zsh_flag(flag)]
    lines = [f"{name}() {{\n"]
    if command.commands:
        specs += [_sq(": :->command"), _sq("*:: :->argument")]
        lines.append("    local curcontext=\"$curcontext\" state state_descr line ret=1\n"
                     "    typeset -A opt_args\n")
        lines.append("    _arguments -C -s -S \\\n" + "".join(f"        {s} \\\n" for s in specs)
                     + "        && ret=0\n")
        described = " ".join(_sq(f"{_zsh_message(c.path[-1])}:{c.help}") for c in command.commands)
        lines.append("    case $state in\n"
                     "        command)\n"
                     f"            local -a commands=({described})\n"
                     f"            _describe -t commands {_sq(' '.join(('firstrun', *command.path, 'command')))} "
                     "commands && ret=0 ;;\n"
                     "        argument)\n"
                     "            curcontext=\"${curcontext%:*:*}:"
                     + "-".join(("firstrun", *command.path)) + "-${words[1]}:\"\n"
                     "            case ${words[1]} in\n")
        for sub in command.commands:
            lines.append(f"                {_sq(sub.path[-1])}) {_zsh_function(sub.path)} && ret=0 ;;\n")
        lines.append("            esac ;;\n    esac\n    return ret\n}\n\n")
        return "".join(lines)
    for i, positional in enumerate(command.positionals):
        many = positional.many and i == len(command.positionals) - 1
        specs.append(_sq(f"{'*' if many else ''}:{_zsh_message(positional.value.metavar)}:"
                         f"{_zsh_action(positional.value)}"))
    if command.takes_command:
        specs.append(_sq("(-)--[the command line follows]"))
        # After '--' the words are a command line of their own.
        lines.append("    local dashdash=${words[(i)--]}\n"
                     "    if (( dashdash < CURRENT )); then\n"
                     "        shift $dashdash words\n"
                     "        (( CURRENT -= dashdash ))\n"
                     "        _normal\n"
                     "        return\n"
                     "    fi\n")
    lines.append("    _arguments -s -S \\\n" + " \\\n".join(f"        {s}" for s in specs) + "\n}\n\n")
    return "".join(lines)


def _zsh(top: Command) -> str:
    out = ["#compdef firstrun\n",
           _header("zsh", "firstrun completion zsh > ~/.zfunc/_firstrun, with fpath=(~/.zfunc $fpath) "
                   "before compinit in ~/.zshrc"), "\n"]
    out += [_zsh_command(command) for command in top.walk()]
    # Loaded from $fpath the file is the function's body; sourced, it registers itself.
    out.append('if [ "$funcstack[1]" = "_firstrun" ]; then\n'
               '    _firstrun "$@"\n'
               'else\n'
               '    compdef _firstrun firstrun\n'
               'fi\n')
    return "".join(out)


# --- fish ------------------------------------------------------------------------------------

def _fq(text: str) -> str:
    """``text`` in single quotes for fish."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_args(value: Value) -> str:
    if value.choices:
        return f"-x -a {_fq(' '.join(value.choices))}"
    if value.completes == "files":
        return "-r -F"
    if value.completes == "dirs":
        return "-x -a '(__fish_complete_directories (commandline -ct))'"
    return "-x"


def _fish(top: Command) -> str:
    commands = list(top.walk())
    out = [_header("fish", "firstrun completion fish > ~/.config/fish/completions/firstrun.fish"), "\n"]
    out.append("# The subcommands of a command path ('' is firstrun itself).\n"
               "function __firstrun_commands\n    switch \"$argv[1]\"\n")
    for command in commands:
        if command.commands:
            names = " ".join(_fq(c.path[-1]) for c in command.commands)
            out.append(f"        case {_fq(_key(command.path))}\n            printf '%s\\n' {names}\n")
    out.append("    end\nend\n\n")
    out.append("# Status 0 if flag $argv[2] of command path $argv[1] takes the next word as its value.\n"
               "function __firstrun_takes_value\n    switch \"$argv[1]:$argv[2]\"\n")
    valued = [_fq(f"{_key(c.path)}:{name}") for c in commands for flag in c.flags
              if flag.value is not None for name in flag.names]
    if valued:
        out.append(f"        case {' '.join(valued)}\n            return 0\n")
    out.append("    end\n    return 1\nend\n\n")
    out.append(_FISH_MAIN)
    out.append("complete -c firstrun -f\n")
    for command in commands:
        key = _fq(_key(command.path))
        flags_here = _fq(f"__firstrun_in {key}")
        for sub in command.commands:
            out.append(f"complete -c firstrun -n {_fq(f'__firstrun_arg {key}')} -a {_fq(sub.path[-1])} "
                       f"-d {_fq(sub.help)}\n")
        for flag in command.flags:
            names = " ".join(f"-l {_fq(n[2:])}" if n.startswith("--") else f"-s {_fq(n[1:])}"
                             for n in flag.names)
            args = "" if flag.value is None else " " + _fish_args(flag.value)
            out.append(f"complete -c firstrun -n {flags_here} {names}{args} -d {_fq(flag.help)}\n")
        for i, positional in enumerate(command.positionals):
            many = positional.many and i == len(command.positionals) - 1
            where = _fq(f"__firstrun_arg {key} {i}" + (" more" if many else ""))
            value = positional.value
            if value.choices:
                args = f"-a {_fq(' '.join(value.choices))}"
            elif value.completes == "files":
                args = "-F"
            elif value.completes == "dirs":
                args = "-a '(__fish_complete_directories (commandline -ct))'"
            else:
                continue
            out.append(f"complete -c firstrun -n {where} {args}\n")
        if command.takes_command:
            out.append(f"complete -c firstrun -n {_fq(f'__firstrun_after_dashdash {key}')} "
                       "-a '(__fish_complete_subcommand --commandline (__firstrun_command_line))'\n")
    return "".join(out)


_FISH_MAIN = r"""# Print the command path of the command line so far, then how many positional
# arguments it has, whether '--' was given and whether a flag waits for its value.
function __firstrun_state
    set -l words (commandline -opc)
    set -e words[1]
    set -l path ''
    set -l npos 0
    set -l pending 0
    set -l dashdash 0
    for word in $words
        if test $pending = 1
            set pending 0
        else if test $dashdash = 1
            continue
        else if test "$word" = '--'
            set dashdash 1
        else if string match -q -- '-*' $word
            if not string match -q -- '*=*' $word; and __firstrun_takes_value "$path" $word
                set pending 1
            end
        else if contains -- $word (__firstrun_commands "$path")
            set path (string trim -- "$path $word")
            set npos 0
        else
            set npos (math $npos + 1)
        end
    end
    printf '%s\n' "$path" $npos $dashdash $pending
end

# Status 0 if the word being completed is at command path $argv[1], before any '--'.
function __firstrun_in
    set -l state (__firstrun_state)
    test "$state[1]" = "$argv[1]"; and test $state[3] = 0
end

# Status 0 if the word being completed is an argument (no flag's value) of command path
# $argv[1]; with $argv[2], only positional argument number $argv[2] (from 0), or with
# $argv[3], that one or any after it.
function __firstrun_arg
    set -l state (__firstrun_state)
    test "$state[1]" = "$argv[1]"; and test $state[3] = 0; and test $state[4] = 0; or return 1
    set -q argv[2]; or return 0
    test $state[2] -eq $argv[2]; and return 0
    set -q argv[3]; and test $state[2] -gt $argv[2]
end

# Status 0 if the word being completed comes after '--' at command path $argv[1].
function __firstrun_after_dashdash
    set -l state (__firstrun_state)
    test "$state[1]" = "$argv[1]"; and test $state[3] = 1
end

# The command line after '--', the word being completed last.
function __firstrun_command_line
    set -l words (commandline -opc)
    set -l at (contains -i -- '--' $words); or return
    printf '%s\n' $words[(math $at + 1)..-1] (commandline -ct)
end

"""
