"""A directory mirror's containment: by path components, and a mirror of / serves nothing."""

from __future__ import annotations

import os

from firstrun.docs.mirror import serve_directory


def test_a_sibling_sharing_the_roots_prefix_is_outside(tmp_path):
    root = tmp_path / "site"
    root.mkdir()
    sibling = tmp_path / "site-private"
    sibling.mkdir()
    (sibling / "secret.html").write_text("CANARY")
    os.symlink(sibling / "secret.html", root / "leak.html")
    (root / "page.html").write_text("<p>ok</p>")
    assert serve_directory(str(root), b"/leak.html").status_code == 403
    assert serve_directory(str(root), b"/page").status_code == 200


def test_a_mirror_of_the_filesystem_root_serves_no_file(tmp_path):
    assert os.path.isfile("/etc/passwd")
    assert serve_directory("/", b"/etc/passwd").status_code == 403
    assert serve_directory("/", b"/etc/").status_code in (403, 404)
    assert serve_directory("/", b"/no-such-page-" + os.urandom(4).hex().encode()).status_code == 404
