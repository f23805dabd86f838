"""Container images built locally from Debian packages, for the docker backend."""
