"""toolchain_lending: what of each toolchain on the PATH is lent, as a table (pure)."""

from __future__ import annotations

import pytest

from firstrun.policy.filesystem import toolchain_lending

H = "/home/dev"


def _exists(*present: str):
    paths = {f"{H}/{p}" for p in present}
    return lambda path: any(p == path or p.startswith(path + "/") for p in paths)


@pytest.mark.parametrize(("path", "present", "readonly", "env"), [
    # rustup's cargo proxy runs from ~/.rustup: its toolchains come along, and
    # RUSTUP_HOME says where they are; ~/.cargo's config and tokens stay behind.
    ([f"{H}/.cargo/bin"],
     (".cargo/bin/cargo", ".cargo/config.toml", ".rustup/toolchains/stable/bin/rustc",
      ".rustup/settings.toml", ".rustup/downloads/x"),
     (f"{H}/.cargo/bin", f"{H}/.rustup/toolchains", f"{H}/.rustup/settings.toml"),
     (("RUSTUP_HOME", f"{H}/.rustup"),)),
    # cargo alone (no rustup): only its programs.
    ([f"{H}/.cargo/bin"], (".cargo/bin/cargo", ".cargo/credentials.toml"),
     (f"{H}/.cargo/bin",), ()),
    # pyenv's shims exec its libexec and versions; a plugin's shims are lent too.
    ([f"{H}/.pyenv/plugins/pyenv-virtualenv/shims", f"{H}/.pyenv/shims", f"{H}/.pyenv/bin"],
     (".pyenv/bin/pyenv", ".pyenv/libexec/pyenv", ".pyenv/shims/python",
      ".pyenv/versions/3.11.7/bin/python", ".pyenv/plugins/pyenv-virtualenv/shims/x",
      ".pyenv/.netrc"),
     (f"{H}/.pyenv/bin", f"{H}/.pyenv/libexec", f"{H}/.pyenv/shims", f"{H}/.pyenv/versions",
      f"{H}/.pyenv/plugins"),
     (("PYENV_ROOT", f"{H}/.pyenv"),)),
    # An npm prefix of the user's own: its bin and the packages the bin links to.
    ([f"{H}/.npm-global/bin"], (".npm-global/bin/tsc", ".npm-global/lib/node_modules/x",
                                ".npm-global/etc/npmrc"),
     (f"{H}/.npm-global/bin", f"{H}/.npm-global/lib"), ()),
    # An unknown entry is lent as itself, with a sibling lib beside a bin.
    ([f"{H}/tools/bin"], ("tools/bin/t", "tools/lib/t.so", "tools/secrets.txt"),
     (f"{H}/tools/bin", f"{H}/tools/lib"), ()),
    ([f"{H}/tools/scripts"], ("tools/scripts/t", "tools/lib/t.so"),
     (f"{H}/tools/scripts",), ()),
    # Entries in a secret location, the home itself, relative and system
    # entries, and missing directories lend nothing.
    ([f"{H}/.ssh", H, "bin", "/usr/bin", f"{H}/.volta/bin"], (".ssh/id_ed25519",), (), ()),
    # The same toolchain twice is lent once.
    ([f"{H}/.cargo/bin", f"{H}/.cargo/bin"], (".cargo/bin/cargo",), (f"{H}/.cargo/bin",), ()),
])
def test_toolchain_lending(path: list[str], present: tuple[str, ...],
                           readonly: tuple[str, ...], env: tuple[tuple[str, str], ...]) -> None:
    lending = toolchain_lending(path, [H, "/root"], _exists(*present))
    assert lending.readonly == readonly
    assert lending.env == env
