"""Task files: the model, YAML loading with file:line errors, lint, JSON Schema, and policy compilation.

Guarantee: a task that ``firstrun.tasks.load.load_task`` returns is valid,
can produce evidence, and carries everything a run needs in memory (the
check text included); the only way into a ``NetworkPolicy`` from a task is
``firstrun.tasks.compile.compile_network_policy``, where documentation hosts
are kept off the shell.
"""
