"""The API's pydantic models (built on first use so ``import auturi.server`` stays light) and the
value sets its parameters accept."""
from typing import Annotated, Any, Literal

from auturi.server.shape import _finite

PHASES = ("idle", "baseline", "profiling", "search", "final", "confirm", "done", "failed", "explore", "locked", "research", "paused")
TRIAL_STATUSES = ("running", "ok", "invalid", "failed")
TRIAL_SOURCES = ("start", "serial", "cache", "search", "final", "confirm", "online", "research")


def _config_model() -> Any:
    """One layout as a pydantic model: the knobs :meth:`auturi.Config.knob_names` declares,
    with Config's types; every integer knob is at least 1."""
    import typing

    from pydantic import Field, create_model

    from auturi.config import Config

    hints = typing.get_type_hints(Config)
    fields = {k: (hints[k], Field(ge=1) if hints[k] is int else ...) for k in Config.knob_names()}
    return create_model("ConfigModel", __doc__="One layout (:class:`auturi.Config`).", **fields)


def _models() -> dict[str, Any]:
    """Pydantic models, built on first use so ``import auturi.server`` stays light."""
    from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

    Num = Annotated[float | None, BeforeValidator(_finite)]

    ConfigModel = _config_model()

    class BudgetModel(BaseModel):
        trials: int | None = Field(None, description="Trials allowed (None: the strategy's own stop)")
        trials_left: int | None = None
        seconds: Num = Field(None, description="Wall seconds allowed for the search")
        seconds_left: Num = None

    class TimeSplitModel(BaseModel):
        """Where the latest recorded collect's time went. The parts are summed over actors, so
        with several actors they can exceed the wall ``seconds``."""

        seconds: Num = Field(None, description="Wall seconds of the collect")
        env_seconds: Num = Field(None, description="Stepping envs")
        policy_seconds: Num = Field(None, description="Inference")
        wait_seconds: Num = Field(None, description="Actors blocked waiting for a worker")
        label: str = Field("", description="The layout it ran under")

    class TotalsModel(BaseModel):
        wall: Num = None
        env_seconds: Num = None
        policy_seconds: Num = None
        wait_seconds: Num = None

    class ActorPlaceModel(BaseModel):
        """Where one actor runs (``ray`` backend)."""

        actor: int
        envs: list[int] = Field(description="Its first and last global env index")
        node: str = Field(description="The Ray node id")
        ip: str = ""
        pid: int = 0

    class StatusModel(BaseModel):
        """Where tuning stands."""

        model_config = ConfigDict(json_schema_extra={"example": {"phase": "search", "trials_done": 4}})

        phase: str = Field(description=f"One of {', '.join(PHASES)} (or what the source reports)")
        mode: str | None = Field(None, description="offline or online")
        strategy: str | None = None
        current_config: ConfigModel | None = Field(None, description="The config being measured now")
        current_config_label: str = ""
        current_samples: int = 0
        best_config: ConfigModel | None = None
        best_config_label: str = ""
        best_throughput: Num = Field(None, description="Best throughput measured: the median of its samples (env steps/s)")
        best_half_width: Num = Field(None, description="Larger distance from that median to an end of its interval (steps/s)")
        best_low: Num = Field(None, description="Lower end of the median's distribution-free interval (steps/s)")
        best_high: Num = Field(None, description="Upper end of that interval (steps/s)")
        best_confidence: Num = Field(None, description="The interval's exact confidence (0..1)")
        throughput_now: Num = Field(None, description="Throughput of the latest measured collect (steps/s)")
        throughput_now_age_seconds: Num = None
        trials_done: int = 0
        trials_ok: int = 0
        budget: BudgetModel
        elapsed_seconds: Num = None
        cache_hit: bool | None = None
        space: dict[str, Any] | None = None
        hardware: dict[str, Any] = Field(default_factory=dict, description="The hardware fingerprint")
        extra: dict[str, Any] = Field(default_factory=dict, description="Other fields the source reports")
        snapshot_age_seconds: Num = Field(None, description="Seconds since the source last published")
        server_time: float
        situation: Literal["tuning", "training"] = Field(
            "tuning", description="tuning: an offline search (auturi tune); training: collects of a training run")
        searching: bool = Field(False, description="The tuner is still measuring (its budget applies)")
        env: str | None = Field(None, description="The env being collected from")
        best_config_code: str = Field("", description="The best config as Python: auturi.Config(...)")
        steps_total: int | None = Field(None, description="Env steps of the recorded training collects")
        collects_total: int | None = None
        seconds_total: TotalsModel | None = Field(None, description="Seconds of the recorded collects, summed")
        time_split: TimeSplitModel | None = None
        actors: list[ActorPlaceModel] | None = Field(None, description="Where each actor runs (ray backend)")

    class TrialModel(BaseModel):
        """One measured config with all its samples."""

        index: int
        config: ConfigModel | None
        label: str
        source: str = ""
        status: str = ""
        stop_reason: str = ""
        error: str | None = None
        mean: Num = Field(None, description="Throughput estimate: the median of the samples (steps/s)")
        half_width: Num = Field(None, description="Larger distance from the median to an end of its interval (steps/s)")
        low: Num = Field(None, description="Lower end of the median's distribution-free interval (steps/s)")
        high: Num = Field(None, description="Upper end of that interval (steps/s)")
        confidence: Num = Field(None, description="The interval's exact confidence (0..1; none below 3 samples)")
        n: int = 0
        samples: list[Num] = Field(default_factory=list)
        warmup: list[Num] = Field(default_factory=list)
        reconfigure_seconds: Num = None
        predicted: Num = None
        started: Num = None
        seconds: Num = None

    class TrialsModel(BaseModel):
        total: int = Field(description="Trials matching the filters, before offset and limit")
        offset: int
        trials: list[TrialModel]

    class HistoryPointModel(BaseModel):
        """One recorded training collect."""

        at: float = Field(description="Wall time it ended (Unix seconds)")
        steps: int | None = None
        seconds: Num = None
        steps_per_second: Num = None
        env_seconds: Num = None
        policy_seconds: Num = None
        wait_seconds: Num = None
        config: ConfigModel | None = None
        label: str = ""

    class HistoryModel(BaseModel):
        points: list[HistoryPointModel]

    class HealthModel(BaseModel):
        status: Literal["ok"] = "ok"
        phase: str
        uptime_seconds: float

    class ErrorModel(BaseModel):
        detail: Any

    return {k: v for k, v in locals().items() if isinstance(v, type) and issubclass(v, BaseModel)}
