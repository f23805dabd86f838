"""The agents readers use (Claude Code, ...) as processes inside the session.

Guarantee: each CLI runs from a pinned package that ``install`` put in a
cache outside every workspace and the session lends read-only; its stream is
read by a pure parser into the same trace events a built-in agent makes.
"""
