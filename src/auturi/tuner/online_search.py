"""What the online search tries next and what it locks in, as rules on explicit inputs: the
model's close proposals ranked by what they pay back, configs acting on a CUDA model's device
first (:func:`propose_close`), the gamble on a family of layouts nothing was measured in
(:func:`family_gamble`), the baselines measured first (:func:`baselines`), a re-search's
candidates (:func:`research_queue`) and the lock-in's
preference for the start layout within noise (:func:`keep_start`). The phase machine
(:class:`~auturi.tuner.OnlineTuner`) decides when each is asked; what a move is worth is
:class:`~auturi.tuner.online_moves.Moves`'.

Example (the start measured within 3% of the fastest: the start is kept):
    >>> from auturi import Config
    >>> from auturi.tuner.measure import Trial
    >>> start = Trial(config=Config.serial(4), source="start", samples=[98.0] * 3, status="ok")
    >>> fast = Trial(config=Config(num_actors=2, envs_per_actor=2), source="online", samples=[100.0] * 3, status="ok")
    >>> keep_start(fast, [start, fast], Config.serial(4), margin=0.03) is start
    True
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from auturi.config import Config
from auturi.tuner.measure import Trial
from auturi.tuner.space import SearchSpace, serial_baseline

SEARCH_SOURCES = ("online", "research")
"""Trial sources that are the search's own moves; the start, serial and cached configs are
measured whatever they cost, so their cost says nothing of what the next move will cost
(a remote simulator's serial baseline, 3.7x slower than the best, priced every move at 4.8 s)."""

Ranking = Callable[[Config, float], float]
"""A proposal's rank from its config and predicted steps/s (higher first)."""


def baselines(start: Config, history: Sequence[Trial],
              queue: Sequence[tuple[Config, str]]) -> list[tuple[Config, str]]:
    """What the search measures first, where not measured or queued yet: the ``start`` config,
    then serial when it is another one (it usually is the start). Serial runs the policy on the
    start's device (:func:`~auturi.tuner.space.serial_baseline`): a model on CUDA acted on CUDA in its own loop, and an emulated-GPU Pong run
    spent 5 of its 12 collects measuring serial on the CPU after a serial CUDA start, a layout
    nothing would choose."""
    tried = {t.config for t in history}
    out: list[tuple[Config, str]] = []
    for c, src in ((start, "start"), (serial_baseline(start), "serial")):
        if c not in tried and all(c != q for q, _ in [*queue, *out]):
            out.append((c, src))
    return out


def propose_close(close: Callable[..., Config | None], history: Sequence[Trial], device: str,
                  net: Ranking | None = None) -> Config | None:
    """The model's next close proposal (``close``: :meth:`ModelStrategy.propose_close`), ranked
    by ``net`` (what trying it pays back: cheap-to-start configs win close calls; None: no
    horizon, by prediction). A model on CUDA (``device``): its own loop acted there, so configs
    acting there come first; CPU inference only once none of those is left close. On the
    emulated GPU box the model ranked 32 CPU actors first (its CPU timings free of the env
    workers' load), and a 98k-step Pong run locked in CPU replicas at 0.4x SubprocVecEnv."""
    if device == "cpu":
        return close(history) if net is None else close(history, key=net)

    def key(c: Config, pred: float) -> float:
        value = net(c, pred) if net is not None else pred
        return value if c.policy_device == device else value - 1e12
    return close(history, key=key)


def family_gamble(strategy: Any, history: Sequence[Trial], best: float) -> tuple[Config, float] | None:
    """The best-predicted config of a layout family nothing was measured in
    (:meth:`ModelStrategy.propose_family`) and its hopeful prediction: the central one raised by
    the model's current error (or the ``best`` measured figure so raised, if higher); None when
    the strategy has no families or none is left. Worth trying only where it pays back
    ``explore_factor`` times over at that figure: on a 2-core machine the model ranked two actors
    2% below an env-worker layout that measured 27% slower; only a measurement tells such
    families apart."""
    propose = getattr(strategy, "propose_family", None)
    if propose is None:
        return None
    c = propose(history)
    pred = strategy.predicted(c) if c is not None else None
    if c is None or not pred:
        return None
    return c, max(pred, best) * math.exp(float(getattr(strategy, "model_error", 0.0)))


def research_queue(locked: Config, space: SearchSpace, predicted: Callable[[Config], float | None] | None,
                   max_trials: int) -> list[tuple[Config, str]]:
    """After a sustained drop: the locked config (re-measured) and its nearest neighbours, the
    best-``predicted`` first where the model is prepared, ``max_trials`` in all."""
    near = space.neighbours(locked)
    if predicted is not None:
        near.sort(key=lambda c: -(predicted(c) or 0.0))
    return [(locked, "research")] + [(c, "research") for c in near[:max(0, max_trials - 1)]]


def keep_start(best: Trial | None, pool: Sequence[Trial], start: Config, margin: float) -> Trial | None:
    """``best``, unless the ``start`` layout was measured in ``pool`` within ``margin`` of it:
    then the start (the fastest of configs within noise of each other is partly luck, and the
    start is what plain training runs)."""
    if best is None or best.config == start:
        return best
    measured = [t for t in pool if t.ok and t.config == start]
    if measured and max(t.estimate for t in measured) * (1 + margin) >= best.estimate:
        return max(measured, key=lambda t: t.estimate)
    return best
