"""The shell reader, table-driven: (script, [(problem, line)]) with every problem it should find."""

from __future__ import annotations

import pytest

from firstrun.tasks.shell import Problem, analyse

IGN, M, A = Problem.IGNORED, Problem.MASKED, Problem.ALWAYS_PASSES

CASES = {
    "only the last status counts without set -e": ("test -f a\ntest -f b\n", [(IGN, 1)]),
    "guarded assertions": ("test -f a || qs_fail 'no a'\ntest -f b\n", []),
    "set -e stops at a failure": ("set -e\ntest -f a\ntest -f b\necho done\n", []),
    "set -euo pipefail combined flags": ("set -euo pipefail\ncurl -s x | tee out\necho ok\n", []),
    "a command before && under set -e": (
        "set -e\ntest -f a && echo ok\necho done\n",
        [(IGN, 2), (A, 1)],
    ),
    "or true": ("grep -q x f || true\n", [(M, 1), (A, 1)]),
    "or colon after housekeeping is fine": ("kill $pid || :\ntest -f a\n", []),
    "pipeline into tee without pipefail": (".venv/bin/python main.py | tee out.txt\n", [(M, 1)]),
    "pipeline into grep is the normal idiom": ("curl -s localhost | grep -q ok\n", []),
    "echo only": ("echo hello\n# nothing else\n", [(A, 1)]),
    "comments only": ("# todo\n", [(A, 1)]),
    "set +e switches errexit off": ("set -e\nset +e\ntest -f a\necho hi\n", [(IGN, 3), (A, 1)]),
    "heredoc bodies are not commands": (
        "cat > x.sh <<'EOF2'\ntest -f a\necho\nEOF2\npython3 x.py\n",
        [],
    ),
    "if with exit": ("if ! test -f a; then\n  echo missing\n  exit 1\nfi\necho ok\n", []),
    "exit 0 ends the script": ("test -f a\nexit 0\ntest -f b\n", [(IGN, 1), (A, 1)]),
    "bare exit keeps the last status": ("test -f a\nexit\n", []),
    "functions are followed as calls": (
        'check() { test -f "$1" || qs_fail "no $1"; }\ncheck a\n',
        [],
    ),
    "case statements": ("case $x in\n a) echo a;;\n *) exit 1;;\nesac\n", []),
    "[[ with && inside": ("[[ -f a && -f b ]]\necho hi\n", [(IGN, 1), (A, 1)]),
    "continuation lines": (
        'test -n "$(find . -name x | head -1)" \\\n  || qs_fail nope\necho ok\n',
        [],
    ),
    "command substitution with quotes": (
        'db="$(find . -name "*.db" | head -1)"\ntest -n "$db"\n',
        [],
    ),
    "helpers decide by themselves": ("qs_wait_http /health --contains ok\necho done\n", []),
    "unbalanced quote gives up quietly": ("echo 'oops\ntest -f a\ntest -f b\n", []),
    "an assignment with substitution can fail under set -e": ("set -e\nv=$(cat f)\necho $v\n", []),
    # The subshell's failure is forgotten: echo's status is the script's.
    "subshell then echo": ("(cd app && test -f dist/index.html)\necho built\n", [(A, 1)]),
    "subshell last": ("echo checking\n(cd app && test -f dist/index.html)\n", []),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_analyse(name: str) -> None:
    script, expected = CASES[name]
    assert [(i.problem, i.line) for i in analyse(script)] == expected


def test_messages_name_the_command_and_the_remedy() -> None:
    (issue,) = analyse("test -f a\ntest -f b\n")
    assert "`test -f a`" in issue.message and "qs_fail" in issue.message
    masked = analyse("python3 run.py | head -1\n")
    assert masked[0].message.endswith("add `set -o pipefail`")
