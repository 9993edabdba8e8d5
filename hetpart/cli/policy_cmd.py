"""``hetpart train-policy``: train the GNN planning policy (imitation of search, then MaskablePPO)."""

from __future__ import annotations

from pathlib import Path

import typer

from hetpart.cli.common import JsonFlag, emit_json

__all__ = ["register"]


def train_policy_command(
        config: Path = typer.Option(..., "--config", help="Training config YAML (experiments/configs/policy.yaml)."),
        replace_shipped: bool = typer.Option(False, "--replace-shipped", help="Let the config's 'out' be the "
                                             "shipped checkpoint (policies/checkpoints/policy.zip), which "
                                             "'--planner policy' plans with; refused without this flag."),
        json_out: bool = JsonFlag) -> None:
    """Train a planning policy; writes the checkpoint named in the config ('out'; a name without a suffix gets
    '.zip', as stable-baselines3 saves it; without 'out', policy.zip in the run's folder runs/<run>/; the
    summary names the file written). Plan with it by `hetpart plan --planner policy --policy-checkpoint FILE`
    (without that option the shipped policy plans). Progress goes to stderr; with --json stdout holds the
    summary alone."""
    from hetpart.experiments.train_policy import load_config, train_policy

    summary = train_policy(load_config(config, replace_shipped=replace_shipped), replace_shipped=replace_shipped)
    if json_out:
        emit_json(summary)
        return
    print(f"trained {summary['timesteps']} steps in {summary['wall_s']:.0f} s; checkpoint {summary['checkpoint']} "
          f"(run {summary['run']}); plan with it: hetpart plan --planner policy --policy-checkpoint "
          f"{summary['checkpoint']} ...")


def register(app: typer.Typer) -> None:
    app.command("train-policy")(train_policy_command)
