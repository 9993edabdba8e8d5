"""``hetpart loop``: the closed loop (policy proposes, runtime measures, corrected model refits, policy trains on)."""

from __future__ import annotations

from typing import Optional

import typer

from hetpart.cli.common import JsonFlag, emit_json

__all__ = ["register"]


def loop_command(
        cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster YAML or catalog name (--ground "
                                              "emulated or real; not with --ground cpu, which plans for this machine)."),
        model: str = typer.Option(..., "--model", "-m", help="Model (catalog name, HF config, python:...); GPT-shaped: the loop's runs build hetpart's own GPT."),
        iterations: int = typer.Option(3, "--iterations", help="Loop iterations."),
        runs_per_iteration: int = typer.Option(4, "--runs-per-iteration", help="Measured runs per iteration."),
        out: Optional[str] = typer.Option(None, "--out", help="State, run records, corrections and policy checkpoints "
                                          "(default: a new runs/loop/loop__SEED__TIME); give it again to resume."),
        ground: str = typer.Option("emulated", "--ground", help="emulated: the cluster on local CPU processes with "
                                   "effects the simulator lacks; cpu: this machine's CPU processes, no emulation; real: "
                                   "--cluster is this machine's GPUs (no emulation, NCCL between GPUs; refused where they are missing)."),
        global_batch: int = typer.Option(32, "--global-batch", help="Global batch of the plans (samples)."),
        seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Sequence length (default: the model's, at most 1024)."),
        steps: int = typer.Option(2, "--steps", help="Measured steps per run (after 1 warm-up step)."),
        repeats: int = typer.Option(2, "--repeats", help="Final runs of each of the two compared plans (interleaved)."),
        race: int = typer.Option(2, "--race", help="Best measured plans that run once more each before the loop's plan "
                                 "is chosen, beside the simulator's plan, which a challenger displaces only on three "
                                 "runs each, every one faster (1: no race and no such guard: the best median so far "
                                 "wins)."),
        policy_timesteps: int = typer.Option(512, "--policy-timesteps", help="PPO steps per iteration on the corrected reward, rounded up to whole rollouts of 128 (2 environments x 64 steps; 0: the policy is not trained)."),
        seed: int = typer.Option(0, "--seed", help="Seed of sampling, held-out choice and training."),
        tracker: str = typer.Option("wandb,tensorboard", "--tracker", help="wandb (offline), tensorboard, both, or null."),
        json_out: bool = JsonFlag) -> None:
    """Run the closed loop on CLUSTER for MODEL; progress on stderr, results (or --json) on stdout."""
    import sys

    from hetpart.experiments.loop import LoopConfig, errors_line, run_loop

    from hetpart.errors import PlanError

    if cluster is not None and ground == "cpu":  # it would be ignored: the cpu ground measures this machine
        raise PlanError(f"--cluster: {cluster} is not used by --ground cpu, which plans for this machine's own "
                        "cluster (its CPU processes, measured, written to DIR/cpu-cluster.yaml); leave --cluster "
                        "out, or give --ground emulated to emulate this cluster")
    if cluster is None and ground != "cpu":
        raise PlanError("--cluster: missing; give a cluster YAML or catalog name (or --ground cpu for this machine)")
    if out is None:
        from hetpart.experiments.tracking import run_name

        out = f"runs/loop/{run_name('loop', seed)}"
    cfg = LoopConfig(cluster=cluster or "this-machine", model=model, iterations=iterations, runs_per_iteration=runs_per_iteration,
                     ground=ground, out=out, global_batch=global_batch, seq_len=seq_len, steps=steps,
                     repeats=repeats, race=race, policy_timesteps=policy_timesteps, seed=seed, tracker=tracker)
    start = __import__("time").time()

    def say(text: str) -> None:
        print(f"hetpart loop [{__import__('time').time() - start:5.0f}s] {text}", file=sys.stderr, flush=True)

    result = run_loop(cfg, say)
    if json_out:
        emit_json(result)
        return
    print(errors_line(result))
    print(f"measured tokens/s ({result['repeats']} runs each): simulator plan "
          f"{result['measured_tokens_per_s_simulator_plan']:,.0f} ± {result['tokens_per_s_std_simulator_plan']:,.0f}, "
          f"loop plan {result['measured_tokens_per_s_loop_plan']:,.0f} ± {result['tokens_per_s_std_loop_plan']:,.0f}")


def register(app: typer.Typer) -> None:
    app.command("loop")(loop_command)
