"""Small typed inputs and outputs shared by the workflow and its activities (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CampaignInput:
    """docs/CONTRACTS.md section 6. Every field but server_url is optional."""

    server_url: str
    ops: list[str] | None = None
    min_reward: int = 3
    max_iterations: int = 6
    require_approval: bool = False
    device: str | None = None  # where candidates are verified; None = the GPU worker's own device
    max_targets: int = 3  # when ops is not given: the top targets of the profile


@dataclass
class ServerCall:
    server_url: str


@dataclass
class RetrieveInput:
    target: dict[str, Any]
    hardware: str


@dataclass
class RetrieveResult:
    candidates: list[dict[str, Any]] = field(default_factory=list)  # id, op, reward, pulls, distance
    seed: dict[str, Any] | None = None  # the skill UCB1 chose: id, source, strategy


@dataclass
class WriteInput:
    target: dict[str, Any]
    hardware: str
    iteration: int
    seed: dict[str, Any] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class WriteResult:
    source: str
    strategy: dict[str, Any]
    author: str
    notes: str = ""


@dataclass
class VerifyInput:
    campaign_id: str
    target: dict[str, Any]
    iteration: int
    source: str
    device: str | None = None


@dataclass
class OutcomeInput:
    skill_id: str
    reward: float


@dataclass
class LearnInput:
    campaign_id: str
    target: dict[str, Any]
    hardware: str
    iteration: int
    source: str
    strategy: dict[str, Any]
    verdict: dict[str, Any]
    author: str


@dataclass
class DeployInput:
    server_url: str
    target: dict[str, Any]
    source: str
    attestation: dict[str, Any] | None = None  # the verdict's signed record of exactly `source`


@dataclass
class RollbackInput:
    server_url: str
    swap_id: str
