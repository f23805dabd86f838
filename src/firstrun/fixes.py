"""The fixes a refusal names, spelled as this user would type them.

Guarantee: a fix hint runs under sudo only for a user who is not root, and
an install names Debian's and Ubuntu's packages (the only systems firstrun
is tested on). Below the mechanisms and the image builder, so both use it.
"""

from __future__ import annotations

import os


def as_root(command: str) -> str:
    """``command`` as a fix hint says it: under sudo for a user who is not root."""
    return command if os.geteuid() == 0 else f"sudo {command}"


def apt_fix(*packages: str) -> str:
    """The command that installs ``packages``, for a fix hint."""
    return as_root(f"apt-get install {' '.join(packages)}")
