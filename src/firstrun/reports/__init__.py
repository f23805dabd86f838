"""Reports: what a person or a CI system reads about runs, rendered from saved data only.

Guarantee: nothing here touches a live run. Every report is a pure function
of saved ``RunRecord``s (``results.json``) or of a saved ``trace.jsonl``, so
what is reported is exactly what was recorded, and a report can be rebuilt
later from the same files.
"""
