"""The one system prompt every model agent gets, and the task message built from a brief.

Guarantee: every vendor's adapter sends exactly ``SYSTEM_PROMPT`` and
``task_message(brief)``, so runs of different models differ only in the
model; an agent CLI gets ``cli_prompt`` beside its own. Any change to a text
changes its version (``PROMPT_VERSION``, ``CLI_PROMPT_VERSION``), which every
run records: runs under different prompts do not compare. The success check
is never in any of them.
"""

from __future__ import annotations

from firstrun.agents.base import Brief

PROMPT_VERSION = "1"
# What firstrun adds to an agent CLI's own prompt, the same for every CLI; its
# version is recorded as the run's prompt_version.
CLI_PROMPT_VERSION = "cli-1"

# It tells the model what is true of its tools: the shell is sandboxed and
# cannot reach the documentation hosts, and ``read_docs`` is the way to the
# docs. It forbids leaning on prior knowledge of the project under test,
# because firstrun measures the docs, not what a model memorised about them.
SYSTEM_PROMPT = """\
You are a developer trying a project for the first time by following its documentation.

You have two tools:
- bash: runs one command with bash in your working directory, inside a sandbox. \
Installs from the usual package registries work. The shell cannot reach the \
documentation hosts: fetching docs pages with curl, wget or similar from the shell \
is refused.
- read_docs: reads one documentation page on your behalf and returns it as markdown, \
with its links. It reads only the documentation hosts you are given.

Rules:
- Work only from the documentation. Do not rely on anything you already know about \
this project, its commands, its APIs or its versions: if the docs do not say it, \
look for it in the docs, and if they never say it, that is what we want to learn. \
General knowledge of the shell, of package managers and of programming languages is fine.
- Start at the first page of the documented route and follow the docs as a reader would.
- Run commands to do the work; do not just describe it.
- When the goal is reached, or you are sure it cannot be reached from these docs, \
stop calling tools and reply with a short final report: what you did, whether the \
goal is reached, and where the docs were missing or wrong.
"""


def task_message(brief: Brief) -> str:
    """The first user message: the goal, the documented route and the docs hosts."""
    route = "\n".join(f"{n}. {url}" for n, url in enumerate(brief.docs_route, start=1))
    hosts = ", ".join(brief.docs_hosts)
    return (
        f"Goal: {brief.goal.strip()}\n\n"
        f"The documentation starts here (the documented route, in order):\n{route}\n\n"
        f"Documentation hosts (read them with read_docs): {hosts}\n\n"
        f"You have at most {brief.budgets.max_turns} turns and "
        f"{brief.budgets.max_seconds} seconds."
    )


def cli_prompt(read_docs: str) -> str:
    """The text added to an agent CLI's own prompt; ``read_docs``: how that CLI names the tool
    (``"mcp__firstrun__read_docs tool"``), after "with the"."""
    return (
        "You are a developer trying a project for the first time by following its "
        "documentation.\nYour shell is sandboxed and cannot reach the documentation hosts; "
        f"read documentation pages with the {read_docs}, the only way to them here. Work only "
        "from the documentation, not from anything you already know about this project. When "
        "the goal is reached, or you are sure it cannot be reached from these docs, stop and "
        "reply with a short final report: what you did, whether the goal is reached, and where "
        "the docs were missing or wrong.")
