"""The online tuner's rules apart from its phase machine, as the split of 2026-11-26 left them:
samples and the drop monitor (auturi.tuner.online_monitor), what the search tries next and
locks in (auturi.tuner.online_search), and the opening's pure decisions
(auturi.tuner.online_begin). No executor: each rule on its explicit inputs."""
from __future__ import annotations

import math

import pytest

from auturi import Config
from auturi.tuner.measure import Trial
from auturi.tuner.online_begin import EARLY_CORES, decisive_top, first_look, wrap_move
from auturi.tuner.online_monitor import DropMonitor, Span, clearly_slower
from auturi.tuner.online_search import baselines, keep_start, propose_close
from auturi.tuner.online_settings import OnlineSettings

SERIAL = Config.serial(4)
ACTORS = Config(num_actors=2, envs_per_actor=2)
WORKERS = Config(num_actors=1, envs_per_actor=4, env_parallel_degree=4)


def trial(config: Config, source: str, *samples: float) -> Trial:
    return Trial(config=config, source=source, samples=list(samples), status="ok")


# ---------------------------------------------------------------------------- samples, drops
def test_a_span_adds_collects_up_to_its_length_then_starts_anew():
    span = Span()
    assert span.add(100.0, 50, 1.0) is None  # 0.5 s
    assert span.add(200.0, 100, 1.0) == pytest.approx(150.0)  # 1 s: 150 steps in 1 s
    assert (span.seconds, span.steps) == (0.0, 0)


def test_the_drop_monitor_skips_the_lock_in_warm_up_and_counts_low_samples_in_a_row():
    monitor = DropMonitor(OnlineSettings(monitor_seconds=0.0, drop_fraction=0.2, drop_patience=2))
    monitor.fresh = True
    assert monitor.watch(10.0, 10, reference=100.0) is None and monitor.drops == 0  # the warm-up: not a drop
    assert monitor.watch(math.nan, 10, reference=100.0) is None and monitor.drops == 0  # nothing to judge
    assert monitor.watch(70.0, 10, reference=100.0) is None and monitor.drops == 1
    assert monitor.watch(90.0, 10, reference=100.0) is None and monitor.drops == 0  # back within 20%: reset
    monitor.watch(70.0, 10, reference=100.0)
    assert monitor.watch(60.0, 10, reference=100.0) == 60.0  # the second low one in a row
    monitor.arm()
    assert monitor.drops == 0


def test_a_search_trial_is_clearly_slower_only_when_every_sample_is():
    best = trial(SERIAL, "start", 100.0)
    assert clearly_slower(trial(ACTORS, "online", 80.0), best, margin=0.15)
    assert not clearly_slower(trial(ACTORS, "online", 80.0, 90.0), best, margin=0.15)
    assert not clearly_slower(trial(ACTORS, "start", 50.0), best, margin=0.15)  # the start is measured fully
    assert not clearly_slower(trial(ACTORS, "online", 50.0), None, margin=0.15)


# ---------------------------------------------------------------------------- the search's choices
def test_the_baselines_are_the_start_then_serial_on_its_device_once_each():
    cuda_start = Config(1, 4, 4, 1, "cuda", 4)
    assert baselines(cuda_start, [], []) == [(cuda_start, "start"), (Config.serial(4, "cuda"), "serial")]
    assert baselines(SERIAL, [], []) == [(SERIAL, "start")]  # serial is the start
    assert baselines(cuda_start, [trial(cuda_start, "start", 1.0)], [(Config.serial(4, "cuda"), "serial")]) == []


def test_a_cuda_model_is_proposed_layouts_acting_on_cuda_first():
    cpu_fast, cuda_slow = Config(1, 4, 4, 1, "cpu", 4), Config(1, 4, 4, 1, "cuda", 4)
    preds = {cpu_fast: 2000.0, cuda_slow: 1000.0}

    def close(history, key=None):
        return max(preds, key=lambda c: key(c, preds[c]) if key else preds[c])
    assert propose_close(close, [], "cuda") == cuda_slow
    assert propose_close(close, [], "cpu") == cpu_fast
    assert propose_close(close, [], "cpu", net=lambda c, p: -p) == cuda_slow  # ranked by what it pays back


def test_the_lock_in_keeps_the_start_within_its_margin_only():
    start, fast = trial(SERIAL, "start", 95.0), trial(ACTORS, "online", 100.0)
    assert keep_start(fast, [start, fast], SERIAL, margin=0.1) is start
    assert keep_start(fast, [start, fast], SERIAL, margin=0.01) is fast
    assert keep_start(None, [], SERIAL, margin=0.1) is None


# ---------------------------------------------------------------------------- the opening
def test_a_start_running_its_envs_elsewhere_has_room_on_a_gpu_box_only():
    subproc_cuda = Config(1, 4, 4, 1, "cuda", 4)
    assert first_look(subproc_cuda, None, 1.0, 0.1, early_env_share=0.5, cores=EARLY_CORES).room
    assert not first_look(subproc_cuda, None, 1.0, 0.1, early_env_share=0.5, cores=EARLY_CORES - 1).room
    assert first_look(SERIAL, None, 1.0, 0.1, early_env_share=0.5, cores=16) is None  # no stats: nothing told
    assert first_look(SERIAL, None, 1.0, 0.1, early_env_share=None, cores=16) is None  # turned off


def test_the_decisive_top_needs_the_whole_gain():
    table = {SERIAL: 100.0, WORKERS: 199.0}
    assert decisive_top(table, 100.0, 2.0) is None
    assert decisive_top({**table, ACTORS: 200.0}, 100.0, 2.0) == (ACTORS, 200.0)
    assert decisive_top({}, 100.0, 2.0) is None


def test_the_begin_time_move_without_a_horizon_weighs_its_reconfigure():
    """Both layouts clear the 2x; the one a bit slower but far cheaper to start wins over 8 collects."""
    cheap, dear = Config(1, 4, 4, 1, "cpu", 4), Config(1, 4, 4, 4, "cpu", 1)
    table = {SERIAL: 100.0, cheap: 400.0, dear: 450.0, Config(1, 4, 4, 1, "cuda", 4): 900.0}
    cost = {cheap: 0.2, dear: 3.0}
    first = wrap_move(table, 100.0, gain=2.0, device="cpu", collect_steps=400, estimate=cost.__getitem__)
    assert first == cheap  # 0.2 + 8 x 1.0 s against 3.0 + 8 x 0.89 s; the CUDA layout is on another device
    assert wrap_move(table, 100.0, gain=10.0, device="cpu", collect_steps=400, estimate=cost.__getitem__) is None


def test_serial_is_needless_after_a_subprocvecenv_start_once_it_measured_or_a_wrap_move_stood_for_it():
    from auturi.tuner.online_begin import Opening

    start = Config(1, 4, 4, 1, "cuda", 4)
    opening = Opening(OnlineSettings(), None, None, None, start)
    assert not opening.serial_needless([])  # no room found yet: serial is measured as before
    opening.room = True
    assert not opening.serial_needless([])  # the start not measured, no move made for it
    assert opening.serial_needless([trial(start, "start", 100.0)])
    opening.start_pred = 100.0  # a wrap-time move: the start's prediction stood in for its measure
    assert opening.serial_needless([])
    in_caller = Opening(OnlineSettings(), None, None, None, SERIAL)
    in_caller.room, in_caller.start_pred = True, 100.0
    assert not in_caller.serial_needless([])  # a start in the caller: serial is its baseline
