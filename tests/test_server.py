"""The status endpoint: a real uvicorn server on a loopback port, fed by a real (small,
serial-backend) tuning run; JSON shapes, Prometheus text, the token rule, 4xx JSON errors,
the OpenAPI schema and a schemathesis run. The page in a browser: test_server_page.py; the
metrics' conventions: test_server_metrics.py.
"""
from __future__ import annotations

import json
import re
import threading
import time

import gymnasium as gym
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import auturi
from auturi import Config
from auturi.envs import CountingEnv
from auturi.server import LINE_COLOUR, ServerError, StatusServer, StatusSnapshot
from auturi.tuner import Tuner

NUM_ENVS = 4


def small_tuner(snapshot: StatusSnapshot, **kw) -> Tuner:
    kw.setdefault("budget_trials", 5)
    tuner = Tuner("grid", cache=False, callback=snapshot, min_samples=2, max_samples=3, max_trial_seconds=0.5,
                  final_rounds=(1, 2), **kw)
    snapshot.attach(tuner)
    return tuner


def run_tuning(snapshot: StatusSnapshot, **kw):
    with auturi.make_executor(CountingEnv, auturi.RandomPolicy(gym.spaces.Discrete(3)), NUM_ENVS,
                              backend="serial") as ex:
        tuner = small_tuner(snapshot, **kw)
        result = tuner.tune(ex, num_steps=8)
        snapshot.update(status=tuner.status(), trials=tuner.trials())
        return tuner, result


@pytest.fixture(scope="module")
def finished():
    """A snapshot of a finished tuning run (real trials), shared by the read-only tests."""
    snap = StatusSnapshot()
    tuner, result = run_tuning(snap)
    return snap, tuner, result


@pytest.fixture
def server(finished):
    srv = StatusServer(finished[0])
    srv.start()
    yield srv
    srv.stop()


def get(url: str, path: str, **kw) -> httpx.Response:
    return httpx.get(url + path.lstrip("/"), timeout=10, **kw)


# ---------------------------------------------------------------------------- during a run
def test_endpoints_answer_while_tuning_runs():
    snap = StatusSnapshot()
    srv = StatusServer(snap)
    url = srv.start()
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url) and srv.port
    seen: list[tuple[str, int, object]] = []
    stop, polling = threading.Event(), threading.Event()

    def poll():
        with httpx.Client(base_url=url, timeout=10) as c:
            while not stop.is_set():
                for p in ("/status", "/trials", "/metrics", "/healthz"):
                    r = c.get(p)
                    seen.append((p, r.status_code, r.json() if p != "/metrics" else r.text))
                polling.set()
                time.sleep(0.01)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        assert polling.wait(10)
        tuner, result = run_tuning(snap)  # the tuning runs in this (the main) thread
        time.sleep(0.1)
    finally:
        stop.set()
        t.join(10)
    try:
        assert len(seen) >= 8 and all(code == 200 for _, code, _ in seen)
        phases = [body["phase"] for p, _, body in seen if p == "/status"]
        assert phases[0] == "idle" and len(set(phases)) >= 2, phases  # the status moved while we watched
        counts = [len(body["trials"]) for p, _, body in seen if p == "/trials"]
        assert counts == sorted(counts), counts  # trials only ever get added
        final = get(url, "/status").json()
        assert final["phase"] == "done"
        assert Config.from_dict(final["best_config"]) in {t.config for t in result.trials + result.final}
        assert final["trials_done"] == len(result.trials)
        trials = get(url, "/trials").json()
        assert trials["total"] == len(tuner.trials()) == len(result.trials) + len(result.final)
    finally:
        srv.stop()
    assert not srv.running


# ---------------------------------------------------------------------------- shapes
def test_status_shape(server, finished):
    _, tuner, _ = finished
    r = get(server.url, "/status")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    s = r.json()
    for key in ("phase", "mode", "strategy", "current_config", "best_config", "best_throughput", "throughput_now",
                "trials_done", "trials_ok", "budget", "hardware", "elapsed_seconds"):
        assert key in s, key
    assert s["phase"] == "done" and s["mode"] == "offline" and s["strategy"] == "grid"
    assert s["current_config"] is None
    assert Config.from_dict(s["best_config"]) == Config.from_dict(tuner.status()["best_config"])
    assert s["best_throughput"] > 0 and s["throughput_now"] > 0
    assert set(s["budget"]) == {"trials", "trials_left", "seconds", "seconds_left"}
    assert s["budget"]["trials"] == 5
    assert s["hardware"]["cores"] >= 1 and "cpu_model" in s["hardware"]
    assert s["best_config_label"] == str(Config.from_dict(s["best_config"]))
    assert s["best_config_code"] == "auturi." + repr(Config.from_dict(s["best_config"]))
    assert s["situation"] == "tuning" and s["searching"] is False and "CountingEnv" in s["env"]
    assert s["steps_total"] is None and s["time_split"] is None  # offline: no training collects recorded


def test_trials_shape_and_filters(server, finished):
    _, tuner, result = finished
    body = get(server.url, "/trials").json()
    assert set(body) == {"total", "offset", "trials"}
    assert body["total"] == len(body["trials"]) == len(tuner.trials())
    for i, t in enumerate(body["trials"]):
        assert t["index"] == i
        Config.from_dict(t["config"])
        assert t["label"] == str(Config.from_dict(t["config"]))
        assert t["status"] in ("ok", "invalid", "failed", "running")
        if t["status"] == "ok":
            assert t["n"] == len(t["samples"]) >= 1 and t["mean"] > 0
    page = get(server.url, "/trials?offset=1&limit=2").json()
    assert page["offset"] == 1 and [t["index"] for t in page["trials"]] == [1, 2][:max(0, body["total"] - 1)]
    # The re-measures after the search: deciding rounds (final), then confirming ones (confirm).
    finals = [get(server.url, "/trials", params={"source": src}).json() for src in ("final", "confirm")]
    assert sum(f["total"] for f in finals) == len(result.final)
    assert all(t["source"] == src for f, src in zip(finals, ("final", "confirm")) for t in f["trials"])
    assert get(server.url, "/trials?status=failed").json()["total"] == 0


def test_trials_answer_follows_each_new_snapshot():
    """/trials reuses its bytes only for the same snapshot and query: a new trial list, or
    another filter, is answered afresh."""
    snap = StatusSnapshot()
    row = {"config": Config.serial(2).to_dict(), "source": "search", "status": "ok", "mean": 1.0, "n": 1,
           "samples": [1.0]}
    snap.update(trials=[row])
    with StatusServer(snap) as srv:
        first = get(srv.url, "/trials").json()
        assert get(srv.url, "/trials").json() == first and first["total"] == 1
        assert get(srv.url, "/trials?status=failed").json()["total"] == 0
        snap.update(trials=[row, {**row, "mean": 2.0, "samples": [2.0]}])
        second = get(srv.url, "/trials").json()
        assert second["total"] == 2 and [t["mean"] for t in second["trials"]] == [1.0, 2.0]
        assert get(srv.url, "/trials?offset=1").json()["trials"][0]["mean"] == 2.0


METRIC_LINE = re.compile(
    r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)'
    r'(?P<labels>\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*)?\})?'
    r' (?P<value>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|NaN|[-+]Inf)$')


def test_metrics_is_prometheus_text(server, finished):
    r = get(server.url, "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "version=0.0.4" in r.headers["content-type"]
    types: dict[str, str] = {}
    values: dict[str, list[float]] = {}
    for line in r.text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            assert parts[1] in ("HELP", "TYPE"), line
            if parts[1] == "TYPE":
                assert parts[3] in ("gauge", "counter", "untyped", "summary", "histogram"), line
                types[parts[2]] = parts[3]
            continue
        m = METRIC_LINE.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        assert m["name"] in types, f"{m['name']} has no TYPE line before it"
        values.setdefault(m["name"], []).append(float(m["value"]))
    assert values["auturi_up"] == [1]
    assert values["auturi_tuner_trials_total"] == [len(finished[2].trials)]
    assert min(values["auturi_tuner_trial_throughput_steps_per_second"]) > 0
    assert sum(values["auturi_tuner_phase"]) == 1
    # Trial results by role, not one series per trial (tests/test_server_metrics.py: bounded labels).
    assert len(values["auturi_tuner_trial_throughput_steps_per_second"]) <= 5 < len(finished[1].trials())


def test_healthz(server):
    r = get(server.url, "/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["phase"] == "done"


def test_page_is_self_contained(server):
    r = get(server.url, "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "<svg" in r.text and LINE_COLOUR in r.text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", r.text), "the page must load nothing external"
    assert "default-src 'none'" in r.headers["content-security-policy"]


# ---------------------------------------------------------------------------- errors
def test_unknown_path_and_bad_parameters_are_json_4xx(server):
    r = get(server.url, "/no/such/path")
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/json")
    assert r.json()["detail"]
    for path in ("/trials?limit=0", "/trials?offset=-1", "/trials?offset=abc", "/trials?status=bogus",
                 "/trials?source=nowhere", "/?refresh=0", "/?refresh=nan"):
        r = get(server.url, path)
        assert r.status_code == 422, (path, r.status_code, r.text)
        assert r.headers["content-type"].startswith("application/json") and r.json()["detail"], path
    r = httpx.post(server.url + "status", timeout=10)
    assert r.status_code == 405 and r.json()["detail"]


# Attacker DNS names that can resolve to 127.0.0.1 (DNS rebinding), and malformed forms.
FOREIGN_HOSTS = ("attacker.example", "127.evil.com", "127.0.0.1.evil.example.com", "127.0.0.1.nip.io:80",
                 "localhost.evil.example", "evil-localhost", "127.1", "0x7f.0.0.1", "127.0.0.1:abc",
                 "127.0.0.1:99999", "[::1].evil.example", "[::1]x", "::1", "[::2]", "10.0.0.1", "")
LOOPBACK_HOSTS = ("localhost", "LocalHost:8000", "127.0.0.1", "127.0.0.1:{port}", "127.0.0.2", "127.255.0.9:80",
                  "[::1]", "[::1]:{port}")


def raw_request(port: int, head: str) -> tuple[int, dict]:
    """Send ``head`` (request line and header lines) as is, so the Host header can be left out
    or doubled, which no HTTP client library allows; returns the status and the JSON body."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall((head + "\r\n\r\n").encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2] or b"null")


def test_dns_rebinding_guard_wants_an_exact_loopback_host(server):
    for host in FOREIGN_HOSTS:
        for path in ("/status", "/"):
            r = get(server.url, path, headers={"Host": host})
            assert r.status_code == 400, (host, path, r.status_code)
            assert r.headers["content-type"].startswith("application/json") and "loopback" in r.json()["detail"]
    for host in LOOPBACK_HOSTS:
        r = get(server.url, "/status", headers={"Host": host.format(port=server.port)})
        assert r.status_code == 200 and r.json()["phase"] == "done", host
    code, body = raw_request(server.port, "GET /status HTTP/1.0")  # HTTP/1.0 lets a client omit Host
    assert code == 400 and "without a Host" in body["detail"]
    code, body = raw_request(server.port, "GET /status HTTP/1.0\r\nHost: 127.0.0.1")
    assert code == 200 and body["phase"] == "done"  # the raw path itself works
    code, _ = raw_request(server.port, "GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n"
                                       "Connection: close")
    assert code == 400


def test_a_server_bound_by_name_answers_that_name(finished):
    """An operator who binds a loopback name (say the machine's own, which Debian maps to
    127.0.1.1) opens http://NAME:PORT/, so that one name is allowed too; others are not."""
    import asyncio

    from auturi.server import create_app

    app = create_app(finished[0], bound_host="myhost", hardware={"cores": 1})

    async def codes() -> list[int]:  # the app in process: no name to resolve
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://myhost:8123") as c:
            return [(await c.get("/healthz", headers={"Host": h})).status_code
                    for h in ("myhost:8123", "MYHOST", "myhost.evil.example", "otherhost")]

    assert asyncio.run(codes()) == [200, 200, 400, 400]


def test_a_source_that_breaks_gives_no_500():
    class Broken:
        def __init__(self):
            self.hardware = {"cpu_model": "x"}

        def status(self):
            return {"phase": "search", "best_config": {"num_actors": "many"}, "best_throughput": float("nan"),
                    "trials": "three", "budget_seconds_left": float("inf"), "odd": object()}

        def trials(self):
            return [{"config": {"nope": 1}, "samples": [float("inf"), 1.0], "mean": "x"}, 42, None]

    with StatusServer(Broken()) as srv:
        for p in ("/status", "/trials", "/history", "/metrics", "/healthz", "/"):
            r = get(srv.url, p)
            assert r.status_code == 200, (p, r.text)
        s = get(srv.url, "/status").json()
        assert s["best_config"] is None and s["best_throughput"] is None and s["trials_done"] == 0
        t = get(srv.url, "/trials").json()["trials"]
        assert t[0]["config"] is None and t[0]["samples"] == [None, 1.0]


# ---------------------------------------------------------------------------- the token rule
def test_non_loopback_bind_needs_a_token(finished):
    for host in ("0.0.0.0", "::", ""):
        with pytest.raises(ServerError, match="token"):
            StatusServer(finished[0], host=host)
    with pytest.raises(ServerError, match="in use"), StatusServer(finished[0]) as a:
        StatusServer(finished[0], port=a.port).start()


def test_token_is_required_on_every_path(finished):
    with StatusServer(finished[0], token="s3cret-token") as srv:
        for p in ("/status", "/trials", "/metrics", "/healthz", "/", "/openapi.json", "/no/such/path"):
            r = get(srv.url, p)
            assert r.status_code == 401, p
            assert r.headers["content-type"].startswith("application/json") and "token" in r.json()["detail"]
            assert r.headers["www-authenticate"].startswith("Bearer")
        assert get(srv.url, "/status", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert get(srv.url, "/status?token=wrong").status_code == 401
        assert get(srv.url, "/status", headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
        assert get(srv.url, "/status?token=s3cret-token").status_code == 200
        schema = get(srv.url, "/openapi.json?token=s3cret-token").json()
        assert {"bearer", "token"} <= set(schema["components"]["securitySchemes"])
        for path in schema["paths"]:  # the 401 every path can answer is declared, as JSON
            assert declared_types(schema, path, 401) == {"application/json"}, path


def test_all_interfaces_with_a_token(finished):
    with StatusServer(finished[0], host="0.0.0.0", token="tok") as srv:
        url = f"http://127.0.0.1:{srv.port}/"
        assert get(url, "/status").status_code == 401
        assert get(url, "/status", headers={"Authorization": "Bearer tok"}).json()["phase"] == "done"
        # With a token the Host is not checked (a server on every interface is reached by any name).
        r = get(url, "/status", headers={"Authorization": "Bearer tok", "Host": "status.example:8080"})
        assert r.json()["phase"] == "done"
        assert get(url, "/status", headers={"Host": "127.0.0.1"}).status_code == 401


# ---------------------------------------------------------------------------- schema
def test_openapi_lists_the_endpoints(server):
    schema = get(server.url, "/openapi.json").json()
    assert {"/status", "/trials", "/history", "/metrics", "/healthz", "/"} <= set(schema["paths"])
    for p in schema["paths"].values():
        assert set(p) == {"get"}
    comps = schema["components"]["schemas"]
    assert {"StatusModel", "TrialsModel", "TrialModel", "ConfigModel", "HistoryModel", "TimeSplitModel"} <= set(comps)
    params = {q["name"] for q in schema["paths"]["/trials"]["get"]["parameters"]}
    assert params == {"offset", "limit", "status", "source"}


def declared_types(schema: dict, path: str, code: int) -> set[str]:
    """The content types the schema declares for ``GET path`` answering ``code``."""
    return set(schema["paths"][path]["get"]["responses"].get(str(code), {}).get("content", {}))


def test_error_responses_are_declared_with_their_content_type(server):
    schema = get(server.url, "/openapi.json").json()
    for path, query in (("/", "refresh=-0.5"), ("/", "refresh=nan"), ("/trials", "limit=0"),
                        ("/trials", "status=bogus")):
        r = get(server.url, f"{path}?{query}")
        assert r.status_code == 422, (path, query)
        got = r.headers["content-type"].split(";")[0]
        assert got in declared_types(schema, path, 422), (path, query, got, declared_types(schema, path, 422))
    for path in schema["paths"]:
        r = get(server.url, path, headers={"Host": "127.evil.com"})
        assert r.status_code == 400 and declared_types(schema, path, 400) == {"application/json"}, path
    for path in ("/status", "/history", "/metrics", "/healthz"):  # no parameters, so no 422 to declare
        assert declared_types(schema, path, 422) == set(), path


def test_schemathesis_finds_no_failure(server):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(server.url + "openapi.json")
    ops = [r.ok() for r in schema.get_all_operations()]
    assert len(ops) >= 5
    calls = []
    base = server.url.rstrip("/")

    def make_check(op, mode):
        @settings(max_examples=20, deadline=None, database=None, derandomize=True,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy(generation_mode=mode))
        def check(case):
            # Every check, for invalid input too: a 4xx must be one the schema declares, with
            # the content type and body it declares (the page's 422 once claimed text/html).
            r = case.call_and_validate(base_url=base)
            calls.append((mode, r.status_code))

        return check

    for op in ops:
        make_check(op, GenerationMode.POSITIVE)()
        if op.query:  # only operations with parameters have invalid input to generate
            make_check(op, GenerationMode.NEGATIVE)()
    assert {m for m, _ in calls} == {GenerationMode.POSITIVE, GenerationMode.NEGATIVE}
    assert any(400 <= c < 500 for m, c in calls if m == GenerationMode.NEGATIVE)
    assert max(c for _, c in calls) < 500


# The page in headless Chromium: tests/test_server_page.py.


def test_history_serves_recorded_collects_bounded(monkeypatch):
    """/history: each recorded training collect with its layout and time split, oldest first,
    at most HISTORY_POINTS; the status carries the counters and the latest split."""
    from auturi.rollout import CollectStats
    from auturi.server import snapshot as snapshot_module

    monkeypatch.setattr(snapshot_module, "HISTORY_POINTS", 5)
    snap = StatusSnapshot(env="CartPole-v1")
    snap.update(status={"phase": "explore", "mode": "online", "current_config": Config.serial(4).to_dict()})
    for i in range(7):
        snap.record_collect(CollectStats(steps=100, seconds=0.1 * (i + 1), env_seconds=0.05, policy_seconds=0.02),
                            config=None if i < 6 else Config(num_actors=2, envs_per_actor=2), at=1000.0 + i)
    snap.record_collect(CollectStats(steps=0, seconds=0.0))  # an empty collect records nothing
    with StatusServer(snap, hardware={"cores": 2}) as srv:
        points = get(srv.url, "/history").json()["points"]
        s = get(srv.url, "/status").json()
    assert [p["at"] for p in points] == [1002.0, 1003.0, 1004.0, 1005.0, 1006.0]
    assert [p["label"] for p in points][-2:] == [str(Config.serial(4)), str(Config(num_actors=2, envs_per_actor=2))]
    assert points[-1]["steps_per_second"] == pytest.approx(100 / 0.7) and points[-1]["env_seconds"] == 0.05
    assert s["situation"] == "training" and s["searching"] is True and s["env"] == "CartPole-v1"
    assert s["steps_total"] == 700 and s["collects_total"] == 7
    assert s["seconds_total"]["wall"] == pytest.approx(2.8) and s["time_split"]["seconds"] == pytest.approx(0.7)


def test_status_snapshot_feeds_from_events():
    from auturi.tuner import TunerEvent

    snap = StatusSnapshot()
    assert snap.status()["phase"] == "idle" and list(snap.trials()) == []
    snap(TunerEvent(kind="sample", status={"phase": "search", "trials": 1}, value=1234.0))
    s = snap.status()
    assert s["phase"] == "search" and s["throughput_now"] == 1234.0
    json.dumps(s)


def test_the_config_schema_is_configs_knobs_and_the_version_is_the_packages():
    """The API's config model is built from Config.knob_names() (with Config's types, integer
    knobs >= 1), and the app reports auturi's version."""
    from pydantic import ValidationError

    from auturi.server import _models, create_app

    model = _models()["ConfigModel"]
    assert tuple(model.model_fields) == Config.knob_names()
    assert model(**Config(num_actors=2, envs_per_actor=2).to_dict()).num_actors == 2
    with pytest.raises(ValidationError):
        model(**{**Config().to_dict(), "env_parallel_degree": 0})
    assert create_app(StatusSnapshot()).openapi()["info"]["version"] == auturi.__version__


# ---------------------------------------------------------------------------- what one client may hold
# Raw sockets, as a hostile local client would use them, against both HTTP parsers uvicorn
# may run (httptools where installed, h11 otherwise). The limits are small so that each test
# is quick; every wait is a read with a generous deadline, never a sleep.
import select  # noqa: E402
import socket  # noqa: E402

from auturi.server import ServerLimits  # noqa: E402

SMALL = ServerLimits(max_head_bytes=4096, max_body_bytes=1024, request_timeout=0.5, keep_alive_timeout=0.5,
                     max_connections=4)
GET = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
DEADLINE = 30.0  # seconds: far above every limit here, only there so that a failure cannot hang


@pytest.fixture(params=["httptools", "h11"])
def parser(request, monkeypatch):
    import auturi.server.serve as serve

    if request.param == "httptools":
        pytest.importorskip("httptools")
    else:
        monkeypatch.setattr(serve, "_fast_or", lambda fast, fallback: fallback)  # h11 and asyncio's loop
    return request.param


def limited(limits: ServerLimits = SMALL) -> StatusServer:
    snap = StatusSnapshot()
    snap.update(status={"phase": "search"})
    srv = StatusServer(snap, limits=limits)
    srv.start()
    return srv


def connect(srv: StatusServer) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=DEADLINE)
    return s


def read_until_closed(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (the socket's timeout is
    the deadline: a server that keeps it open fails the test with socket.timeout)."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def status_of(data: bytes) -> int:
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0


def test_a_head_over_the_limit_is_431_and_the_connection_closes(parser):
    srv = limited()
    try:
        with connect(srv) as s:
            s.sendall(GET + b"X-Big: " + b"a" * 8192)  # unfinished: the old server buffered it all, and more
            answer = read_until_closed(s)
        assert status_of(answer) == 431 and b"exceed 4096 bytes" in answer, answer[:200]
        # A client that keeps sending (the 64 MiB header) is cut off, not buffered.
        with connect(srv) as s, pytest.raises(OSError):  # BrokenPipe or ConnectionReset
            s.sendall(GET + b"X-Big: ")
            for _ in range(512):  # 32 MiB, far beyond what the kernel's socket buffers hold
                s.sendall(b"a" * 65536)
        assert get(srv.url, "/healthz").status_code == 200  # the server itself is fine
    finally:
        srv.stop()


def test_a_body_over_the_limit_is_413_and_the_connection_closes(parser):
    srv = limited()
    try:
        with connect(srv) as s:
            s.sendall(GET + b"Content-Length: 100000\r\n\r\n")  # declared: refused before it is sent
            answer = read_until_closed(s)
        assert status_of(answer) == 413 and b"exceeds 1024 bytes" in answer, answer[:200]
        with connect(srv) as s:
            s.sendall(GET + b"Transfer-Encoding: chunked\r\n\r\n800\r\n" + b"b" * 2048 + b"\r\n0\r\n\r\n")
            answer = read_until_closed(s)
        assert status_of(answer) == 413, answer[:200]
        with connect(srv) as s:  # a body within the limit is passed on and answered
            s.sendall(GET + b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
            assert status_of(read_until_closed(s)) == 200
    finally:
        srv.stop()


def test_a_silent_connection_and_a_trickling_head_are_closed(parser):
    srv = limited()
    try:
        with connect(srv) as silent, connect(srv) as trickle:
            trickle.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
            closed = False
            end = time.monotonic() + DEADLINE
            while not closed and time.monotonic() < end:  # a byte per 50 ms until the server hangs up
                try:
                    trickle.sendall(b"a")
                except OSError:
                    break
                closed = bool(select.select([trickle], [], [], 0.05)[0])
            try:
                answer = read_until_closed(trickle)
            except ConnectionResetError:  # a byte sent just after the server closed: the reset may drop its 408
                answer = b"HTTP/1.1 408 (reset)"
            assert status_of(answer) == 408
            assert status_of(read_until_closed(silent)) == 408  # never sent a byte
    finally:
        srv.stop()


def test_an_idle_keep_alive_connection_is_closed(parser):
    srv = limited()
    try:
        with connect(srv) as s:
            s.sendall(GET + b"\r\n")
            answer = read_until_closed(s)  # answered, then closed once idle for keep_alive_timeout
        assert status_of(answer) == 200 and answer.count(b"HTTP/1.1 ") == 1
    finally:
        srv.stop()


def test_connections_beyond_the_cap_are_503_at_once(parser):
    srv = limited(ServerLimits(max_connections=3, request_timeout=DEADLINE, keep_alive_timeout=DEADLINE))
    held = [connect(srv) for _ in range(3)]
    try:
        for s in held:  # each answered, so the server has counted it; each stays open (keep-alive)
            s.sendall(GET + b"\r\n")
            assert status_of(s.recv(65536)) == 200
        with connect(srv) as extra:
            answer = read_until_closed(extra)
        assert status_of(answer) == 503 and b"more than 3 open connections" in answer, answer[:200]
        held.pop().close()
        end, answered = time.monotonic() + DEADLINE, 0
        while answered != 200 and time.monotonic() < end:  # the server sees the close on its next turn
            with connect(srv) as s:
                s.sendall(GET + b"Connection: close\r\n\r\n")
                answered = status_of(read_until_closed(s))
        assert answered == 200
    finally:
        for s in held:
            s.close()
        srv.stop()


def test_server_limits_are_checked():
    with pytest.raises(ValueError, match="max_head_bytes must be an integer >= 1"):
        ServerLimits(max_head_bytes=0)
    with pytest.raises(ValueError, match="request_timeout must be a number of seconds > 0"):
        ServerLimits(request_timeout=float("inf"))
    with pytest.raises(TypeError, match="ServerLimits"):
        StatusServer(StatusSnapshot(), limits={"max_connections": 3})
