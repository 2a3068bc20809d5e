"""docs/CONTRACTS.md names exactly what the code offers: commands and flags, routes, verdict keys,
op families and campaign input fields. Adding one to the code without the doc fails here."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

from gpuyantra.campaign.records import CampaignInput
from gpuyantra.cli import build_parser
from gpuyantra.ops import all_ops
from gpuyantra.verifier.verdict import Verdict

DOC = (Path(__file__).parents[1] / "docs" / "CONTRACTS.md").read_text()


def section(number: int) -> str:
    return DOC.split(f"\n## {number}. ")[1].split("\n## ")[0]


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_and_flag_is_documented():
    cli = section(3)
    for name, sub in subcommands().items():
        row = next((line for line in cli.splitlines() if line.startswith(f"| `gpuyantra {name}")), None)
        assert row is not None, f"command {name} missing from section 3"
        flags = {o for a in sub._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
        missing = sorted(f for f in flags if f"{f}" not in row)
        assert missing == [], f"gpuyantra {name}: flags {missing} missing from its row"


def test_documented_commands_exist():
    documented = set(re.findall(r"^\| `gpuyantra (\w+)", section(3), flags=re.M))
    assert documented == set(subcommands())


def test_every_route_is_documented_and_every_documented_route_exists(tmp_path):
    from serving.app import ServeConfig, create_app

    app = create_app(ServeConfig(model="tiny-qwen2", device="cpu", state_dir=str(tmp_path)))
    routes = {(method.upper(), path) for path, item in app.openapi()["paths"].items() for method in item}
    documented = set(re.findall(r"^\| `(GET|POST|PUT|DELETE) (/[^`]*)`", section(5), flags=re.M))
    assert documented == routes


def test_every_verdict_key_is_documented_in_order():
    keys = list(Verdict(op=None, accepted=False, reward=-1).to_dict())
    text = section(4)
    positions = [text.find(f"`{key}`") for key in keys]
    assert -1 not in positions, [k for k, p in zip(keys, positions) if p == -1]
    assert positions == sorted(positions)


def test_every_op_family_is_documented():
    documented = set(re.findall(r"^\| `([a-z_]+)` \| `entry\(", section(2), flags=re.M))
    assert documented == {family.name for family in all_ops()}


def test_every_campaign_input_field_is_documented():
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", section(6), flags=re.M))
    assert documented == {f.name for f in dataclasses.fields(CampaignInput)}


def test_every_dashboard_route_is_documented_and_every_documented_route_exists():
    from gpuyantra.dashboard import Settings, create_app

    app = create_app(Settings(server_url="http://127.0.0.1:1", temporal_address="127.0.0.1:1"))
    routes = {(method, route.path) for route in app.routes for method in getattr(route, "methods", ()) or ()}
    routes -= {("HEAD", path) for _, path in routes}  # Starlette adds HEAD beside each GET
    documented = set(re.findall(r"^\| `(GET|POST|PUT|DELETE) (/[^`]*)`", section(7), flags=re.M))
    assert documented == routes
