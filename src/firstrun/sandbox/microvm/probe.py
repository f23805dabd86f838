"""What this machine can run for the microvm backend, each with its fix.

Guarantee: KVM is reported usable only after the harness opened /dev/kvm,
the kernel answered the stable API version, and created a VM; when it is
not usable the capability says which of these failed and why (no device,
no permission, no hardware virtualisation in a guest whose host did not
enable nesting, or a /dev/kvm provided by PVM, which only runs guest kernels
built for it). QEMU and the boot image are reported the same way.
"""

from __future__ import annotations

import fcntl
import os
import shutil

from firstrun.fixes import apt_fix
from firstrun.sandbox.base import Capability
from firstrun.sandbox.microvm.image import find_image

QEMU = "qemu-system-x86_64"
_KVM_GET_API_VERSION = 0xAE00
_KVM_CREATE_VM = 0xAE01
_KVM_API_VERSION = 12


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def kvm(device: str = "/dev/kvm", modules: str = "/sys/module") -> Capability:
    """Whether ``device`` runs VMs here; the arguments exist so tests can point elsewhere."""
    flags = _cpu_flags()
    if not os.path.exists(device):
        if "hypervisor" in flags and not flags & {"vmx", "svm"}:
            return Capability(
                name="kvm", available=False,
                detail=f"no {device}: this machine is a virtual machine whose host does not "
                       "expose hardware virtualisation (nested virtualisation is off)",
                fix="enable nested virtualisation on the host (kvm_intel nested=1 or "
                    "kvm_amd nested=1, and pass vmx/svm to this VM)")
        return Capability(name="kvm", available=False, detail=f"no {device}",
                          fix="enable VT-x/AMD-V in the firmware and modprobe kvm_intel "
                              "(or kvm_amd)")
    if os.path.isdir(os.path.join(modules, "kvm_pvm")):
        return Capability(
            name="kvm", available=False,
            detail="/dev/kvm is provided by PVM (kvm_pvm, virtualisation without hardware "
                   "support): it runs only guest kernels built for PVM, and Debian's kernel "
                   "hangs at boot under it",
            fix="run on a host with hardware virtualisation (or nested VT-x/AMD-V), or set "
                "FIRSTRUN_MICROVM_ACCEL=tcg to emulate the guest's CPU (slow; recorded)")
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return Capability(name="kvm", available=False,
                          detail=f"cannot open {device}: {exc.strerror}",
                          fix="add the invoking user to the kvm group (usermod -aG kvm USER)")
    try:
        version = fcntl.ioctl(fd, _KVM_GET_API_VERSION)
        if version != _KVM_API_VERSION:
            return Capability(name="kvm", available=False,
                              detail=f"{device} answers API version {version}, not 12",
                              fix="use a kernel with the stable KVM API")
        vm = fcntl.ioctl(fd, _KVM_CREATE_VM, 0)
        os.close(vm)
    except OSError as exc:
        return Capability(name="kvm", available=False,
                          detail=f"{device} refused to create a VM: {exc.strerror}",
                          fix="check dmesg for kvm errors (virtualisation disabled in firmware?)")
    finally:
        os.close(fd)
    return Capability(name="kvm", available=True, detail=f"{device} creates VMs (API 12)")


def qemu() -> Capability:
    path = shutil.which(QEMU)
    return Capability(name="qemu", available=path is not None,
                      detail=path or f"{QEMU} not found",
                      fix=None if path else apt_fix("qemu-system-x86"))


def image() -> Capability:
    found = find_image()
    if found is None:
        return Capability(name="microvm_image", available=False,
                          detail="the micro-VM kernel, initramfs and root tree are not built",
                          fix="firstrun images build --microvm")
    return Capability(name="microvm_image", available=True,
                      detail=f"kernel {found.kernel_release} in {found.kernel.parent}")


def unusable(accel: str) -> Capability | None:
    """The first thing a session with ``accel`` would lack: QEMU, then KVM when it boots
    with KVM; None: nothing. What a start checks (it finds the image itself), the sweep
    having probed in full."""
    return next((c for c in (qemu(), kvm() if accel == "kvm" else None)
                 if c is not None and not c.available), None)


def probe(accel: str) -> tuple[Capability, ...]:
    """Every capability the backend needs with ``accel``; KVM's is reported either way."""
    caps = [qemu(), image(), kvm()]
    if accel == "tcg":
        caps.append(Capability(name="accel", available=True,
                               detail="tcg: the guest's CPU is emulated (FIRSTRUN_MICROVM_ACCEL)"))
        caps[2] = Capability(name="kvm", available=True,
                             detail=f"not used (tcg); KVM here: {caps[2].detail}")
    return tuple(caps)
