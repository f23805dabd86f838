/* The guest's first process: load the drivers, mount the read-only root, start the agent.

   Guarantee: either the agent runs as pid 1 on the read-only 9p root, or the
   guest powers off at once (the host sees the channel close, never a hang).
   Kept to what a static binary must do before Python can run: the agent
   itself (sent by the host over the channel) sets up everything else.

   /modules lists the driver modules in load order (dependencies first);
   the build writes it next to the modules in the initramfs. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Waits for the channel's port (the host announces it after the driver
   loads), reads the agent's source from it (a decimal length line, then
   the source) and runs it with the channel's fd. */
static const char BOOT[] =
    "import glob, os, time\n"
    "for _ in range(3000):\n"
    "    ports = glob.glob('/dev/vport*p1')\n"
    "    if ports:\n"
    "        break\n"
    "    time.sleep(0.01)\n"
    "fd = os.open(ports[0], os.O_RDWR)\n"
    "head = b''\n"
    "while not head.endswith(b'\\n'):\n"
    "    head += os.read(fd, 1)\n"
    "size = int(head)\n"
    "src = b''\n"
    "while len(src) < size:\n"
    "    src += os.read(fd, size - len(src))\n"
    "exec(compile(src, 'firstrun-agent', 'exec'), {'__name__': 'firstrun_agent', 'CHANNEL_FD': fd})\n";

/* The kernel found no /dev/console in the initramfs: attach it now, so a
   failure below is reported on the serial console. */
static void console(void) {
    int fd = open("/dev/console", O_RDWR | O_NOCTTY);
    if (fd < 0) return;
    dup2(fd, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    if (fd > 2) close(fd);
}

static void die(const char *what) {
    perror(what);
    reboot(RB_POWER_OFF);
    _exit(1);
}

int main(void) {
    char line[256];
    FILE *order;
    if (mount("devtmpfs", "/dev", "devtmpfs", 0, NULL)) die("mount /dev");
    console();
    order = fopen("/modules", "r");
    if (!order) die("/modules");
    while (fgets(line, sizeof line, order)) {
        int fd;
        line[strcspn(line, "\n")] = 0;
        fd = open(line, O_RDONLY | O_CLOEXEC);
        if (fd < 0) die(line);
        if (syscall(SYS_finit_module, fd, "", 0)) die(line);
        close(fd);
    }
    fclose(order);
    if (mount("root", "/root", "9p", MS_RDONLY | MS_NODEV,
              "trans=virtio,version=9p2000.L,cache=loose,msize=262144"))
        die("mount root");
    if (umount2("/dev", MNT_DETACH)) die("umount /dev");
    if (chdir("/root")) die("chdir /root");
    if (mount(".", "/", NULL, MS_MOVE, NULL)) die("move root");
    if (chroot(".")) die("chroot");
    if (chdir("/")) die("chdir /");
    if (mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID | MS_NOEXEC, NULL)) die("mount /dev");
    execl("/usr/bin/python3", "python3", "-I", "-S", "-c", BOOT, (char *)0);
    die("exec /usr/bin/python3");
    return 1;
}
