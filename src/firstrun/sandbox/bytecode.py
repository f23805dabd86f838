"""Our stdlib-only programs (the helper, the attestation probe), run inside a sandbox as byte code.

Guarantee: ``python_argv`` (and ``BOOTSTRAP`` with ``encoded``) runs exactly the module's own code, as
``python -I -S -c`` runs its source: the same ``__main__`` namespace, the
same ``sys.argv`` after it, but without compiling the source in the sandbox
on every start (about 5 ms for the helper, 3 for the probe). The code is
the one the harness's import system holds for the module (its byte-code
cache when there is one), marshalled and handed over base64 in argv, so
nothing beyond argv has to reach the sandbox. Marshalled code is only read
by the interpreter that wrote it: the caller hands it over only where the
sandbox runs the harness's own interpreter (bound in), and the source
otherwise.
"""

from __future__ import annotations

import binascii
import marshal
import sys
from functools import cache
from types import ModuleType

# Pops the code off argv, so the program sees the argv its source would.
BOOTSTRAP = "import binascii,marshal,sys;exec(marshal.loads(binascii.a2b_base64(sys.argv.pop(1))))"


def encoded(module: ModuleType) -> str:
    """``module``'s code, marshalled and base64: the argument ``BOOTSTRAP`` takes."""
    return _encoded(module.__name__)


@cache
def _encoded(name: str) -> str:
    code = sys.modules[name].__spec__.loader.get_code(name)  # type: ignore[union-attr]
    return binascii.b2a_base64(marshal.dumps(code), newline=False).decode("ascii")


@cache
def _source(name: str) -> str:
    with open(sys.modules[name].__file__ or "", encoding="utf-8") as f:
        return f.read()


def python_argv(python: str, module: ModuleType, *, compiled: bool) -> list[str]:
    """``python -I -S`` running ``module``'s program: its code when ``compiled``, else its source."""
    if compiled:
        return [python, "-I", "-S", "-c", BOOTSTRAP, encoded(module)]
    return [python, "-I", "-S", "-c", _source(module.__name__)]
