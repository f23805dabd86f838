"""Reading one configuration's row, or one cell, out of an audit's result."""

from __future__ import annotations

from firstrun.audit.battery import AuditResult, Cell, ConfigurationResult


def configuration_result(audit: AuditResult, name: str) -> ConfigurationResult:
    (found,) = [r for r in audit.results if r.configuration.name == name]
    return found


def cell(audit: AuditResult, config: str, action: str) -> Cell:
    (found,) = [c for c in configuration_result(audit, config).cells if c.action == action]
    return found
