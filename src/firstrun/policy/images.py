"""Container image references: exactly the grammar Docker accepts, checked before Docker sees one.

Guarantee: ``image_reference_error`` returns None only for a string that the
reference grammar of Docker's distribution library accepts (``name[:tag][@digest]``,
a lowercase path, an optional registry host and port, a name of at most 255
characters), so a reference that reaches a ``docker`` argv is never read as an
option (``--privileged``, ``-v/:/host``) or as anything but one image.
Pure: stdlib only, no I/O.
"""

from __future__ import annotations

import re

# Transcribed from the published regular expressions of Docker's distribution
# library (reference/regexp.go).
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_NAME = rf"(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::{_TAG})?(?:@{_DIGEST})?", re.ASCII)
_NAME_MAX = 255


def image_reference_error(reference: str) -> str | None:
    """Why ``reference`` is not an image reference Docker accepts; None when it is."""
    match = _REFERENCE.fullmatch(reference)
    if match is None:
        return (f"{reference!r} is not an image reference (NAME[:TAG][@DIGEST], a lowercase "
                "name such as python:3.11-slim or registry.example:5000/team/tool:1.2)")
    if len(match["name"]) > _NAME_MAX:
        return f"{reference!r}: an image name is at most {_NAME_MAX} characters"
    return None
