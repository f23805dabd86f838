"""Our stdlib-only programs (the helper, the guest agent, the attestation probe), as a sandbox runs them.

Guarantee: ``python_argv`` (and ``BOOTSTRAP`` with ``encoded``) runs exactly the
module's own code as ``python -I -S -c`` runs its source (the same ``__main__``
namespace, the same ``sys.argv`` after it), with nothing beyond argv reaching
the sandbox. A program that imports another of our modules (``SHIPPED``)
carries it, installed under its own name before the program runs.
"""

from __future__ import annotations

import binascii
import marshal
import sys
from functools import cache
from types import CodeType, ModuleType

# Pops the code off argv, so the program sees the argv its source would.
BOOTSTRAP = "import binascii,marshal,sys;exec(marshal.loads(binascii.a2b_base64(sys.argv.pop(1))))"

# The modules of ours a program imports, which it carries: inside a sandbox
# there is no firstrun package to import them from.
SHIPPED: dict[str, tuple[str, ...]] = {
    "firstrun.sandbox.helper": ("firstrun.sandbox.supervisor",),
    "firstrun.sandbox.microvm.agent": ("firstrun.sandbox.supervisor",),
}

# Run first in the program's own namespace (``__main__``, or the guest
# agent's): each carried module into ``sys.modules``, then the program.
_CARRY_SOURCE = """\
import sys as _sys, types as _types
for _name, _text in {shipped!r}:
    _sys.modules[_name] = _types.ModuleType(_name)
    exec(compile(_text, _name, "exec"), _sys.modules[_name].__dict__)
del _sys, _types, _name, _text
exec(compile({main!r}, {name!r}, "exec"))
"""
# The same for code objects, which the harness has compiled already: they
# travel marshalled in one bytes constant, put in place of this marker.
_MARKER = b"\0firstrun-program\0"
_CARRY_CODE = f"""\
import marshal as _marshal, sys as _sys, types as _types
_shipped, _main = _marshal.loads({_MARKER!r})
for _name, _code in _shipped:
    _sys.modules[_name] = _types.ModuleType(_name)
    exec(_code, _sys.modules[_name].__dict__)
del _marshal, _sys, _types, _shipped, _name, _code
exec(_main)
"""


def encoded(module: ModuleType) -> str:
    """``module``'s program as code, marshalled and base64: the argument ``BOOTSTRAP`` takes."""
    return _encoded(module.__name__)


# The code the harness's import system holds for the module (its byte-code cache when there
# is one), so the sandbox does not compile the source on every start (about 5 ms for the
# helper, 3 for the probe).
def _code(name: str) -> CodeType:
    return sys.modules[name].__spec__.loader.get_code(name)  # type: ignore[union-attr]


@cache
def _encoded(name: str) -> str:
    code = _code(name)
    shipped = SHIPPED.get(name, ())
    if shipped:
        carried = marshal.dumps((tuple((s, _code(s)) for s in shipped), code))
        loader = compile(_CARRY_CODE, name, "exec")
        code = loader.replace(co_consts=tuple(carried if c == _MARKER else c
                                              for c in loader.co_consts))
    return binascii.b2a_base64(marshal.dumps(code), newline=False).decode("ascii")


def source(module: ModuleType) -> str:
    """``module``'s program as source text, for ``python -c`` or the guest agent's boot."""
    return _program_source(module.__name__)


@cache
def _source(name: str) -> str:
    with open(sys.modules[name].__file__ or "", encoding="utf-8") as f:
        return f.read()


@cache
def _program_source(name: str) -> str:
    shipped = SHIPPED.get(name, ())
    if not shipped:
        return _source(name)
    return _CARRY_SOURCE.format(shipped=tuple((s, _source(s)) for s in shipped),
                                main=_source(name), name=name)


# Marshalled code is only read by the interpreter that wrote it: callers pass ``compiled``
# only where the sandbox runs the harness's own interpreter (bound in), and the source
# otherwise.
def python_argv(python: str, module: ModuleType, *, compiled: bool) -> list[str]:
    """``python -I -S`` running ``module``'s program: its code when ``compiled``, else its source."""
    if compiled:
        return [python, "-I", "-S", "-c", BOOTSTRAP, encoded(module)]
    return [python, "-I", "-S", "-c", source(module)]
