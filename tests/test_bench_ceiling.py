"""``python -m bench.ceiling``'s table (issue 33 item 2): the estimated limit names the
inference device it assumes and the envs-only ceiling stands beside it. A synthetic record:
nothing is run."""
from __future__ import annotations

from bench.ceiling import markdown


def _out(limit: dict) -> dict:
    peers = {k: {"median": v} for k, v in (("copies", 30_000.0), ("auturi_tuned", 14_226.0), ("serial", 1_345.0))}
    return {"machine": "m", "command": "python -m bench.ceiling", "started": "2026-11-26 12:00 UTC", "cores": 16,
            "workloads": [{"workload": "pong", "choice": "actors=2 x envs=32 | env_degree=16", "envs_per_copy": 4,
                           "peers": peers, "limit": limit, "tuned_vs_copies": 14_226 / 30_000,
                           "tuned_vs_limit": 14_226 / limit["steps_per_second"] if limit.get("steps_per_second")
                           else None}]}


def test_the_table_shows_the_limit_with_its_device_and_the_envs_only_ceiling_beside_it():
    table = markdown(_out({"steps_per_second": 28_368.7, "env_steps_per_second": 28_943.0,
                           "inference_device": "cuda"}))
    header, _, row = table.splitlines()[-3:]
    assert "envs only (estimate)" in header and "tuned / envs only" in header
    assert "28,369 (cuda) | 50% |" in row and "28,943 | 49% |" in row


def test_a_record_without_the_new_fields_still_renders():
    row = markdown(_out({"steps_per_second": 14_035.1}))
    assert "14,035 (cpu) | 101% |" in row and row.rstrip().endswith("- | - |")
