"""The bench's time-left estimate, driven by a controlled clock (no sleeping, no timing)."""

from __future__ import annotations

import io

import pytest
from kvtier.bench.config import BenchConfig
from kvtier.bench.progress import Progress, Step
from kvtier.bench.runner import step_plan, tier_order


class Clock:
    """Time that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _progress(steps: list[Step], clock: Clock, stream: io.StringIO | None = None) -> Progress:
    return Progress(steps, enabled=stream is not None, stream=stream, tick_s=3600, clock=clock)


def _run_step(progress: Progress, clock: Clock, seconds: float) -> None:
    progress.step("a step")
    clock.now += seconds
    progress.advance()


# A run in miniature, as the bench plans it: per block size and run, a throughput step that
# moves the most data but is quick (1 s), and a scheduler-loop step whose idle loop takes
# 5 s whatever the data. The old estimate spread the throughput step's time per unit of
# weight over everything left, so at step 2 it said 2 s where 17 s were left.
THROUGHPUT, LOOP = ("throughput", "kvtier"), ("interference", "kvtier")


def _plan(sizes: tuple[str, ...] = ("256 KiB",), reps: int = 2) -> list[Step]:
    return [
        Step((*kind, size), weight)
        for size in sizes
        for _ in range(reps)
        for kind, weight in ((THROUGHPUT, 4.0), (LOOP, 2.0))
    ]


def test_a_step_kind_not_run_yet_makes_the_estimate_a_lower_bound() -> None:
    clock = Clock()
    progress = _progress(_plan(), clock)
    assert progress.estimate() is None  # nothing finished: nothing to estimate from
    _run_step(progress, clock, 1.0)  # throughput, run 1
    progress.step("loop, run 1")
    # Left: the loop step (never run: unknown), throughput (1 s), the loop again (unknown).
    assert progress.estimate() == (1.0, False)


def test_once_every_kind_ran_the_estimate_is_what_is_left() -> None:
    clock = Clock()
    progress = _progress(_plan(reps=3), clock)
    _run_step(progress, clock, 1.0)
    _run_step(progress, clock, 5.0)
    progress.step("throughput, run 2")
    assert progress.estimate() == (2 * 1.0 + 2 * 5.0, True)
    clock.now += 0.25  # the current step counts down ...
    assert progress.estimate() == (11.75, True)
    clock.now += 100  # ... never below zero: the steps after it keep their estimate
    assert progress.estimate() == (1.0 + 2 * 5.0, True)


def test_another_block_size_is_estimated_from_the_same_measurement() -> None:
    clock = Clock()
    progress = _progress(_plan(sizes=("256 KiB", "2 MiB"), reps=1), clock)
    _run_step(progress, clock, 1.0)
    _run_step(progress, clock, 5.0)
    progress.step("throughput at 2 MiB")
    # Nothing ran at 2 MiB yet: each step borrows its measurement's time at 256 KiB.
    assert progress.estimate() == (6.0, True)
    clock.now += 3.0  # 2 MiB throughput takes 3 s: from now on its own time counts
    progress.advance()
    progress.step("loop at 2 MiB")
    assert progress.estimate() == (5.0, True)


def test_set_up_between_steps_belongs_to_the_next_step() -> None:
    clock = Clock()
    progress = _progress(_plan(reps=2), clock)
    clock.now += 0.5  # preparing the primary memory before the first step
    _run_step(progress, clock, 1.0)
    clock.now += 1.0  # aggregating, between steps
    _run_step(progress, clock, 5.0)
    progress.step("throughput, run 2")
    assert progress.estimate() == (1.5 + 6.0, True)


def test_steps_without_a_kind_share_the_time_per_unit_of_weight() -> None:
    clock = Clock()
    progress = Progress([1.0, 1.0, 2.0], enabled=False, clock=clock)
    _run_step(progress, clock, 2.0)
    progress.step("second")
    assert progress.estimate() == (2.0 + 4.0, True)


def test_the_line_says_at_least_until_every_kind_ran() -> None:
    clock = Clock()
    stream = io.StringIO()
    progress = _progress(_plan(), clock, stream)
    try:
        _run_step(progress, clock, 1.0)
        progress.step("loop, run 1")
        clock.now += 5.0
        progress.advance()
        progress.step("throughput, run 2")
    finally:
        progress.close()
    lines = stream.getvalue().splitlines()
    assert "estimating time left" in lines[0]
    assert lines[1].endswith("(1s elapsed, at least 1s left)"), lines[1]
    assert lines[2].endswith("(6s elapsed, about 6s left)"), lines[2]


@pytest.mark.parametrize("repeat", [1, 2, 3])
def test_the_bench_plans_its_steps_in_the_order_it_runs_them(repeat: int) -> None:
    from kvtier.bench.ceiling import BASIC_CEILINGS, load_ceiling

    ceilings = (*BASIC_CEILINGS[:2], load_ceiling("io_uring", 16, 4096))
    config = BenchConfig(block_sizes=(1 << 20,), repeat=repeat)
    plan = step_plan(config, ["kvtier", "vllm"], ceilings)
    per_run = 3 * 2 + 2 + 2  # 3 measurements x 2 tiers, 2 basic ceilings, layout + 1 load
    assert len(plan) == per_run * repeat
    for rep in range(repeat):
        run = [s.kind for s in plan[rep * per_run : (rep + 1) * per_run]]
        tiers = [kind[1] for kind in run[:6:3]]
        assert tiers == tier_order(["kvtier", "vllm"], rep)  # alternating, as measured
        assert [k[0] for k in run[:3]] == ["throughput", "interference", "latency"]
        assert run[6:] == [
            ("fio", "fio", "1 MiB"),
            ("fio", "fio_io_uring", "1 MiB"),
            ("fio load", "layout", "1 MiB"),
            ("fio load", "fio_load_io_uring_qd16_plus4k", "1 MiB"),
        ]
