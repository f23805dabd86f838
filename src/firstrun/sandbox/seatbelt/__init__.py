"""The macOS Seatbelt backend: a profile generated from the policy (``profile``), the proxy
as one loopback port (``relay``), and sessions of ``sandbox-exec`` commands (``backend``)."""
