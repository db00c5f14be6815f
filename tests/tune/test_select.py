"""Pareto front and the selection rules."""

from __future__ import annotations

from tuner.tune.objectives import parse_objectives
from tuner.tune.select import Point, pareto_front, select

OBJS = parse_objectives(None)


def pt(n: int, inter: float, thr: float, *, feasible: bool = True, base: bool = False) -> Point:
    return Point(number=n, params={}, settings={"n": n},
                 metrics={"p90_interactivity": inter, "output_throughput_per_gpu": thr},
                 feasible=feasible, is_baseline=base)


BASE = pt(0, 12.5, 8000, base=True)


def test_front_drops_dominated_and_infeasible_points() -> None:
    pts = [BASE, pt(1, 12.8, 8300), pt(2, 12.6, 8200), pt(3, 13.5, 7000),
           pt(4, 14.0, 9000, feasible=False), pt(5, float("nan"), 9999)]
    assert [p.number for p in pareto_front(pts, OBJS)] == [3, 1]


def test_default_rule_highest_throughput_not_below_baseline_interactivity() -> None:
    pts = [BASE, pt(1, 12.6, 8300), pt(2, 12.4, 9000), pt(3, 13.0, 8100)]
    sel = select(pts, BASE, OBJS)
    assert sel.point.number == 1  # 2 has more throughput but lower interactivity
    assert "p90_interactivity not below the baseline's" in sel.rule


def test_prefer_interactivity_and_balanced() -> None:
    pts = [BASE, pt(1, 12.6, 8600), pt(2, 13.2, 8050), pt(3, 14.0, 7900)]
    assert select(pts, BASE, OBJS, "interactivity").point.number == 2
    # balanced: 1 -> 1.008*1.075=1.0836, 2 -> 1.056*1.00625=1.0626
    assert select(pts, BASE, OBJS, "balanced").point.number == 1


def test_baseline_when_nothing_qualifies() -> None:
    pts = [BASE, pt(1, 12.0, 9000), pt(2, 11.0, 9500)]
    sel = select(pts, BASE, OBJS)
    assert sel.point is BASE
    assert "recommending the baseline" in sel.reason


def test_ties_go_to_the_lower_trial_number() -> None:
    pts = [BASE, pt(7, 12.6, 8300), pt(4, 12.6, 8300)]
    assert select(pts, BASE, OBJS).point.number == 4


def test_identical_points_collapse_to_the_baseline_or_lowest_trial() -> None:
    same = [pt(5, 12.5, 8000), BASE, pt(3, 12.5, 8000)]
    assert pareto_front(same, OBJS) == [BASE]
    assert [p.number for p in pareto_front([pt(9, 1, 1), pt(6, 1, 1)], OBJS)] == [6]
