"""The tuners, by their old module path: :class:`Tuner` (offline, :mod:`auturi.tuner.offline`)
and :class:`OnlineTuner` (inside training, :mod:`auturi.tuner.online`); their result record,
error and events live in :mod:`auturi.tuner.result`, what they share in
:mod:`auturi.tuner.session`. Kept because the SB3 and RLlib adapters import
``from auturi.tuner.tuner import OnlineTuner``; new code imports from :mod:`auturi.tuner`.
"""
from auturi.tuner.offline import FINAL_SHARE, Tuner
from auturi.tuner.online import OnlineTuner
from auturi.tuner.result import TuneError, TuneResult, TunerEvent

__all__ = ["FINAL_SHARE", "OnlineTuner", "TuneError", "TuneResult", "Tuner", "TunerEvent"]
