"""The tuner: find, by measurement, the fastest :class:`~auturi.Config` for a workload.

- :mod:`~auturi.tuner.space`: every valid config for the workload on this machine, with
  pruned points and their reasons;
- :mod:`~auturi.tuner.measure`: the protocol every strategy shares (reconfigure, warm-up,
  measure until the median's distribution-free interval is tight), and :class:`Trial`;
- :mod:`~auturi.tuner.strategies`: ``grid``, ``optuna`` and ``model`` (the default);
- :mod:`~auturi.tuner.profile`: what a profile holds and how the executor is profiled;
  :mod:`~auturi.tuner.timing`: one env's and one forward pass's timings;
  :mod:`~auturi.tuner.model`: the analytic model and its fit;
- :mod:`~auturi.tuner.offline`: :class:`Tuner`; :mod:`~auturi.tuner.online`:
  :class:`OnlineTuner`, the phase machine inside training (its thresholds:
  :mod:`~auturi.tuner.online_settings`, :class:`OnlineSettings`; what a move costs and saves:
  :mod:`~auturi.tuner.online_moves` by the rule of :mod:`~auturi.tuner.payback`; its profile
  from the training's first rollouts: :mod:`~auturi.tuner.rollout_profile`);
  :mod:`~auturi.tuner.result`: :class:`TuneResult`, :class:`TuneError`, :class:`TunerEvent`;
  :mod:`~auturi.tuner.session`: what both share. Of an executor the tuners use only the
  contract (:class:`auturi.executor.contract.ExecutorLike`);
- :mod:`~auturi.tuner.api`: :func:`tune`, the command line's job from Python (``auturi.tune``);
- :mod:`~auturi.tuner.cache`: JSON results, fingerprints and the cache of past choices.

Example:
    >>> import gymnasium as gym, auturi
    >>> from auturi.envs import CountingEnv
    >>> from auturi.tuner import Tuner
    >>> with auturi.make_executor(CountingEnv, auturi.RandomPolicy(gym.spaces.Discrete(3)), 4,
    ...                           backend="serial") as ex:
    ...     result = Tuner(budget_trials=4, cache=False).tune(ex, num_steps=8)
    ...     ex.config == result.choice
    True
"""
from auturi.tuner.cache import (
    CacheWarning,
    ResultsCache,
    hardware_fingerprint,
    load_record,
    resolve_cache_dir,
    save_record,
    workload_fingerprint,
)
from auturi.tuner.measure import (
    MeasureProtocol,
    Trial,
    measure,
    median_interval,
    remeasure_interleaved,
)
from auturi.tuner.model import predict
from auturi.tuner.profile import Profile, profile_executor
from auturi.tuner.space import SearchSpace, build_space
from auturi.tuner.strategies import (
    GridStrategy,
    ModelStrategy,
    OptunaStrategy,
    Strategy,
    make_strategy,
)
from auturi.tuner.offline import Tuner
from auturi.tuner.online import OnlineTuner
from auturi.tuner.online_settings import OnlineSettings
from auturi.tuner.result import TuneError, TuneResult, TunerEvent
from auturi.tuner.api import TuneReport, tune

__all__ = [
    "CacheWarning",
    "GridStrategy",
    "MeasureProtocol",
    "ModelStrategy",
    "OnlineSettings",
    "OnlineTuner",
    "OptunaStrategy",
    "Profile",
    "ResultsCache",
    "SearchSpace",
    "Strategy",
    "Trial",
    "TuneError",
    "TuneReport",
    "TuneResult",
    "Tuner",
    "TunerEvent",
    "build_space",
    "hardware_fingerprint",
    "load_record",
    "make_strategy",
    "measure",
    "median_interval",
    "predict",
    "profile_executor",
    "remeasure_interleaved",
    "resolve_cache_dir",
    "save_record",
    "tune",
    "workload_fingerprint",
]
