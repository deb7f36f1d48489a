"""What every part of the RLlib face shares: its error type and the attribute
:func:`~auturi.adapters.rllib.wrap.wrap_rllib` leaves on the ``AlgorithmConfig`` for the runner."""
from __future__ import annotations

from auturi.errors import AuturiError

OPTIONS_ATTR = "_auturi_options"
"""The attribute ``wrap_rllib`` sets on the AlgorithmConfig: the wrap's options, read by the
runner when RLlib builds it."""


class UnsupportedConfigError(AuturiError, NotImplementedError):
    """The AlgorithmConfig uses something ``auturi.wrap`` cannot reproduce; the message names it
    and the fix."""
