"""Job configuration: flags beat COMPACTD_* environment variables beat the YAML file (docs/contract.md)."""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from compactd.errors import ConfigError
from compactd.kafka.config import KafkaConnection, KafkaValue
from compactd.policy.readers import ReaderSpec
from compactd.policy.thresholds import validate_layer

_yaml_file: ContextVar[Path | None] = ContextVar("compactd_yaml_file", default=None)

if TYPE_CHECKING:
    from compactd.state.redis_store import RedisState


class TopicNames(BaseModel):
    """Names of compactd's own topics; every one is configurable so several deployments can share a cluster."""

    model_config = ConfigDict(extra="forbid")

    segments: str = Field(
        "compactd.segments", description="Segment events in (`segment_rolled`, `compacted`, `log_start`)."
    )
    commits: str = Field(
        "compactd.commits",
        description="Commit events in (JSON), read when `offsets_source` is `commits` or `admin`; "
        "compacted, keyed `<group>/<topic>/<partition>`.",
    )
    config: str = Field(
        "compactd.config", description="Config events in (threshold changes at run time); kept forever."
    )
    actions: str = Field("compactd.actions", description="Action records out: every decision, dry-run or not.")
    dlq: str = Field("compactd.dlq", description="Rejected input out (dead-letter queue), with the reason.")
    consumer_offsets: str = Field(
        "__consumer_offsets", description="Kafka's own offsets topic, read when `offsets_source` is `consumer_offsets`."
    )
    compactions: str = Field(
        "compactd.compactions",
        description="The compaction service's manifests (compacted, keyed `<topic>/<generation>/<run>`).",
    )
    nudges: str = Field(
        "compactd.nudges",
        description="What each compaction nudge replaced, until put back (compacted): nudges are undone even "
        "after a Redis loss.",
    )
    agent: str = Field(
        "compactd.agent", description="The admin agent's poll marks (compacted, keyed `admin/<cluster>`)."
    )
    view_suffix: str = Field(
        ".compacted", min_length=1, description="A topic's compacted view is named `<topic><view_suffix>`."
    )


class MetricsSettings(BaseModel):
    """How many series the job exports and how often it samples what it cannot see in its batches."""

    model_config = ConfigDict(extra="forbid")

    top_n: int = Field(
        100,
        ge=0,
        le=100_000,
        description="Per-partition series only for the top-N worst partitions of each metric (per-topic aggregates "
        "always); raise it to see more partitions, lower it to cut Prometheus cardinality.",
    )
    sample_interval_ms: int = Field(
        15_000,
        ge=1_000,
        description="How often the job samples source lag (ListOffsets) and Redis size for its gauges.",
    )


class Settings(BaseSettings):
    """Every job setting. Each field's `description` is its documentation: `make docs` renders them into
    docs/configuration.md (app/config_doc.py), so a setting is explained in one place, next to its type and default."""

    model_config = SettingsConfigDict(env_prefix="COMPACTD_", env_nested_delimiter="__", extra="forbid")

    bootstrap_servers: str = Field(
        "127.0.0.1:9092",
        description="Kafka bootstrap servers (`host:port`, comma-separated) of the cluster this job watches.",
    )
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis holding the job's state. TLS: a `rediss://` URL, with `?ssl_ca_certs=/path/ca.pem` "
        "(redis-py URL options) when the CA is private.",
    )
    checkpoint_dir: str = Field(
        "/var/lib/compactd/checkpoint",
        description="Spark checkpoint directory: a restart with the same one resumes exactly; a new one re-reads "
        "the sources from their start.",
    )
    trigger_interval_ms: int = Field(
        1000, gt=0, description="How often a micro-batch starts: lower reacts sooner, higher costs less."
    )
    thresholds: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="The base threshold layers: scope (`global`, `topic:<name>`, `partition:<topic>/<n>`) → "
        "threshold keys (below); config events override them key by key.",
    )
    readers: dict[str, ReaderSpec] = Field(
        default_factory=dict,
        description="Readers that commit no group offsets (a Spark query, Flink, an export), each counted like a "
        "group: name → `{spark_checkpoint: DIR}` (the query's latest committed batch; local path, or any Hadoop "
        "filesystem Spark reaches) or `{pin: {topic: {partition: offset}}, expires_ms: EPOCH_MS}` (a fixed position "
        "with a lease); either may add `subscribe_pattern: REGEX` (a query's `subscribePattern`: a matching topic it "
        "has no position on is held whole). They join the threshold layers as `reader:<name>` scopes, which config "
        "events change too.",
    )
    topics: TopicNames = Field(default_factory=TopicNames, description="Names of compactd's own topics.")
    offsets_source: Literal["commits", "consumer_offsets", "admin"] = Field(
        "consumer_offsets",
        description="Where committed offsets come from. `consumer_offsets`: Kafka's own record of every group "
        "(compacted by Kafka: a rebuild from its start sees every live commit); `commits`: a JSON topic some producer "
        "writes, where compactd may not read `__consumer_offsets`; `admin`: the commits topic as "
        "`compactd agent --admin` writes it (managed clusters, compactd only a client), and no delete before the "
        "agent's first complete poll.",
    )
    kafka: dict[str, KafkaValue] = Field(
        default_factory=dict,
        description="Extra librdkafka settings for every client (`security.protocol`, `sasl.*`, `ssl.*`); they "
        "beat compactd's defaults; YAML ints and booleans are taken as they are written.",
    )
    config_secrets: list[SecretStr] = Field(
        default_factory=list,
        description="HMAC secrets for config events (env: a JSON list); any one verifies, the first signs. "
        "Empty: events are not signed. Rotate by listing `[new, old]`, then dropping `old`.",
    )
    # Extensions beyond the contract.
    redis_prefix: str = Field("cd", description="Every Redis key of this job starts with `<redis_prefix>:<cluster>:`.")
    cluster: str = Field(
        "default",
        pattern=r"^[A-Za-z0-9._-]{1,64}$",
        description="The Kafka cluster this job watches: part of every Redis key, action record and metric, so jobs "
        "for several clusters share one Redis, one Prometheus and one set of dashboards.",
    )
    redis_password: SecretStr | None = Field(
        None, description="Redis AUTH without putting the password in the URL; never logged."
    )
    redis_cluster: bool = Field(
        False,
        description="`redis_url` names any node of a Redis Cluster; the client finds the others (redis-py's "
        "RedisCluster).",
    )
    max_rows_per_trigger: int = Field(
        500_000,
        gt=0,
        description="Kafka records per micro-batch at most, also on catch-up under `run --once`: lower keeps "
        "batches short, higher catches up faster.",
    )
    evaluation_slices: int = Field(
        0,
        ge=0,
        le=4096,
        # its first name (`evaluation_shares`, `COMPACTD_EVALUATION_SHARES`) is still read: an old config keeps
        # its slices rather than falling back to the driver unnoticed. An env source takes aliases as full names.
        validation_alias=AliasChoices(
            "evaluation_slices", "evaluation_shares", "compactd_evaluation_slices", "compactd_evaluation_shares"
        ),
        description="Where a batch's per-topic work runs (merge into Redis, the bulk plan of quiet partitions): 0 = "
        "on the driver; N = in N Spark tasks, each owning a slice of the topics. The driver keeps group-level "
        "changes, the full plans, the outbox and the metrics either way. Its former name `evaluation_shares` is "
        "still read.",
    )
    max_event_bytes: int = Field(
        64 * 1024, gt=0, description="Largest input event accepted; a larger one goes to the DLQ as `oversized`."
    )
    metrics_port: int = Field(0, ge=0, description="Prometheus /metrics port on the driver; 0 = off.")
    metrics: MetricsSettings = Field(default_factory=MetricsSettings, description="Prometheus series of the job.")
    spark_master: str = Field(
        "local[2]",
        description="Spark master URL; `local[N,F]` retries each task F times (deploy/submit sets the master itself).",
    )
    executor_check_timeout_ms: int = Field(
        120_000,
        gt=0,
        description="On a cluster: every executor must import compactd (same version) within this long, checked "
        "before the stream starts.",
    )
    starting_offsets: Literal["earliest", "latest"] = Field(
        "earliest",
        description="Where a new checkpoint starts reading the sources: `earliest` builds the state from their start, "
        "`latest` skips what is already there. A rebuild after a state loss always reads from the start.",
    )
    spark_kafka: dict[str, KafkaValue] = Field(
        default_factory=dict,
        description="Java client settings for Spark's Kafka connector, which reads the sources (e.g. "
        "`sasl.jaas.config`, `ssl.truststore.location`), given as they are. The security settings of `kafka:` are "
        "translated for it already (SASL PLAIN/SCRAM user and password, PEM CA, certificate and key); these win.",
    )
    create_topics: bool = Field(
        True,
        description="Create compactd's own topics when missing (needs Create on them); off where they are "
        "provisioned by other means.",
    )
    topics_replication_factor: int = Field(
        -1,
        ge=-1,
        description="Replicas of the topics compactd creates; -1 = the cluster's `default.replication.factor`.",
    )
    cluster_offsets_check: bool = Field(
        True,
        description="Right before a consumed-retention delete, read the committed offsets of the topic's groups from "
        "the cluster (ListGroups + OffsetFetch) and skip a delete past any counted group's offset there. compactd's "
        "principal needs Describe on the groups; off only where the cluster refuses it.",
    )
    cluster_check: Literal["on", "strict", "off"] = Field(
        "on",
        description="`on`: the check above; `strict`: a group compactd counts on the topic that the cluster does "
        "not list (ACLs, or a group gone) also holds the delete; `off`: same as `cluster_offsets_check` false. With "
        "`offsets_source: admin`, `on` acts as `strict`: every group compactd counts there is a Kafka group, and one "
        "the cluster stops listing holds until the agent's group_delete (after its grace).",
    )
    cluster_offsets_ttl_ms: int = Field(
        5_000, ge=0, description="How long the offsets read by the check above are kept before they are read again."
    )
    topic_check_interval_ms: int = Field(
        60_000,
        gt=0,
        description="How often the known topics are checked against the cluster (one DescribeTopics round): a "
        "changed topic ID resets a re-created topic's state, a topic missing from two checks in a row is forgotten.",
    )
    redis_retry_max_ms: int = Field(
        10_000,
        gt=0,
        description="While Redis does not answer, a batch waits and is retried with backoff doubling up to this long.",
    )
    compaction_check_interval_ms: int = Field(
        5_000,
        gt=0,
        description="How often the job checks the topics with `compaction.service` on for a due run (one "
        "ListOffsets per topic).",
    )
    compaction_lease_ms: int = Field(
        10_000,
        ge=1_000,
        description="A compaction run holds its topic's lease this long past its last renewal (renewed every "
        "quarter of it; a failed renewal ends the run): a run killed with -9 on another host blocks the next one "
        "for at most this long (on the same host its pid is seen gone at once).",
    )
    compaction_task_records: int = Field(
        250_000,
        ge=1,
        description="A compaction task reads a partition with at most this many records once, holding each key's "
        "winner whole while `compaction_task_map_mb` holds its bytes; a larger one, or one the budget cannot hold, "
        "twice, as Kafka's cleaner does (only its keys held, in a map). Also what a Python task of the shuffle path "
        "holds before handing it to Spark.",
    )
    compaction_task_map_mb: int = Field(
        256,
        ge=1,
        description="The bytes the compaction tasks of one JVM hold together, and never more than a quarter of its "
        "heap: the winners of one-pass reads with their values, and the key maps of two-pass ones (about 40 bytes "
        "for a 10-byte key under `offset`, 65 under the other strategies). One budget per JVM, not per task: in "
        "local mode the tasks run in the driver, one per core at once. A one-pass read it cannot hold reads its "
        "partition twice; a map it cannot hold sends its partition through Spark's shuffle, which spills.",
    )
    compaction_read_stall_ms: int = Field(
        120_000,
        ge=100,
        description="A compaction task's read of a range fails (Spark retries the task; the run fails after its "
        "retries) once it has read nothing new for this long. A deadline on progress, not on the range: a range that "
        "keeps moving takes as long as it needs (1M offsets of 20 KB records do).",
    )
    stop_timeout_ms: int = Field(
        120_000,
        ge=0,
        description="SIGTERM: finish the running batch and drain the outbox within this long, else exit 1 (a second "
        "SIGTERM: at once).",
    )

    @field_validator("thresholds")
    @classmethod
    def _valid_layers(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {scope: validate_layer(scope, layer) for scope, layer in value.items()}

    @model_validator(mode="after")
    def _readers_as_layers(self) -> Settings:
        """`readers:` joins the base layers as `reader:<name>` scopes: one place where readers are read, whether the
        file or a config event declared them."""
        for name, spec in self.readers.items():
            scope = f"reader:{name}"
            if scope in self.thresholds and self.thresholds[scope] != spec.model_dump(exclude_none=True):
                raise ValueError(f"reader {name!r} is declared both in readers: and as thresholds scope {scope}")
            self.thresholds[scope] = spec.model_dump(exclude_none=True)
        return self

    def kafka_connection(self) -> KafkaConnection:
        return KafkaConnection(self.bootstrap_servers, dict(self.kafka))

    @property
    def strict_groups(self) -> bool:
        """Whether a counted group the cluster does not list holds a delete (`cluster_check`). With the admin source
        every counted group came from the cluster: one no longer listed was deleted (or hidden by an ACL) and
        holds until the agent publishes its deletion, as `__consumer_offsets` would have said it at once."""
        return self.cluster_check == "strict" or (self.offsets_source == "admin" and self.cluster_check != "off")

    def own_topics(self) -> list[str]:
        t = self.topics
        return [t.segments, t.commits, t.config, t.actions, t.dlq, t.compactions, t.nudges, t.agent]

    def own_topic_configs(self) -> dict[str, dict[str, str]]:
        """Config events are deltas: their topic keeps every one (no time retention, no compaction). The commits
        topic is compacted, keyed `<group>/<topic>/<partition>`: a rebuild from its start sees every group's last
        commit on each partition however long ago it was made, where time retention would drop the quiet groups."""
        return {
            self.topics.commits: {"cleanup.policy": "compact"},
            self.topics.config: {"retention.ms": "-1", "cleanup.policy": "delete"},
            self.topics.compactions: {"retention.ms": "-1", "cleanup.policy": "compact"},
            self.topics.nudges: {"retention.ms": "-1", "cleanup.policy": "compact"},
            self.topics.agent: {"retention.ms": "-1", "cleanup.policy": "compact"},
        }

    @property
    def offsets_topic(self) -> str:
        """Where the job reads committed offsets: `__consumer_offsets`, or the JSON commits topic."""
        return self.topics.consumer_offsets if self.offsets_source == "consumer_offsets" else self.topics.commits

    def source_topics(self) -> list[str]:
        return [self.topics.segments, self.offsets_topic, self.topics.config]

    @property
    def key_prefix(self) -> str:
        """Every Redis key of this job starts with it: `<redis_prefix>:<cluster>`."""
        return f"{self.redis_prefix}:{self.cluster}"

    def redis_state(self, timeout_s: float = 5.0) -> RedisState:
        """The one way compactd connects to Redis: URL, prefix, password and timeouts from these settings."""
        from compactd.state.redis_store import RedisState

        password = None if self.redis_password is None else self.redis_password.get_secret_value()
        return RedisState.from_url(
            self.redis_url, self.key_prefix, timeout_s=timeout_s, password=password, cluster=self.redis_cluster
        )

    def secrets(self) -> list[str]:
        """Config-event signing secrets, the first one signs (never logged: SecretStr hides them)."""
        return [s.get_secret_value() for s in self.config_secrets]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _yaml_file.get()
        if path is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)


def load_settings(config_file: str | Path | None = None, **flags: Any) -> Settings:
    """Build settings from a YAML file (optional), the environment and flags (None = not given)."""
    if config_file is not None and not Path(config_file).is_file():
        raise ConfigError(f"config file not found: {config_file} (--config / COMPACTD_CONFIG)")
    token = _yaml_file.set(Path(config_file) if config_file else None)
    try:
        return Settings(**{k: v for k, v in flags.items() if v is not None})
    finally:
        _yaml_file.reset(token)
