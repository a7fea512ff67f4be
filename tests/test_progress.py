"""What a phase shows off a terminal (a log file, SLURM, CI): plain lines with steps done/total, rate and
ETA, no more often than every MIN_GAP_S, at each tenth of the phase or every EVERY_S seconds."""

import logging

import pytest

from rlvr import progress
from rlvr.progress import Progress, duration


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(progress.time, "perf_counter", c)
    return c


def lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "rlvr"]


def test_off_a_terminal_a_line_at_each_tenth_with_rate_and_eta(clock, caplog):
    caplog.set_level(logging.INFO, logger="rlvr")
    with Progress("warm-up", total=200) as p:
        for _ in range(200):
            clock.now += 0.5  # 2 steps/s: a tenth (20 steps) every 10 s
            p.update()
    # 20 steps in 10 s -> 2 step/s, 180 left -> 90 s; the 200th step gets no line (the phase's own line says so)
    assert lines(caplog)[:2] == ["warm-up 20/200 steps | 2 step/s | ETA 1m30s",
                                 "warm-up 40/200 steps | 2 step/s | ETA 1m20s"]
    assert len(lines(caplog)) == 9


def test_lines_are_at_least_min_gap_apart_and_at_most_every_s_apart(clock, caplog):
    caplog.set_level(logging.INFO, logger="rlvr")
    with Progress("rl", total=100) as p:  # a tenth every 2 s: too often, so one line per MIN_GAP_S = 5 s
        for _ in range(100):
            clock.now += 0.2
            p.update()
    assert [line.split(" |")[0] for line in lines(caplog)] == ["rl 25/100 steps", "rl 50/100 steps", "rl 75/100 steps"]
    caplog.clear()
    with Progress("rl", total=10_000) as p:  # 7 s a step: a tenth would take hours, so a line every EVERY_S
        for _ in range(20):
            clock.now += 7.0
            p.update()
    assert [line.split(" |")[0] for line in lines(caplog)] == ["rl 9/10000 steps", "rl 18/10000 steps"]


def test_resumed_progress_counts_rate_from_the_steps_done_here(clock):
    with Progress("rl", total=300, done=100, lines=False) as p:
        clock.now += 10
        for _ in range(50):
            p.update()
        assert p.text() == "150/300 steps | 5 step/s | ETA 30s"


def test_duration():
    assert [duration(s) for s in (0, 42.4, 185, 7620)] == ["0s", "42s", "3m05s", "2h07m"]
