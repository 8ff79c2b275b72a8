"""Settings from ``CONVEYOR_*`` environment variables.

With nothing set, the embedded default applies: SQLite under ``./.conveyor/``, an in-process
broker and worker threads inside the ``conveyor`` process.
"""

from __future__ import annotations

import json
from datetime import timedelta
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from conveyor.engine.addresses import AllowList
from conveyor.engine.bounds import Bounds

EMBEDDED_DIR = Path(".conveyor")


class Settings(BaseSettings):
    """Everything an operator may set. Each field is ``CONVEYOR_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="CONVEYOR_", extra="ignore")

    database_url: str = Field(
        default="",
        description="SQLAlchemy URL (postgresql+psycopg://user:password@host/db); empty means "
        "SQLite under ./.conveyor/ (embedded).",
    )
    broker_url: str = Field(
        default="",
        description="Celery broker URL (redis://host:6379/0); empty means the in-process broker.",
    )
    redis_url: str = Field(
        default="", description="Redis for semaphores; defaults to the broker when it is Redis."
    )
    imports: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Modules to import at start-up, comma-separated; they register node functions.",
    )
    apply_modules: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Modules whose workflows written in Python (conveyor.Flow) a worker stores "
        "at start-up for the default tenant, comma-separated (as `conveyor workflow apply "
        "--module`).",
    )
    promote_interval: float = Field(
        default=0.5, gt=0, description="Seconds between checks for due retries and delays."
    )
    embedded_workers: int = Field(default=4, ge=1, description="Worker threads when embedded.")
    visibility_timeout: int = Field(
        default=3600, ge=60, description="Redis transport redelivery timeout, in seconds."
    )

    limits_enabled: bool = Field(
        default=True,
        description="Enforce the concurrency limits (needs Redis); false runs without them.",
    )
    limit_global: int = Field(default=100, ge=1, description="Node jobs running at once, in all.")
    limit_tenant: int = Field(
        default=10, ge=1, description="Node jobs of one tenant running at once (tenant default)."
    )
    limit_workflow: int = Field(
        default=5, ge=1, description="Node jobs of one workflow running at once (its default)."
    )
    permit_lease: float = Field(
        default=30.0,
        ge=0.5,
        le=3600,
        description="Seconds a permit outlives its last heartbeat; a dead worker's permits "
        "come back after this. Heartbeats renew it every third of it.",
    )
    limits_sweep_interval: float = Field(
        default=2.0, gt=0, description="Seconds between sweeps for expired permits and lost wakes."
    )
    age_low_after: float = Field(
        default=300.0,
        gt=0,
        description="Seconds after which a waiting low-priority job is served as normal.",
    )

    schedule_check_interval: float = Field(
        default=60.0,
        ge=1,
        le=3600,
        description="Seconds between the due checks beat sends; 60 checks at second 0 of "
        "every minute.",
    )
    schedule_misfire_grace: float = Field(
        default=120.0,
        gt=0,
        description="Seconds after its slot within which a check still counts a run as on "
        "time; an older slot is a misfire, handled by the schedule's policy.",
    )

    http_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="What the http node may call beyond globally reachable addresses, "
        "comma-separated: addresses or networks (10.0.0.0/8, 127.0.0.1, fd00::/8), host names "
        "(billing.internal: whatever it resolves to) and *.domain (every name below it).",
    )
    http_max_response_bytes: int = Field(
        default=4_194_304,
        ge=1,
        description="The largest response body the http node reads (after decompression), in "
        "bytes; a larger one fails the node without a retry.",
    )
    http_max_redirects: int = Field(
        default=5,
        ge=0,
        le=20,
        description="Redirects the http node follows, each checked like the first URL; 0 "
        "follows none (a 3xx answer fails the node).",
    )

    template_timeout: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="Seconds one render of a node's templates (or a trigger's) may take; in a "
        "worker the node's timeout, when shorter, bounds it too. Past it the node fails, not "
        "retried (a trigger answers 422).",
    )
    template_max_operations: int = Field(
        default=100_000,
        ge=100,
        description="Loop iterations, calls and filters one render may do (the longest "
        "range() too).",
    )
    template_max_size: int = Field(
        default=1_000_000,
        ge=1000,
        description="The largest string, list or dict a template may make, and its largest "
        "text, in characters (about the value's length as JSON).",
    )

    webhook_max_bytes: int = Field(
        default=1_048_576, ge=1024, description="The largest webhook body accepted, in bytes."
    )
    max_input_bytes: int = Field(
        default=1_048_576,
        ge=1024,
        description="The largest trigger body (POST /v1/workflows/{name}/executions: its "
        "input) the API reads, in bytes; a larger one answers 413.",
    )
    max_event_bytes: int = Field(
        default=1_048_576,
        ge=1024,
        description="The largest application event body (POST /v1/events: its payload), in "
        "bytes; a larger one answers 413.",
    )
    max_definition_bytes: int = Field(
        default=4_194_304,
        ge=1024,
        description="The largest workflow definition (a file, or the body of POST "
        "/v1/workflows), in bytes; a larger one answers 413.",
    )
    max_nodes: int = Field(
        default=10_000, ge=1, description="Nodes one definition may have; more answers 422."
    )
    max_needs: int = Field(
        default=10_000, ge=1, description="Needs one node may list; more answers 422."
    )
    max_json_depth: int = Field(
        default=64,
        ge=8,
        le=200,
        description="How deep any JSON value may nest (inputs, payloads, definitions, node "
        "outputs); deeper answers 422, or fails the node. At most 200: stored values must "
        "stay readable.",
    )
    max_child_depth: int = Field(
        default=8,
        ge=1,
        le=100,
        description="How deep child executions (workflow nodes) may nest: a workflow node "
        "that would start a child deeper fails, not retried. Bounds workflows that start "
        "each other in a circle.",
    )
    event_retention_seconds: float = Field(
        default=604_800.0,
        gt=0,
        le=31_536_000,
        description="How long an application event sent with a key is kept for the wait "
        "nodes that begin after it arrived (a wait takes the earliest kept event of its key "
        "that came since its execution started); the retention sweep deletes it then. At "
        "most a year.",
    )
    max_children: int = Field(
        default=1000,
        ge=1,
        description="Child executions one execution may start, in all (each try of a "
        "workflow node starts one): a workflow node that would start one more fails, not "
        "retried. Bounds how wide a tree of children grows, as CONVEYOR_MAX_CHILD_DEPTH "
        "bounds how deep.",
    )
    max_output_bytes: int = Field(
        default=1_048_576,
        ge=1024,
        le=268_435_455,  # PostgreSQL's largest jsonb value: past it the insert itself fails
        description="The largest output a node may return, as JSON, in bytes (a map's: its "
        "items' outputs together); a larger one fails the node without a retry. At most "
        "268435455, PostgreSQL's largest jsonb value.",
    )
    api_host: str = Field(default="127.0.0.1", description="Where `conveyor api` listens.")
    api_port: int = Field(
        default=8000, ge=1, le=65535, description="The port `conveyor api` listens on."
    )
    streams_per_tenant: int = Field(
        default=100,
        ge=1,
        description="Live status streams (GET /v1/executions/{id}/events, GET /v1/stream) one "
        "tenant may hold open at once in one API process; one more answers 429.",
    )
    streams_per_process: int = Field(
        default=2000,
        ge=1,
        description="Live status streams one API process holds open at once, all tenants "
        "together; one more answers 429. They share one database connection.",
    )
    streams_keepalive: float = Field(
        default=15.0,
        gt=0,
        description="Seconds a live stream may stay silent before it sends a comment line, "
        "so that proxies do not close idle streams.",
    )
    webhook_replay_window_days: float = Field(
        default=30.0,
        gt=0,
        description="A GitHub-signed body an endpoint received less than this many days ago "
        "is refused (409) whatever its delivery id: GitHub signs the body only.",
    )
    metrics_token: str = Field(
        default="",
        description="The bearer token a scraper sends to read /metrics (Authorization: "
        "Bearer <token>); empty: the API's port does not serve /metrics (403).",
    )
    ui_secret: str = Field(
        default="",
        description="Signs the web dashboard's (/ui) session cookies together with each "
        "API key's session secret, which the database keeps (made at sign-in, cleared at "
        "sign-out): processes on one database read each other's cookies with or without it. "
        "Set it (the same on every API process) so that reading the database is not enough "
        "to forge a session.",
    )
    metrics_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="`conveyor api` also serves /metrics on a listener of its own on this "
        "port (the token is required there too when set); 0: none.",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="Where the metrics listener of CONVEYOR_METRICS_PORT listens.",
    )
    metrics_workflow_label: bool = Field(
        default=True,
        description="conveyor_job_run_seconds is labelled by workflow name as well as queue; "
        "false: by queue alone. Tenants name workflows (POST /v1/workflows), so with the "
        "label they decide how many series there are: 17 for each name that ever ran, kept "
        "forever.",
    )

    heartbeat_interval: float = Field(
        default=5.0, gt=0, description="Seconds between a running node job's heartbeats."
    )
    heartbeat_timeout: float = Field(
        default=60.0,
        gt=0,
        description="A processing job whose heartbeat is older is reclaimed (its worker died).",
    )
    retention_days: float = Field(
        default=14.0,
        ge=0,
        description="Finished executions (their jobs, tries and node states) older than this "
        "many days are deleted by the retention sweep; 0 keeps them forever. Executions with "
        "a dead letter are kept: one a requeue could resume until it is requeued or "
        "discarded, one discarded to the archive for CONVEYOR_ARCHIVE_RETENTION_DAYS (a "
        "map's dead items and a child's dead letters, which cannot be requeued, hold nothing "
        "back; a child goes no sooner than its parent).",
    )
    archive_retention_days: float = Field(
        default=0.0,
        ge=0,
        description="Dead letters discarded to the archive (kept for audit) more than this "
        "many days ago are deleted with their execution by the retention sweep, once it is "
        "past CONVEYOR_RETENTION_DAYS too; 0 keeps the archive forever.",
    )
    beat_heartbeat_file: str = Field(
        default="",
        description="A file celery beat touches after every tick, for a liveness check "
        "(python -m conveyor.scheduler.heartbeat exits 1 when it is stale); empty: none.",
    )
    retention_interval: float = Field(
        default=600.0, ge=1, description="Seconds between retention sweeps (sent by beat)."
    )
    recover_interval: float = Field(
        default=30.0, ge=1, description="Seconds between recovery sweeps (sent by beat)."
    )
    lost_after: float = Field(
        default=60.0,
        gt=0,
        description="A job queued this long is re-published if the broker cannot hold its "
        "message; a job re-published (or a lost parked one) is not re-published again for as "
        "long, by any process.",
    )
    batch_most: int = Field(
        default=8,
        ge=1,
        le=100,
        description="Node jobs made ready together travel in messages of up to this many, "
        "run one after another by one worker; 1 sends each alone.",
    )
    batch_budget: float = Field(
        default=0.05,
        ge=0,
        description="Seconds a batch message runs (or one of its jobs, a quarter of them) "
        "before the jobs it has not started are handed back, one a message, for other "
        "workers: slow siblings stay parallel.",
    )
    continue_steps: int = Field(
        default=16,
        ge=0,
        le=1000,
        description="A worker whose node's success makes exactly one node ready (a chain's "
        "next step) claims and runs it itself, in the success's transaction, no message: at "
        "most this many steps in a row, and only while no job of a higher priority waits in "
        "its queue; 0 publishes every step.",
    )
    map_window: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="A map's items queued or running at once (a map's concurrency, if lower, "
        "wins); the others wait in the database, each released as an item settles.",
    )
    map_max_items: int = Field(
        default=100_000,
        ge=1,
        description="The longest list a map runs (a map's max_items, if lower, wins); a "
        "longer one fails the node without a retry.",
    )
    task_events: bool = Field(
        default=True, description="Send Celery task events (Flower needs them)."
    )
    log_format: str = Field(
        default="json",
        pattern="^(json|console)$",
        description="Logs: json (one object a line) or console; the conveyor command and its API "
        "are console unless this is set.",
    )
    tracing: str = Field(
        default="none",
        pattern="^(none|console|otlp)$",
        description="OpenTelemetry exporter this process installs: none (spans go to the "
        "provider the application set, if any), console (JSON on stderr) or otlp (to "
        "OTEL_EXPORTER_OTLP_ENDPOINT; needs the otlp extra).",
    )
    alert_interval: float = Field(
        default=60.0, ge=1, description="Seconds between alert evaluations (one worker a turn)."
    )
    alert_webhook_url: str = Field(
        default="",
        description="Where firing and resolved alerts are posted as JSON; empty: log only.",
    )
    alert_queue_depth: int = Field(
        default=1000, ge=0, description="Alert above this many queued messages."
    )
    alert_wait_p95: float = Field(
        default=60.0, ge=0, description="Alert when 95 % of recent tries waited longer (s)."
    )
    alert_error_rate: float = Field(
        default=0.25, ge=0, le=1, description="Alert above this failed share of recent tries."
    )
    alert_dead_letter_growth: int = Field(
        default=1, ge=1, description="Alert at this many new dead letters."
    )
    alert_schedule_lag: float = Field(
        default=300.0, ge=0, description="Alert when a due schedule is this late (s)."
    )
    alert_wait_age: float = Field(
        default=86_400.0,
        ge=0,
        description="Alert when a wait node has waited this long for its event (s).",
    )

    @field_validator("imports", "apply_modules", "http_allow", mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        # CONVEYOR_IMPORTS=app.nodes,app.more; a JSON list is accepted too
        if isinstance(value, str) and value.lstrip().startswith("["):
            return json.loads(value)
        if isinstance(value, str):
            return [m.strip() for m in value.split(",") if m.strip()]
        return value

    @field_validator("http_allow")
    @classmethod
    def _check_http_allow(cls, value: list[str]) -> list[str]:
        AllowList.parse(value)  # a ValueError names the entry that is none of the kinds
        return value

    @cached_property
    def bounds(self) -> Bounds:
        """The size and shape bounds of inputs and outputs (CONVEYOR_MAX_*), made once."""
        return Bounds(
            input_bytes=self.max_input_bytes,
            event_bytes=self.max_event_bytes,
            definition_bytes=self.max_definition_bytes,
            nodes=self.max_nodes,
            needs=self.max_needs,
            json_depth=self.max_json_depth,
            output_bytes=self.max_output_bytes,
            map_items=self.map_max_items,
            children=self.max_children,
        )

    @property
    def embedded(self) -> bool:
        """True when no broker is configured: workers run as threads in this process."""
        return not self.broker_url or self.broker_url.startswith("memory://")

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(EMBEDDED_DIR / 'conveyor.db').resolve()}"

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or "memory://localhost/"

    @property
    def resolved_redis_url(self) -> str | None:
        """Where the semaphores live: CONVEYOR_REDIS_URL, else a Redis broker, else nowhere."""
        if self.redis_url:
            return self.redis_url
        if self.broker_url.startswith(("redis://", "rediss://")):
            return self.broker_url
        return None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()


def archive_retention(days: float) -> timedelta | None:
    """CONVEYOR_ARCHIVE_RETENTION_DAYS as the retention sweep takes it: how long ago a dead
    letter must have been discarded for its execution to be deleted; None (0) keeps the
    archive forever."""
    return timedelta(days=days) if days else None
