"""``prefill_schedule_interval``: spec §3 (vLLM 0.33.0 local cadence, DP variant, off)."""

from __future__ import annotations

import pytest

from tuner.sim.settings import SimOptions

from test_scheduler import req, sched, step

pytestmark = pytest.mark.usefixtures("both_paths")


def run_spacing(mode: str = "local"):
    """spec §3.1: A prefills at executed step 1; B arrives at step 3 (needs 2 chunks);
    C arrives at step 9. Returns {step: scheduled} for steps 1..10."""
    s = sched(1000, SimOptions(prefill_interval_mode=mode), max_num_batched_tokens=64,
              max_num_seqs=4, prefill_schedule_interval=4)
    log = {}
    for n in range(1, 11):
        if n == 1:
            s.add_request(req("A", 32, max_tokens=100))
        if n == 3:
            s.add_request(req("B", 100, max_tokens=100))
        if n == 9:
            s.add_request(req("C", 20, max_tokens=100))
        log[n] = step(s)
    return s, log


def test_local_cadence_spaces_prefill_steps_by_the_interval():
    s, log = run_spacing()
    assert log[1] == {"A": 32}
    assert log[2] == log[3] == log[4] == {"A": 1}  # B waits: decode-only steps
    assert log[5] == {"A": 1, "B": 63}  # admitted at executed step 5
    assert log[6] == log[7] == log[8] == {"A": 1}  # B's second chunk stalls too
    assert log[9] == {"A": 1, "B": 37, "C": 20}  # chunk and C admitted at step 9
    assert log[10] == {"A": 1, "B": 1, "C": 1}
    assert s.num_executed_steps == 10 and s.last_prefill_step == 9


def test_interval_off_mode_ignores_the_setting():
    _, log = run_spacing("off")
    assert log[3] == {"A": 1, "B": 63}


def test_dp_mode_uses_the_step_counter():
    _, log = run_spacing("dp")
    # counter 0 releases, 1-3 defer, 4 releases (step 5), 8 releases (step 9).
    assert log[1] == {"A": 32}
    assert log[3] == {"A": 1} and log[5] == {"A": 1, "B": 63}
    assert log[6] == {"A": 1} and log[9] == {"A": 1, "B": 37, "C": 20}


def test_capacity_escape_keeps_releasing_while_queue_is_left_behind():
    def run(with_d: bool):
        s = sched(1000, max_num_batched_tokens=32, max_num_seqs=2, prefill_schedule_interval=4)
        s.add_request(req("A", 16, max_tokens=100))
        log = [step(s)]
        for _ in range(3):
            log.append(step(s))
        s.add_request(req("B", 100, max_tokens=100))
        if with_d:
            s.add_request(req("D", 16, max_tokens=100))  # blocked by max_num_seqs
        log.append(step(s))  # executed step 5: release
        log.append(step(s))  # step 6
        return s, log

    s, log = run(False)
    assert log[4] == {"A": 1, "B": 31}
    assert log[5] == {"A": 1}  # deferred: B's chunk stalls
    s, log = run(True)
    assert log[4] == {"A": 1, "B": 31}
    assert s.prefill_capacity_bound
    assert log[5] == {"A": 1, "B": 31}  # the escape: no deferral while D is left waiting


def test_one_token_admissions_proceed_on_deferred_steps():
    # W's prompt is fully cached except its last token? Hits are whole blocks, so a
    # 33-token prompt with 2 cached blocks needs exactly 1 token: admitted while deferred.
    s = sched(1000, max_num_batched_tokens=64, max_num_seqs=4, prefill_schedule_interval=4)
    s.add_request(req("seed", 32, [7, 8], max_tokens=1))
    s.add_request(req("A", 16, [9], max_tokens=100))
    step(s)  # executed step 1: prefill of both; seed finishes (blocks cached)
    s.add_request(req("W", 33, [7, 8], max_tokens=5))
    s.add_request(req("X", 16, [5], max_tokens=5))
    assert step(s) == {"A": 1, "W": 1}  # W admitted (1 token), X needs prefill: stop
    assert s.last_prefill_step == 1  # a 1-token admission does not restart the interval


def test_no_deferral_when_nothing_can_decode():
    s = sched(1000, max_num_batched_tokens=32, max_num_seqs=4, prefill_schedule_interval=4)
    s.add_request(req("A", 100, max_tokens=3))
    assert step(s) == {"A": 32}
    assert step(s) == {"A": 32}  # only a prefill chunk runs: the model is never idle
    assert step(s) == {"A": 32}
