"""Training and evaluating the surrogate: typed YAML config, ranking term, checkpoints and resume.

The loss per scenario batch (all plans of one scenario):

* squared error of the log step time (the simulator's);
* a pairwise ranking term: a hinge on every ordered pair of the scenario's plans (TpuGraphs'
  pairwise hinge), so plans are ordered as the simulator orders them;
* leaf terms: squared log error of the unit and ring seconds against the simulator's own unit costs
  and all-reduce times (the decomposition is supervised where it is cheap to, as NeuSight trains on
  kernels);
* Gaussian negative log likelihood of the variance head (with the mean held fixed).

Metrics go to a ``log(metrics, step)`` callback that the CLI connects to the experiment tracker
(this package imports no tracker).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from hetpart.errors import SpecError

from hetpart.costmodel.learned.surrogate import Surrogate, SurrogateConfig, to_tensors

__all__ = ["TrainConfig", "load_train_config", "train", "resolve_device", "evaluate_records", "kendall_tau", "save_checkpoint",
           "load_checkpoint"]


@dataclass(frozen=True)
class TrainConfig:
    """`hetpart costmodel train --config FILE` (YAML keys, all optional)."""

    dataset: str = "runs/costmodel/dataset.pt"
    """Data set written by `hetpart costmodel dataset`."""
    out: str = "runs/costmodel/surrogate.pt"
    """Checkpoint written at the end (and every epoch, for resume)."""
    epochs: int = 12
    """Passes over the training scenarios."""
    lr: float = 3e-3
    """Adam learning rate (cosine decay to 5% over the epochs)."""
    rank_weight: float = 0.1
    """Weight of the pairwise ranking term."""
    leaf_weight: float = 0.5
    """Weight of the leaf (unit and ring seconds) terms."""
    rank_temperature: float = 0.03
    """Largest predicted log-time gap the ranking hinge asks of a pair (it asks half the true gap)."""
    adam_eps: float = 1e-2
    """Adam's epsilon. Large on purpose: the surrogate starts at the analytic composition, where the
    gradients on simulator labels are rounding noise; a small epsilon would turn that noise into
    full-size steps (a random walk away from the composition), a large one keeps steps in proportion
    to the gradient until there is a real residual to learn."""
    hidden: int = 64
    edge_hidden: int = 32
    seed: int = 0
    threads: int = 2
    """torch CPU threads."""
    time_budget_s: float = 1500.0
    """Stop (and save) when training has run this long."""
    resume: bool = True
    """Continue from ``out`` when it holds an unfinished run of the same config."""

    def __post_init__(self) -> None:
        for name in ("epochs", "threads"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise SpecError(f"train config: {name}: expected a whole number >= 1, got {getattr(self, name)!r}")
        if not self.lr > 0:
            raise SpecError(f"train config: lr: expected a positive number, got {self.lr!r}")


def load_train_config(path: str | Path | None) -> TrainConfig:
    """Read a YAML file of :class:`TrainConfig` keys; unknown keys are refused."""
    if path is None:
        return TrainConfig()
    from hetpart._yaml import load_yaml_file

    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: no such config file; give a YAML file of {', '.join(f.name for f in fields(TrainConfig))}")
    # the reader clusters and suites use: UTF-8, no repeated keys or aliases, at most 1 MiB
    data = load_yaml_file(SpecError, path, "the cost-model training config (a YAML file)") or {}
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of training settings")
    known = {f.name: f for f in fields(TrainConfig)}
    for key in data:
        if key not in known:
            raise SpecError(f"{path}: {key}: unknown setting; known: {', '.join(known)}")
    for key, value in data.items():
        if known[key].type in ("float", float):
            data[key] = _float_setting(path, key, value, known[key].default)
    try:
        return TrainConfig(**data)
    except TypeError as exc:
        raise SpecError(f"{path}: {exc}") from None
    except SpecError as exc:  # its checks say "train config:": name the file the value came from
        raise SpecError(str(exc).replace("train config:", f"{path}:", 1)) from None


def _float_setting(path: Path, key: str, value: Any, default: float) -> float:
    """A float setting; YAML 1.1 reads ``3e-3`` (no dot) as text, which is taken when it reads as a number."""
    from hetpart import _validate

    number = _validate.yaml_float(value)
    if number is None:
        raise SpecError(f"{path}: {key}: expected a number, got {value!r}; write a number (the default is {key}: {default!r})")
    return number


def kendall_tau(a, b) -> float:
    """Kendall's tau-a between two sequences (ties count as neither)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    s = np.sign(a[:, None] - a[None, :]) * np.sign(b[:, None] - b[None, :])
    iu = np.triu_indices(len(a), 1)
    c, d = (s[iu] > 0).sum(), (s[iu] < 0).sum()
    return float((c - d) / max(1, c + d))


def _loss(model: Surrogate, tb, y: torch.Tensor, cfg: TrainConfig) -> tuple[torch.Tensor, dict[str, float]]:
    mu, log_var = model(tb)
    mse = ((mu - y) ** 2).mean()
    diff = y[:, None] - y[None, :]
    clear = diff.abs() > 1e-3
    # pairwise hinge (TpuGraphs' baseline loss): a pair costs when the predicted gap falls short of half
    # the true one (capped at the temperature) in the right direction; the true gap itself, rounding
    # included, costs nothing
    margin = (0.5 * diff.abs()).clamp(max=cfg.rank_temperature)
    pair = torch.relu(margin - torch.sign(diff) * (mu[:, None] - mu[None, :])) / cfg.rank_temperature
    rank = (pair * clear).sum() / clear.sum().clamp(min=1)
    nll = 0.5 * (torch.exp(-log_var) * (mu.detach() - y) ** 2 + log_var).mean()
    pf, pb = model.unit_times(tb)
    unit = torch.stack([pf.diff(dim=1), pb.diff(dim=1)], -1)
    label = tb.unit_label
    ok = label > 0
    leaf = ((torch.log(unit.clamp(min=1e-15)) - torch.log(label.clamp(min=1e-15))) ** 2)[ok].mean()
    if tb.seg_x.shape[0]:
        t, _ = model.ring_times(tb)
        leaf = leaf + ((torch.log(t.clamp(min=1e-15)) - torch.log(tb.seg_label.clamp(min=1e-15))) ** 2).mean()
    total = mse + cfg.rank_weight * rank + cfg.leaf_weight * leaf + 0.05 * nll
    return total, {"mse": mse.item(), "rank": rank.item(), "leaf": leaf.item(), "nll": nll.item()}


def resolve_device(device: str) -> torch.device:
    """``auto`` (CUDA when available, else the CPU), ``cuda`` (refused without a GPU) or ``cpu``."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise SpecError(f"--device: {device!r}: use auto, cuda or cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecError(f"--device {device}: torch sees no CUDA device here; use --device cpu (or auto)")
    return torch.device(device)


def _prepare(records: list[dict[str, Any]], device: torch.device | str = "cpu") -> list[tuple]:
    out = []
    for rec in records:
        tb = to_tensors(rec["batch"], device)
        tb["unit_label"] = torch.from_numpy(np.asarray(rec["batch"].unit_label)).float().to(device)
        tb["seg_label"] = torch.from_numpy(np.asarray(rec["batch"].seg_label)).float().to(device)
        out.append((rec, tb, torch.tensor(rec["log_step_s"], dtype=torch.float32, device=device)))
    return out


def evaluate_records(model: Surrogate, records: list[dict[str, Any]]) -> dict[str, float]:
    """Mean step-time error (%), mean and spread of Kendall tau per scenario, top-1 regret (%); a figure with
    nothing to measure it on (no records; tau without a scenario of five plans) is None, never 0 or NaN."""
    if not records:
        return {"error_pct_mean": None, "error_pct_p90": None, "tau_mean": None, "tau_std": None,
                "top1_regret_pct": None, "scenarios": 0, "plans": 0}
    errs, taus, regret = [], [], []
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        for _, tb, y in _prepare(records, device):
            mu, _ = model(tb)
            mu, y = mu.cpu(), y.cpu()
            e = (torch.exp(mu - y) - 1).abs()
            errs.append(e)
            if len(y) >= 5:
                taus.append(kendall_tau(mu.numpy(), y.numpy()))
            regret.append(float(torch.exp(y[int(mu.argmin())] - y.min()) - 1))
    e = torch.cat(errs)
    return {"error_pct_mean": float(e.mean() * 100), "error_pct_p90": float(e.quantile(0.9) * 100),
            "tau_mean": float(np.mean(taus)) if taus else None,
            "tau_std": float(np.std(taus)) if taus else None,
            "top1_regret_pct": float(np.mean(regret) * 100),
            "scenarios": len(records), "plans": int(e.numel())}


def save_checkpoint(path: str | Path, model: Surrogate, extra: dict[str, Any]) -> None:
    """Write the model weights (float32), its config and ``extra`` (training state, metrics, ranges)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": "hetpart-surrogate/1", "model_config": asdict(model.config),
                "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()}, **extra}, path)


def load_checkpoint(path: str | Path) -> tuple[Surrogate, dict[str, Any]]:
    """The surrogate and the checkpoint's other entries."""
    data = torch.load(path, weights_only=False, map_location="cpu")
    if data.get("format") != "hetpart-surrogate/1":
        raise SpecError(f"{path}: not a hetpart surrogate checkpoint; train one with 'hetpart costmodel train'")
    model = Surrogate(SurrogateConfig(**data["model_config"]))
    model.load_state_dict(data["state_dict"])
    model.eval()
    return model, data


def input_ranges(records: list[dict[str, Any]]) -> dict[str, list[list[float]]]:
    """Per input block, the per-feature [min, max] seen in training (the OOD check's reference)."""
    out = {}
    for key in ("unit_x", "p2p_x", "seg_x", "plan_x"):
        arrays = [getattr(r["batch"], key).reshape(-1, getattr(r["batch"], key).shape[-1]) for r in records
                  if getattr(r["batch"], key).size]
        stacked = np.concatenate(arrays, 0)
        out[key] = [stacked.min(0).tolist(), stacked.max(0).tolist()]
    return out


def train(cfg: TrainConfig, records: list[dict[str, Any]], log: Callable[[dict[str, float], int], None] | None = None,
          progress: Callable[[int, int], None] | None = None,
          heldout: dict[str, Any] | None = None, device: str = "cpu") -> tuple[Surrogate, dict[str, Any]]:
    """Train on the ``train`` split, report on ``val`` and ``test``; checkpoints to ``cfg.out`` each epoch.

    ``heldout`` (the data set's held-out families and shapes) is stored in the checkpoint as it is.
    ``device``: ``cpu``, ``cuda`` or ``auto`` (:func:`resolve_device`). A run is reproducible on one
    device (seeded initialisation and scenario order; on CUDA, deterministic kernels where torch has
    them); CPU and CUDA runs differ in the last bits of their sums, so their checkpoints differ slightly.
    The returned model is on the CPU."""
    dev = resolve_device(device)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    if dev.type == "cuda":
        torch.cuda.manual_seed_all(cfg.seed)
        torch.use_deterministic_algorithms(True, warn_only=True)
    rng = random.Random(cfg.seed)
    train_recs = [r for r in records if r["split"] == "train"]
    if not train_recs:
        raise SpecError(f"{cfg.dataset}: no training scenarios; build a larger data set")
    data = _prepare(train_recs, dev)
    model = Surrogate(SurrogateConfig(cfg.hidden, cfg.edge_hidden)).to(dev)
    opt = torch.optim.Adam(model.parameters(), cfg.lr, eps=cfg.adam_eps)
    total = cfg.epochs * len(data)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    start_epoch, step = 0, 0
    out = Path(cfg.out)
    if cfg.resume and out.is_file():
        saved = torch.load(out, weights_only=False, map_location=dev)
        if saved.get("train_config") == asdict(cfg) and saved.get("epoch", cfg.epochs) < cfg.epochs:
            model.load_state_dict(saved["state_dict"])
            opt.load_state_dict(saved["optimizer"])
            sched.load_state_dict(saved["scheduler"])
            start_epoch, step = saved["epoch"], saved["step"]
    ranges = input_ranges(train_recs)
    from hetpart.costmodel.learned.coverage import training_scale

    scale = training_scale(train_recs)  # the predictor flags a model or cluster outside it
    began = time.time()
    epoch = start_epoch
    for epoch in range(start_epoch, cfg.epochs):
        model.train()
        rng.shuffle(data)
        for _, tb, y in data:
            loss, parts = _loss(model, tb, y, cfg)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            sched.step()
            step += 1
            if log and step % 20 == 0:
                log({f"costmodel/train/{k}": v for k, v in parts.items()}, step)
            if progress:
                progress(step, total)
        val = evaluate_records(model, [r for r in records if r["split"] == "val"])
        if log:  # figures a split cannot give (None) are not logged
            log({f"costmodel/val/{k}": v for k, v in val.items() if v is not None}, step)
        save_checkpoint(out, model, {"train_config": asdict(cfg), "epoch": epoch + 1, "step": step,
                                     "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                                     "input_ranges": ranges, "train_scale": scale})
        if time.time() - began > cfg.time_budget_s:
            break  # the time budget is spent: the final checkpoint below ends the run (no resume)
    report = {split: evaluate_records(model, [r for r in records if r["split"] == split])
              for split in ("train", "val", "test")}
    save_checkpoint(out, model, {"train_config": asdict(cfg), "epoch": cfg.epochs, "epochs_done": epoch + 1,
                                 "step": step, "input_ranges": ranges, "train_scale": scale, "report": report,
                                 "heldout": heldout or {},
                                 "trained_s": time.time() - began, "device": dev.type})
    return model.cpu(), report
