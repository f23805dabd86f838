"""A fix hint says sudo to a user who is not root, and nothing to root."""

from __future__ import annotations

import pytest

from firstrun import fixes


@pytest.mark.parametrize(("euid", "says"), [(0, "apt-get install bubblewrap libseccomp2"),
                                            (1000, "sudo apt-get install bubblewrap libseccomp2")])
def test_an_install_hint_is_what_this_user_would_type(monkeypatch: pytest.MonkeyPatch, euid: int,
                                                      says: str) -> None:
    monkeypatch.setattr(fixes.os, "geteuid", lambda: euid)
    assert fixes.apt_fix("bubblewrap", "libseccomp2") == says
    assert fixes.as_root("systemctl start docker").startswith("sudo " if euid else "systemctl")


def test_no_fix_hint_in_the_package_names_apt_get_but_through_apt_fix() -> None:
    import re
    from pathlib import Path

    import firstrun

    root = Path(firstrun.__file__).parent
    spelled = [str(p.relative_to(root)) for p in root.rglob("*.py")
               if re.search(r'fix=f?"(sudo )?apt-get', p.read_text(encoding="utf-8"))]
    assert spelled == []
