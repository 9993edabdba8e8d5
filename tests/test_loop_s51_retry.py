"""The loop's roles try the next candidate when the runtime refuses a plan (probe 2026-12-01: a 24-device
cluster on a machine hosting 8 processes ran none of exploit, explore and held-out, and reported as if it learned)."""

from __future__ import annotations

from hetpart.experiments import loop as loop_module


class _Loop:
    """What ``_run_role`` asks of the loop: plans ``a``..``e``; the runtime refuses those in ``refuses``."""

    def __init__(self, refuses: set[str]) -> None:
        self.refuses, self.refused, self.ran, self.lines = refuses, set(), [], []

    def records(self):
        return []

    def correction(self, records):
        return None

    def score(self, pool, correction):
        return pool

    def choose(self, scored, measured, role):
        left = [p for p in scored if p not in self.refused]
        return left[0] if left else None

    def run(self, plan, role, iteration):
        if plan in self.refuses:
            self.refused.add(plan)
            return None
        self.ran.append((role, plan))
        return {"plan": plan}

    def say(self, line):
        self.lines.append(line)


def test_a_refused_plan_gives_way_to_the_next_candidate(monkeypatch):
    monkeypatch.setattr(loop_module, "_record_key", lambda r: r["plan"])
    loop = _Loop(refuses={"a", "b"})
    assert loop_module._run_role(loop, "exploit", list("abcde"), "sim", 0) == {"plan": "c"}
    assert loop.ran == [("exploit", "c")] and loop.refused == {"a", "b"}


def test_the_tries_are_bounded_and_the_baseline_is_tried_once(monkeypatch):
    monkeypatch.setattr(loop_module, "_record_key", lambda r: r["plan"])
    loop = _Loop(refuses=set("abcde") | {"sim"})
    assert loop_module._run_role(loop, "explore", list("abcde"), "sim", 0) is None
    assert loop.refused == set("abcde"[:loop_module.ROLE_TRIES])
    loop = _Loop(refuses={"sim"})
    assert loop_module._run_role(loop, "baseline", list("abcde"), "sim", 0) is None
    assert loop.refused == {"sim"} and loop.ran == []
    loop = _Loop(refuses=set("ab"))
    assert loop_module._run_role(loop, "held_out", list("ab"), "sim", 0) is None
    assert loop.lines == ["  held_out: no candidate left within the trust region; skipped"]


def test_refused_plans_do_not_set_the_trust_region(monkeypatch):
    """A refused 24-device plan priced at 3,000 tokens/s kept every runnable plan (1,000) outside 0.7 of the best:
    exploit and explore were skipped and the retries found nothing (review of 2026-12-01)."""
    monkeypatch.setattr(loop_module, "_plan_key", lambda plan: plan)
    loop = loop_module._Loop.__new__(loop_module._Loop)
    loop.refused, loop.cfg = {"big"}, type("Cfg", (), {"trust": 0.7})()
    scored = [("big", 3000.0, 0.1), ("small", 1000.0, 0.2)]
    assert loop.choose(scored, set(), "exploit") == "small"
    assert loop.choose(scored, set(), "explore") == "small"
