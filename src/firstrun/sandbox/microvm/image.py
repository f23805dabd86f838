"""The micro-VM's boot files: a Debian kernel, a tiny initramfs, and a root tree.

Guarantee: ``build_image`` assembles, offline apart from the Debian archive
the root tree comes from, everything a micro-VM boots: a copy of the installed
Debian kernel, an initramfs holding only a static ``init`` (``init.c``) and
the modules it loads, and the root tree of the ``firstrun/python`` image's
debootstrap tarball. An image is published whole (built under a temporary
name, then renamed), so ``find_image`` never returns a half-built one.
"""

from __future__ import annotations

import glob
import lzma
import os
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from firstrun.errors import SandboxError, SandboxUnavailable
from firstrun.fixes import apt_fix
from firstrun.images.build import PYTHON, SUITE, default_cache_dir, rootfs_tarball

# The drivers the guest needs, in load order (each after what it depends on):
# virtio over MMIO (the microvm machine has no PCI), 9p for the root and the
# workspace, virtio-serial for the agent's channel, virtio-net for the proxy.
MODULES = ("virtio_ring", "virtio", "virtio_mmio", "netfs", "fscache", "9pnet", "9pnet_virtio",
           "9p", "virtio_console", "failover", "net_failover", "virtio_net")

INIT_SOURCE = Path(__file__).with_name("init.c")


@dataclass(frozen=True, kw_only=True)
class MicrovmImage:
    kernel: Path
    initramfs: Path
    rootfs: Path
    kernel_release: str

    def sizes(self) -> dict[str, int]:
        """Bytes on disk of each part (the root tree summed over its regular files)."""
        total = 0
        for dirpath, _, files in os.walk(self.rootfs):
            for name in files:
                st = os.lstat(os.path.join(dirpath, name))
                total += st.st_size if not os.path.islink(os.path.join(dirpath, name)) else 0
        return {"kernel": self.kernel.stat().st_size, "initramfs": self.initramfs.stat().st_size,
                "rootfs": total}


def image_dir(cache_dir: Path | None = None) -> Path:
    # Named by the recipe's digest, so a root tree from an older recipe is rebuilt.
    return (cache_dir or default_cache_dir()) / f"microvm-{PYTHON.key}-{SUITE}-{PYTHON.digest}"


def find_image(cache_dir: Path | None = None) -> MicrovmImage | None:
    """The published image, or None when it was never built."""
    top = image_dir(cache_dir)
    try:
        release = (top / "release").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    image = MicrovmImage(kernel=top / "kernel", initramfs=top / "initramfs.cpio",
                         rootfs=top / "rootfs", kernel_release=release)
    if image.kernel.is_file() and image.initramfs.is_file() and (image.rootfs / "usr").is_dir():
        return image
    return None


def host_kernel(boot: str = "/boot", modules: str = "/lib/modules") -> tuple[str, str] | None:
    """(vmlinuz path, release) of the newest installed Debian kernel with its modules."""
    found = []
    for path in glob.glob(os.path.join(boot, "vmlinuz-*")):
        release = os.path.basename(path)[len("vmlinuz-"):]
        if os.path.isfile(os.path.join(modules, release, "modules.dep")):
            found.append((path, release))
    return max(found, key=lambda f: [int(p) if p.isdigit() else 0
                                     for p in f[1].replace("-", ".").split(".")]) if found else None


def module_files(release: str, modules: str = "/lib/modules") -> list[str]:
    """Host paths of ``MODULES`` for ``release``, in load order; refuses one that is missing."""
    base = os.path.join(modules, release)
    by_name: dict[str, str] = {}
    with open(os.path.join(base, "modules.dep"), encoding="utf-8") as f:
        for line in f:
            rel = line.split(":", 1)[0]
            name = os.path.basename(rel).split(".ko", 1)[0].replace("-", "_")
            by_name[name] = os.path.join(base, rel)
    missing = [m for m in MODULES if m not in by_name]
    if missing:
        raise SandboxUnavailable(f"kernel {release} has no module(s) {', '.join(missing)}",
                                 who="microvm", fix="install Debian's linux-image-amd64")
    found = [by_name[m] for m in MODULES]
    compressed = [p for p in found if not p.endswith(".ko")]
    if compressed:
        raise SandboxUnavailable(f"compressed kernel modules are not supported: {compressed[0]}",
                                 who="microvm", fix="install Debian bookworm's linux-image-amd64")
    return found


_ELF_MAGIC = b"\x7fELF"
_PT_NOTE = 4
_XEN_ELFNOTE_PHYS32_ENTRY = 18


def has_pvh_entry(elf: bytes) -> bool:
    """Whether a 64-bit ELF kernel carries the PVH entry point QEMU boots it by."""
    if elf[:4] != _ELF_MAGIC or elf[4] != 2:
        return False
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for i in range(phnum):
        kind, _, offset, _, _, size = struct.unpack_from("<IIQQQQ", elf, phoff + i * phentsize)
        if kind != _PT_NOTE:
            continue
        pos, end = offset, offset + size
        while pos + 12 <= end:
            namesz, descsz, note_type = struct.unpack_from("<III", elf, pos)
            name = elf[pos + 12:pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and note_type == _XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


def pvh_kernel(bzimage: bytes) -> bytes | None:
    """The uncompressed ELF kernel inside a bzImage, if it can be booted directly (PVH).

    Booting it skips the decompressor and the option ROM that loads a bzImage,
    as Firecracker does; Debian compresses with xz, which the stdlib reads.
    None when the payload is in another format or has no PVH entry.
    """
    start = bzimage.find(b"\xfd7zXZ\x00")
    if start < 0:
        return None
    try:
        elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(bzimage[start:])
    except lzma.LZMAError:
        return None
    return elf if has_pvh_entry(elf) else None


# The initramfs is written here (the newc cpio format is a fixed header per file), so no
# cpio or initramfs-tools is needed.
def cpio_newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A ``newc`` cpio archive of (name, mode, data), as the kernel unpacks an initramfs."""
    out = bytearray()

    def pad() -> None:
        out.extend(b"\0" * (-len(out) % 4))

    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        encoded = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        out += b"070701" + b"".join(b"%08X" % v for v in fields) + encoded
        pad()
        out += data
        pad()
    return bytes(out)


def initramfs(init_binary: bytes, modules: list[str]) -> bytes:
    entries: list[tuple[str, int, bytes]] = [("dev", 0o40755, b""), ("root", 0o40755, b""),
                                            ("lib", 0o40755, b""), ("init", 0o100755, init_binary)]
    order = []
    for path in modules:
        name = f"lib/{os.path.basename(path)}"
        entries.append((name, 0o100644, Path(path).read_bytes()))
        order.append("/" + name)
    entries.append(("modules", 0o100644, ("\n".join(order) + "\n").encode()))
    return cpio_newc(entries)


def _compile_init(work: str) -> bytes:
    out = os.path.join(work, "init")
    try:
        done = subprocess.run(["gcc", "-static", "-Os", "-Wall", "-o", out, str(INIT_SOURCE)],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise SandboxUnavailable(f"cannot run gcc: {exc}", who="microvm",
                                 fix=apt_fix("gcc", "libc6-dev")) from exc
    if done.returncode != 0:
        raise SandboxError(f"compiling the guest init failed: {done.stderr[-1500:]}",
                           who="microvm")
    return Path(out).read_bytes()


def _prepare_rootfs(root: str) -> None:
    """No resolver in the guest, and mount points for what the agent mounts."""
    resolv = os.path.join(root, "etc/resolv.conf")
    if os.path.lexists(resolv):
        os.unlink(resolv)
    with open(resolv, "w", encoding="utf-8"):
        pass
    for sub in ("proc", "sys", "dev", "tmp", "run", "root", "home", "workspace"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)


def build_image(*, cache_dir: Path | None = None,
                log: Callable[[str], None] = lambda _: None) -> MicrovmImage:
    """Build the image unless it is present; return it."""
    found = find_image(cache_dir)
    if found is not None:
        log(f"microvm: present ({found.kernel_release})")
        return found
    kernel = host_kernel()
    if kernel is None:
        raise SandboxUnavailable("no Debian kernel with modules in /boot and /lib/modules",
                                 who="microvm", fix=apt_fix("linux-image-amd64"))
    vmlinuz, release = kernel
    modules = module_files(release)
    cache = cache_dir or default_cache_dir()
    tarball = rootfs_tarball(PYTHON, cache, log)
    top = image_dir(cache_dir)
    work = tempfile.mkdtemp(prefix=f".{top.name}-", dir=cache)
    try:
        log(f"microvm: kernel {release}, initramfs with {len(modules)} modules")
        init = _compile_init(work)
        Path(work, "initramfs.cpio").write_bytes(initramfs(init, modules))
        os.unlink(os.path.join(work, "init"))
        # Copied, so a kernel upgrade on the host cannot leave the cached modules and kernel
        # mismatched; unpacked to its ELF when it has a PVH entry, so it boots without a
        # decompressor.
        bzimage = Path(vmlinuz).read_bytes()
        elf = pvh_kernel(bzimage)
        log("microvm: kernel unpacked for direct (PVH) boot" if elf is not None
            else "microvm: kernel has no PVH entry; booting the compressed image")
        Path(work, "kernel").write_bytes(elf if elf is not None else bzimage)
        root = os.path.join(work, "rootfs")
        os.mkdir(root)
        log("microvm: root tree ...")
        done = subprocess.run(["tar", "--numeric-owner", "-C", root, "-xf", str(tarball)],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SandboxError(f"extracting {tarball} failed: {done.stderr[-1500:]}",
                               who="microvm")
        _prepare_rootfs(root)
        Path(work, "release").write_text(release + "\n", encoding="utf-8")
        # The tree is read through 9p by qemu running as a per-session uid:
        # the top must be reachable by anyone (it holds nothing secret).
        os.chmod(work, 0o755)
        if top.exists():
            shutil.rmtree(top)
        os.replace(work, top)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for stale in top.parent.glob(f"microvm-{PYTHON.key}-{SUITE}*"):
        if stale != top and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    image = find_image(cache_dir)
    if image is None:
        raise SandboxError(f"the microvm image in {top} is incomplete after building",
                           who="microvm")
    log(f"microvm: built in {top}")
    return image
