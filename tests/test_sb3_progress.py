"""What callbacks and SB3's progress bar see through ``auturi.wrap(model)`` (issue 34, item 1):
``num_timesteps`` at each ``on_step``, the bar's count after each rollout and at the end,
as in plain SB3's loop; and the bar is drawn at the count each rollout reached (it sat at
``8/1,000,000`` for 30 s: the replay's burst of updates came faster than the bar redraws).
The env sleeps 2 ms a step, so each collect outlasts the bar's 0.1 s redraw interval."""
from __future__ import annotations

import io

import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("tqdm")
pytest.importorskip("rich")

import stable_baselines3.common.callbacks as sb3_callbacks
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from tqdm import tqdm as std_tqdm

import auturi
from auturi.adapters.sb3 import unwrap_sb3
from auturi.envs import SlowEnv

N_ENVS, N_STEPS, ROLLOUTS = 4, 16, 3
pytestmark = pytest.mark.filterwarnings("ignore:You have specified a mini-batch size")


class DrawnBar(std_tqdm):
    """SB3's progress bar as a plain tqdm into a buffer, recording the count at each draw."""

    drawn: list[int] = []

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("file", io.StringIO())
        super().__init__(*args, **kwargs)

    def display(self, *args, **kwargs):
        DrawnBar.drawn.append(self.n)
        return super().display(*args, **kwargs)


class Record(BaseCallback):
    """``num_timesteps`` at each ``on_step``; at each rollout's end, the bar's count and the
    count it last drew."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[int] = []
        self.rollout_ends: list[tuple[int, int, int]] = []  # (num_timesteps, bar count, last drawn)

    def _on_step(self) -> bool:
        self.steps.append(self.model.num_timesteps)
        return True

    def _on_rollout_end(self) -> None:
        bar = next(c for c in self.parent_bars if isinstance(c, sb3_callbacks.ProgressBarCallback)).pbar
        self.rollout_ends.append((self.model.num_timesteps, bar.n, DrawnBar.drawn[-1]))


def learn(make_model, wrapped: bool, total: int, monkeypatch) -> tuple[Record, list[int], int]:
    monkeypatch.setattr(sb3_callbacks, "tqdm", DrawnBar)
    DrawnBar.drawn = []
    model = make_model()
    if wrapped:
        model = auturi.wrap(model, config=auturi.Config.serial(N_ENVS), backend="serial")
    rec = Record()
    original = model._init_callback

    def init_callback(callback, progress_bar=False):  # the CallbackList learn() builds, progress bar included
        out = original(callback, progress_bar)
        rec.parent_bars = out.callbacks
        return out

    monkeypatch.setattr(model, "_init_callback", init_callback)
    try:
        model.learn(total, callback=rec, progress_bar=True)
    finally:
        if wrapped:
            unwrap_sb3(model)
    bar = next(c for c in rec.parent_bars if isinstance(c, sb3_callbacks.ProgressBarCallback)).pbar
    return rec, list(DrawnBar.drawn), bar.n


def slow_env():
    return make_vec_env(SlowEnv, n_envs=N_ENVS, seed=0, env_kwargs={"step_seconds": 0.002})


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_callbacks_and_progress_bar_move_as_in_plain_sb3(algo, monkeypatch):
    if algo == "ppo":
        def make():
            return PPO("MlpPolicy", slow_env(), n_steps=N_STEPS, batch_size=32, n_epochs=1, seed=0, device="cpu")
    else:  # one collect of N_STEPS rows per train_freq, as PPO's rollout
        def make():
            return DQN("MlpPolicy", slow_env(), train_freq=(N_STEPS, "step"), learning_starts=0, gradient_steps=1,
                       seed=0, device="cpu")
    total = N_STEPS * N_ENVS * ROLLOUTS
    plain, plain_drawn, plain_count = learn(make, False, total, monkeypatch)
    wrapped, drawn, count = learn(make, True, total, monkeypatch)

    # num_timesteps as each on_step sees it: n_envs more per step, as SB3's loop counts
    assert wrapped.steps == plain.steps == [N_ENVS * (i + 1) for i in range(N_STEPS * ROLLOUTS)]
    # the bar's count after each rollout, and at the end
    assert [e[:2] for e in wrapped.rollout_ends] == [e[:2] for e in plain.rollout_ends]
    assert [e[1] for e in wrapped.rollout_ends] == [N_STEPS * N_ENVS * (k + 1) for k in range(ROLLOUTS)]
    assert count == plain_count == total
    # drawn at the count each rollout reached (before the fix: 4, then 68, 132: one step into each replay)
    assert [e[2] for e in wrapped.rollout_ends] == [e[1] for e in wrapped.rollout_ends]
    assert drawn[-1] == plain_drawn[-1] == total
    # no draw between rollout ends but the first (0); the bar never goes back
    assert set(drawn) <= {0, *(e[1] for e in wrapped.rollout_ends)}
    assert drawn == sorted(drawn)
