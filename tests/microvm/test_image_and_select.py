"""The boot image as built, the probe's answers, and how the backend is selected."""

from __future__ import annotations

import os

import pytest

from firstrun.errors import SandboxUnavailable
from firstrun.sandbox.microvm import probe
from firstrun.sandbox.microvm.backend import MicrovmBackend
from firstrun.sandbox.microvm.image import (
    MODULES,
    cpio_newc,
    find_image,
    has_pvh_entry,
    pvh_kernel,
)
from firstrun.sandbox.select import REGISTRY, entry, select_backend
from support.profiles import make_profile


def _cpio_entries(data: bytes) -> dict[str, bytes]:
    """Parse a newc archive back (the kernel's unpacker reads exactly these fields)."""
    entries = {}
    pos = 0
    while True:
        assert data[pos:pos + 6] == b"070701"
        fields = [int(data[pos + 6 + 8 * i: pos + 14 + 8 * i], 16) for i in range(13)]
        size, namesize = fields[6], fields[11]
        name_start = pos + 110
        name = data[name_start:name_start + namesize - 1].decode()
        body = name_start + namesize + (-(110 + namesize) % 4)
        if name == "TRAILER!!!":
            return entries
        entries[name] = data[body:body + size]
        pos = body + size + (-size % 4)


def test_cpio_round_trips() -> None:
    archive = cpio_newc([("a", 0o100644, b"xyz"), ("dir", 0o40755, b""), ("b", 0o100755, b"")])
    assert _cpio_entries(archive) == {"a": b"xyz", "dir": b"", "b": b""}


def test_the_built_initramfs_holds_init_and_the_modules_in_load_order() -> None:
    image = find_image()
    assert image is not None
    entries = _cpio_entries(image.initramfs.read_bytes())
    assert entries["init"].startswith(b"\x7fELF")
    order = entries["modules"].decode().split()
    assert [os.path.basename(p).split(".ko")[0].replace("-", "_") for p in order] == list(MODULES)
    assert all(p.lstrip("/") in entries for p in order)


def test_the_kernel_boots_directly_by_its_pvh_entry() -> None:
    # Debian's bzImage is xz-compressed with a PVH note: the image holds the ELF itself.
    image = find_image()
    assert image is not None
    assert has_pvh_entry(image.kernel.read_bytes())
    assert not has_pvh_entry(b"\x7fELF" + b"\0" * 60)
    assert pvh_kernel(b"not a kernel") is None


def test_the_root_tree_has_no_resolver_and_the_mount_points() -> None:
    image = find_image()
    assert image is not None
    assert (image.rootfs / "etc/resolv.conf").read_bytes() == b""
    for sub in ("workspace", "proc", "sys", "dev", "tmp", "run", "home"):
        assert (image.rootfs / sub).is_dir()


def test_kvm_says_why_when_it_is_unusable() -> None:
    cap = probe.kvm()
    if not cap.available:
        assert cap.detail and cap.fix
    if os.path.isdir("/sys/module/kvm_pvm"):
        assert not cap.available and "PVM" in cap.detail


def test_auto_never_picks_microvm_and_the_name_selects_it() -> None:
    assert entry("microvm").auto_rank is None
    assert "microvm" in [e.name for e in REGISTRY]
    assert isinstance(select_backend("microvm", allow_unenforced=False), MicrovmBackend)


def test_tcg_is_only_ever_asked_for(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("FIRSTRUN_MICROVM_ACCEL", raising=False)
    assert MicrovmBackend().accel == "kvm"
    monkeypatch.setenv("FIRSTRUN_MICROVM_ACCEL", "tcg")
    assert MicrovmBackend().accel == "tcg"


def test_without_usable_kvm_the_kvm_backend_refuses(tmp_path) -> None:  # type: ignore[no-untyped-def]
    if probe.kvm().available:
        pytest.skip("KVM is usable here; the refusal needs a machine without it")
    with pytest.raises(SandboxUnavailable) as caught:
        MicrovmBackend(accel="kvm").start(make_profile(str(tmp_path)), proxy=None)
    assert caught.value.fix
