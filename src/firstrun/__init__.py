"""firstrun: run documentation quickstarts inside an enforced sandbox."""

__version__ = "0.1.0"
