"""Off-policy replay (placeholder until the off-policy face lands)."""
from __future__ import annotations

from typing import Any


def check_model(model: Any) -> None:
    raise NotImplementedError(
        f"auturi.wrap supports on-policy SB3 algorithms (PPO, A2C) for now; {type(model).__name__} is off-policy "
        f"(its replay-buffer loop interleaves env steps and gradient steps)")
