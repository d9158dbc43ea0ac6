"""What a check finds, and the context every check reads and adds to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gateway.cli.doctor.probes import Probes
from gateway.config import Config

Level = Literal["ok", "info", "warning", "problem"]
# An address in users' terms for the examples in fixes.
LAN_EXAMPLE = "192.168.1.20"


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's outcome: ``problem`` fails ``doctor`` (exit 1); the others do not."""

    level: Level
    topic: str
    message: str
    fix: str = ""


@dataclass(slots=True)
class Context:
    """What every check reads (the settings, whether in a container, the probes) and adds to."""

    config: Config
    container: bool
    probes: Probes
    findings: list[Finding] = field(default_factory=list)

    def add(self, level: Level, topic: str, message: str, fix: str = "") -> None:
        self.findings.append(Finding(level, topic, message, fix))
