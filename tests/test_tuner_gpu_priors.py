"""The online tuner's first moves on a many-core GPU machine (issue 32 part 2): what a move
costs there (CUDA contexts, many processes starting on many cores), what the first collect
tells for free, and an online run on the emulated GPU box (``auturi.testing``). No assertion
times anything: the emulated run is checked by which layouts its collects ran."""
from __future__ import annotations

import pytest

from auturi import Config, make_executor
from auturi.executor.contract import MoveCost
from auturi.tuner import OnlineTuner
from auturi.tuner.online_moves import Moves
from auturi.tuner.online_settings import OnlineSettings
from auturi.tuner.payback import (
    CUDA_START_PRIOR,
    PROCESS_START_PRIOR,
    RECONFIGURE_BASE,
    reconfigure_estimate,
    start_prior,
)

N = 32


# ---------------------------------------------------------------------------- pricing
def test_a_cuda_process_is_priced_at_the_context_prior_until_one_is_measured():
    eight_envs = reconfigure_estimate([], started=8, cores=16)
    eight_cuda = reconfigure_estimate([], started=8, devices=8, cores=16)
    assert eight_cuda == pytest.approx(RECONFIGURE_BASE + 8 * CUDA_START_PRIOR)
    assert eight_cuda > 10 * eight_envs  # eight CUDA actors are no longer as cheap as eight env workers
    # measured: a reconfigure that started 1 CUDA replica and 3 env workers in 2.0 s, and one
    # of 4 env workers in 0.2 s: 0.05 s a process, 1.82 s a context
    log = [{"seconds": 0.2, "executor": {"started": 4}},
           {"seconds": 2.0, "executor": {"started": 4}, "devices": 1}]
    assert reconfigure_estimate(log, started=2, devices=2) == pytest.approx(RECONFIGURE_BASE + 2 * 1.82)
    assert reconfigure_estimate(log, started=10) == pytest.approx(RECONFIGURE_BASE + 10 * 0.05)


def test_many_processes_started_together_share_the_cores():
    assert start_prior(30, cores=2) == pytest.approx(30 * PROCESS_START_PRIOR)  # the prior's own machine
    assert start_prior(30, cores=16) == pytest.approx(30 * PROCESS_START_PRIOR * 2 / 16)
    assert start_prior(1, cores=16) == PROCESS_START_PRIOR  # one start is never cheaper
    assert start_prior(0, cores=16) == 0.0


class _Devices:
    """A test double whose moves start what it is told (the contract's tuner half)."""

    num_envs, last_reconfigure, warming = N, None, False

    def __init__(self, cost: MoveCost, seconds: float = 1.0):
        self.config, self.cost, self.seconds = Config.serial(N), cost, seconds
        self.prepared: list[Config] = []

    def collect(self, num_steps): ...

    def reconfigure(self, config):
        self.config = config
        self.last_reconfigure = {"seconds": self.seconds, "started": self.cost.processes}
        return self.seconds

    def move_cost(self, config, origin=None):
        return MoveCost() if config == (origin or self.config) else self.cost

    def prepare(self, config):
        self.prepared.append(config)


def test_moves_log_the_devices_each_reconfigure_initialised_and_price_the_next_by_them():
    ex = _Devices(MoveCost(processes=2, devices=2), seconds=4.03)
    moves = Moves(ex, OnlineSettings())
    two_actors = Config(num_actors=2, envs_per_actor=N // 2, policy_device="cpu")
    before = moves.estimate(two_actors)
    assert before == pytest.approx(RECONFIGURE_BASE + 2 * CUDA_START_PRIOR)
    moves.reconfigure(two_actors, at_collect=3)
    assert moves.reconfigures[-1]["devices"] == 2
    ex.config = Config.serial(N)
    assert moves.estimate(two_actors) == pytest.approx(4.03)  # 2 s a context, measured here


# ---------------------------------------------------------------------------- the emulated box
def _run(profile: str, collects: int, num_steps: int, *, cores: int, time_scale: float, context: float,
         start: Config, begin: bool = False) -> tuple[OnlineTuner, list[Config]]:
    """An online run on the emulated box; ``begin``: the tuner begins before the first collect,
    as the SB3 face does at wrap time. The configs the collects ran; the first rollout's
    observations and actions are kept on the tuner as ``first_data`` (for the data check)."""
    from auturi.testing.emulated_gpu import emulated_box

    ran: list[Config] = []
    with emulated_box(profile, time_scale=time_scale, context_seconds=context) as box:
        with make_executor(box.env, box.policy(), num_envs=start.num_envs, config=start, backend="shm",
                           seed=0) as ex:
            tuner = OnlineTuner(ex, cache=False, cores=cores)
            if begin:
                tuner.begin(num_steps)
            for i in range(collects):
                ran.append(ex.config)
                r = tuner.collect(num_steps, remaining_collects=collects - 1 - i)
                if i == 0:
                    tuner.first_data = (r.observations.copy(), r.actions.copy())  # type: ignore[attr-defined]
    return tuner, ran


def _parallel(c: Config) -> bool:
    """The parallel family of the GPU record's good layouts: 8+ env lanes in an actor, or
    several actors with env workers."""
    return c.env_parallel_degree >= 8 or (c.num_actors > 1 and c.env_parallel_degree > 1)


def test_an_emulated_pong_run_on_cuda_runs_parallel_from_its_first_collect():
    """32 envs of the Pong-like emulated simulator, a policy on the emulated GPU (a CUDA start
    per process), the 16-core box's view of the cores, the start serial on cuda as SB3's own
    loop, the tuner begun at wrap time as the SB3 face does: one env timed then (a copy, in
    this process) gives the model a profile that predicts a layout 2x the start's or more, so
    the first trial is the search's first move and no collect runs the serial start; the first
    rollout's data is a serial run's; the search makes few moves."""
    from auturi.testing.emulated_gpu import emulated_box

    start = Config.serial(N, "cuda")
    tuner, ran = _run("pong-like", 8, 64, cores=16, time_scale=1.0, context=0.5, start=start, begin=True)
    assert all(_parallel(c) for c in ran), ran  # the first collect included: nothing ran serial
    assert start not in tuner.moves.log  # the tuner's own count of the collects under each layout
    assert all(c.policy_device == "cuda" for c in ran)
    assert tuner.profile_source == "wrap"
    assert all(t.source != "start" for t in tuner.history)  # the 2x margin is the guarantee, as a decisive start's
    assert tuner.locked is not None and _parallel(tuner.locked.config)
    cost = tuner.first_run_cost()
    assert cost["reconfigures"] <= 3 and cost["collects_off_choice"] <= 4
    # the data contract: the parallel first rollout is what the serial loop collects
    with emulated_box("pong-like", time_scale=1.0, context_seconds=0.0) as box:
        with make_executor(box.env, box.policy(), num_envs=N, config=start, backend="shm", seed=0) as ex:
            r = ex.collect(64)
    obs, actions = tuner.first_data  # type: ignore[attr-defined]
    assert (obs == r.observations).all() and (actions == r.actions).all()


def test_under_early_cores_the_first_collect_runs_the_start():
    """Below ``EARLY_CORES`` nothing is timed at wrap time: the first collect runs the start
    layout and is the start trial's first sample, the model profiled from it as before."""
    start = Config.serial(N, "cuda")
    tuner, ran = _run("pong-like", 2, 64, cores=8, time_scale=1.0, context=0.5, start=start, begin=True)
    assert ran[0] == start and tuner.moves.log[start][0] >= 1
    sources = [t.source for t in tuner.history] + ([tuner.current.source] if tuner.current else [])
    assert sources[0] == "start"
    assert tuner.profile_source != "wrap"


def test_a_subprocvecenv_start_on_a_many_core_box_skips_the_serial_baseline():
    """A start of a process per env (a SubprocVecEnv user's) on the emulated 16-core box: the
    model keeps the profile timed at wrap (its collects cannot profile it, and profiling the
    executor between collects took ~1 s of the caller); no collect runs serial (on this box
    serial is nobody's fallback, and going there and back restarted every env worker)."""
    n = 16
    start = Config(1, n, n, 1, "cuda", n)
    tuner, ran = _run("pong-like", 8, 128, cores=16, time_scale=1.0, context=0.2, start=start)
    assert ran[0] == start and all(c.env_parallel_degree > 1 for c in ran)
    assert all(t.source != "serial" for t in tuner.history)
    assert tuner.profile_source == "wrap" and tuner.opening.kept_profile


@pytest.mark.parametrize("env_share, cpu_share, cores, room", [
    (0.8, 0.9, 2, False),   # a cheap CPU env on 2 cores: its collect holds the core
    (0.3, 0.1, 16, False),  # the policy, not the envs, took the collect
    (0.8, 0.2, 2, True),    # envs waiting on a simulator, or a GPU policy: room even on 2 cores
    (0.8, 0.9, 16, True),   # an expensive CPU env on 16 cores
])
def test_the_first_collect_says_whether_env_workers_have_room(env_share, cpu_share, cores, room):
    from auturi.rollout import CollectStats
    from auturi.tuner import SearchSpace

    ex = _Devices(MoveCost(processes=3))
    space = SearchSpace(totals=(N,), cores=cores, devices=("cpu",), configs=[Config.serial(N)])
    tuner = OnlineTuner(ex, cache=False, space=space)
    tuner.space, tuner.phase = space, "explore"
    tuner._first_look(Config.serial(N), CollectStats(steps=N, seconds=1.0, env_seconds=env_share), 1.0, cpu_share)
    assert tuner._room is room


def test_a_cheap_cpu_env_on_two_cores_stays_serial():
    """No regression on 2 cores: a cheap env's start stays the choice."""
    from auturi.envs import CountingEnv
    from auturi.policy import RandomPolicy

    with make_executor([CountingEnv] * 8, RandomPolicy(CountingEnv().action_space), num_envs=8,
                       backend="shm", seed=0) as ex:
        tuner = OnlineTuner(ex, cache=False, cores=2)
        for left in range(29, -1, -1):
            tuner.collect(128, remaining_collects=left)
        assert tuner.history[0].source == "start"
        assert tuner.locked_config == Config.serial(8)


# ---------------------------------------------------------------------------- the SB3 face's start
def test_the_sb3_face_starts_a_cuda_model_where_its_own_loop_acted():
    """A model on CUDA: the online search starts on CUDA (serial for a DummyVecEnv, a process
    per env for a SubprocVecEnv); a CPU model, or CUDA counted nowhere, starts on the CPU."""
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from auturi.adapters.sb3.wrap import model_device, start_layout
    from auturi.resources import cuda_device_count
    from auturi.testing.emulated_gpu import emulated_gpu

    class OnCuda:
        device = "cuda:0"  # what str(torch.device("cuda:0")) reads on an SB3 model

    class OnCpu:
        device = "cpu"

    dummy = DummyVecEnv([lambda: gym.make("CartPole-v1")] * 4)
    subproc = SubprocVecEnv.__new__(SubprocVecEnv)  # its type is all start_layout reads: no processes
    if not cuda_device_count():
        assert model_device(OnCuda()) == "cpu"
    with emulated_gpu():
        assert model_device(OnCuda()) == "cuda" and model_device(OnCpu()) == "cpu"
        assert start_layout(dummy, 4, model_device(OnCuda())) == Config.serial(4, "cuda")
        assert start_layout(subproc, 4, "cuda") == Config(1, 4, 4, 1, "cuda", 4)
    assert start_layout(dummy, 4) == Config.serial(4)


@pytest.mark.parametrize("measured, measures_start", [(1200.0, True), (3000.0, False)])
def test_a_wrap_time_move_that_measures_short_of_its_margin_has_the_start_measured(measured, measures_start):
    """After a wrap-time move the start is not measured (the 2x margin stands for it), unless
    the move measures under the square root of that margin over the start's prediction: then the start is
    measured after all, so a misprediction cannot lock in a layout slower than the user's."""
    from auturi.envs import CountingEnv
    from auturi.policy import RandomPolicy
    from auturi.tuner.measure import Trial

    with make_executor([CountingEnv] * 4, RandomPolicy(CountingEnv().action_space), num_envs=4,
                       backend="serial") as ex:
        tuner = OnlineTuner(ex, cache=False)
        tuner.begin(8)
        moved = Config(num_actors=2, envs_per_actor=2)
        tuner.profile_source, tuner._start_pred = "wrap", 1000.0
        tuner._queue = []
        tuner.history[:] = [Trial(config=moved, source="online", samples=[measured] * 3, status="ok")]
        tuner._start_if_doubtful()
        assert ((tuner.start_config, "start") in tuner._queue) is measures_start
