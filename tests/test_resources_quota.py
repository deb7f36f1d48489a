"""A cgroup CPU quota (``docker run --cpus``, a Kubernetes CPU limit) caps the cores Auturi
plans for: the affinity mask inside such a container still lists every core of the host."""
from __future__ import annotations

import pytest

import auturi
from auturi import resources
from auturi.executor.layout import plan_layout
from auturi.resources import cpu_quota


def _tree(tmp_path, cgroup: str, files: dict[str, str]) -> tuple[str, str]:
    root = tmp_path / "cg"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    proc = tmp_path / "proc_cgroup"
    proc.write_text(cgroup)
    return str(root), str(proc)


@pytest.mark.parametrize("cgroup, files, quota", [
    ("0::/\n", {"cpu.max": "400000 100000\n"}, 4.0),                       # v2, a container's own namespace
    ("0::/\n", {"cpu.max": "max 100000\n"}, None),                         # v2, no limit
    ("0::/kubepods/pod1/c1\n", {"kubepods/pod1/cpu.max": "150000 100000\n",  # the pod's limit, above the container's
                                "kubepods/pod1/c1/cpu.max": "max 100000\n"}, 1.5),
    ("0::/docker/abc\n", {"cpu.max": "200000 100000\n"}, 2.0),             # the host's path, the container's mount
    ("4:cpu,cpuacct:/docker/abc\n1:memory:/x\n",                           # v1
     {"cpu,cpuacct/cpu.cfs_quota_us": "300000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 3.0),
    ("4:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n",         # v1, no limit
                           "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, None),
    ("0::/\n", {}, None),                                                  # nothing mounted
    ("0::/\n", {"cpu.max": "garbage\n"}, None),
])
def test_cpu_quota_reads_cgroup_v1_and_v2_up_the_hierarchy(tmp_path, cgroup, files, quota):
    root, proc = _tree(tmp_path, cgroup, files)
    assert cpu_quota(root, proc) == quota


def test_no_proc_file_means_no_quota(tmp_path):
    assert cpu_quota(str(tmp_path), str(tmp_path / "missing")) is None


def test_a_quota_caps_the_cores_the_replicas_threads_and_the_space(monkeypatch):
    """Under a quota of 1.5 CPUs on a machine whose mask lists 64 cores, Auturi counts 2
    cores: each of two CPU replicas gets 1 torch thread, not 32, and the tuner's space is
    sized for 2 cores."""
    from auturi.tuner.space import build_space

    from auturi.executor import layout

    for module in (resources, layout):
        monkeypatch.setattr(module, "usable_cores_set", lambda: set(range(64)))
    config = auturi.Config(1, 4, 1, 2, "cpu", 2)

    def replica_threads() -> set:
        return {p.threads for p in plan_layout(config).processes if p.kind == "policy"}

    monkeypatch.setattr(resources, "cpu_quota", lambda: 1.5)
    assert resources.usable_cores() == 2
    assert plan_layout(config).cores == tuple(range(64))  # the pins still spread over the mask
    assert replica_threads() == {1} and build_space(4, devices=["cpu"]).cores == 2
    monkeypatch.setattr(resources, "cpu_quota", lambda: None)
    assert resources.usable_cores() == 64
    assert replica_threads() == {32} and build_space(4, devices=["cpu"]).cores == 64
