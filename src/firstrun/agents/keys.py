"""Where each vendor's API key is read from, on the harness side only.

Guarantee: a key is read from the harness's environment, firstrun's own
variable first (``FIRSTRUN_<VENDOR>_API_KEY``), then the vendor's standard
name, and handed only to that vendor's SDK client. Nothing here copies it
anywhere else: the sandbox's environment is built from an allow-list, not
inherited (``firstrun.policy.process``), and no event, result or message
carries the key; a missing key is reported by the variables' names alone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from firstrun.errors import UsageError

KEY_VARIABLES: dict[str, tuple[str, ...]] = {
    "anthropic": ("FIRSTRUN_ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY"),
    "openai": ("FIRSTRUN_OPENAI_API_KEY", "OPENAI_API_KEY"),
    "gemini": ("FIRSTRUN_GEMINI_API_KEY", "GEMINI_API_KEY"),
}


def read_key(vendor: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The first non-empty key among ``KEY_VARIABLES[vendor]``, or None."""
    env = os.environ if environ is None else environ
    for name in KEY_VARIABLES[vendor]:
        value = env.get(name, "").strip()
        if value:
            return value
    return None


def require_key(vendor: str, *, agent: str, environ: Mapping[str, str] | None = None) -> str:
    """The key, or a ``UsageError`` naming the variables to set."""
    key = read_key(vendor, environ)
    if key is None:
        names = " or ".join(KEY_VARIABLES[vendor])
        raise UsageError(f"--agent {agent}: no API key: set {names}")
    return key
