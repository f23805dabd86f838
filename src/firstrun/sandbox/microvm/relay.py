"""One guest connection to the proxy: user-mode networking's ``guestfwd`` command.

Guarantee: bytes go only between the relay's stdin (the guest's TCP
connection, a socket QEMU hands over) and the harness's per-session relay
socket, named in argv[1]; the harness accepts that socket only from the
session's QEMU uid and joins it to the egress proxy.
"""

from __future__ import annotations

# Run as ``python3 -I -S -c PROGRAM NAME`` by QEMU, as QEMU's uid, which may reach no file
# of the harness's; QEMU cuts a forward's command line short, so the program stays a few
# lines of stdlib.
PROGRAM = """import socket as s,sys,threading as t
u=s.socket(1);u.connect("\\0"+sys.argv[1]);g=s.socket(fileno=0)
def p(a,b):
 while d:=a.recv(65536):b.sendall(d)
 b.shutdown(1)
t.Thread(target=p,args=(g,u)).start();p(u,g)"""


def command(python: str, name: str) -> tuple[str, ...]:
    """The forward's argv, single-quoted for the shell-like split QEMU applies to it."""
    return (python, "-I", "-S", "-c", f"'{PROGRAM}'", name)
