"""The gvisor backend: gVisor's runsc, a user-space kernel per session (see ``backend``)."""
