"""Job configuration: flags beat COMPACTD_* environment variables beat the YAML file (docs/contract.md)."""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from compactd.errors import ConfigError
from compactd.kafka.config import KafkaConnection, KafkaValue
from compactd.policy.thresholds import validate_layer

_yaml_file: ContextVar[Path | None] = ContextVar("compactd_yaml_file", default=None)

if TYPE_CHECKING:
    from compactd.state.redis_store import RedisState


class TopicNames(BaseModel):
    model_config = ConfigDict(extra="forbid")

    segments: str = "compactd.segments"
    commits: str = "compactd.commits"
    config: str = "compactd.config"
    actions: str = "compactd.actions"
    dlq: str = "compactd.dlq"
    consumer_offsets: str = "__consumer_offsets"  # read when offsets_source = consumer_offsets
    compactions: str = "compactd.compactions"  # the compaction service's manifests (compacted, keyed by topic)
    nudges: str = "compactd.nudges"  # what each compaction nudge replaced, until put back (sinks/nudge_ledger.py)
    agent: str = "compactd.agent"  # the admin agent's poll marks (compacted, keyed admin/<cluster>)
    view_suffix: str = Field(".compacted", min_length=1)  # a topic's compacted view is <topic><view_suffix>


class MetricsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # per-partition series only for the top-N worst partitions of each metric; per-topic aggregates always
    top_n: int = Field(100, ge=0, le=100_000)
    # how often the job samples source lag (ListOffsets) and Redis size for its gauges
    sample_interval_ms: int = Field(15_000, ge=1_000)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="COMPACTD_", env_nested_delimiter="__", extra="forbid")

    bootstrap_servers: str = "127.0.0.1:9092"
    redis_url: str = "redis://127.0.0.1:6379/0"
    checkpoint_dir: str = "/var/lib/compactd/checkpoint"
    trigger_interval_ms: int = Field(1000, gt=0)
    thresholds: dict[str, dict[str, Any]] = Field(default_factory=dict)
    topics: TopicNames = Field(default_factory=TopicNames)
    # consumer_offsets: Kafka's own record of every group (compacted by Kafka: a rebuild from its start sees every live
    # commit); commits: a JSON topic some producer writes, where compactd may not read __consumer_offsets; admin: the
    # commits topic as `compactd agent --admin` writes it (managed clusters: compactd only a client), and no delete
    # before the agent's first complete poll
    offsets_source: Literal["commits", "consumer_offsets", "admin"] = "consumer_offsets"
    # extra librdkafka settings for every client; YAML ints and booleans are taken as they are written
    kafka: dict[str, KafkaValue] = Field(default_factory=dict)
    # HMAC secrets for config events (env COMPACTD_CONFIG_SECRETS as a JSON list); any verifies, the first signs
    config_secrets: list[SecretStr] = Field(default_factory=list)
    # Extensions beyond the contract.
    redis_prefix: str = "cd"
    # The Kafka cluster this job watches: part of every Redis key, action record and metric, so jobs for several
    # clusters share one Redis, one Prometheus and one set of dashboards.
    cluster: str = Field("default", pattern=r"^[A-Za-z0-9._-]{1,64}$")
    # Redis AUTH without putting the password in the URL (env COMPACTD_REDIS_PASSWORD); never logged.
    # TLS: a `rediss://` URL, with `?ssl_ca_certs=/path/ca.pem` (redis-py URL options) when the CA is private.
    redis_password: SecretStr | None = None
    # redis_url names any node of a Redis Cluster; the client finds the others (redis-py's RedisCluster)
    redis_cluster: bool = False
    max_rows_per_trigger: int = Field(500_000, gt=0)
    # Where a batch's per-topic work runs (merge into Redis, the bulk plan of quiet partitions): 0 = on the driver;
    # N = in N Spark tasks, each owning a share of the topics (control/share.py). The driver keeps group-level
    # changes, the full plans, the outbox and the metrics either way.
    evaluation_shares: int = Field(0, ge=0, le=4096)
    max_event_bytes: int = Field(64 * 1024, gt=0)
    metrics_port: int = Field(0, ge=0, description="Prometheus /metrics port on the driver; 0 = off")
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    spark_master: str = "local[2]"
    # on a cluster: every executor must import compactd (same version) within this long, checked before the stream
    executor_check_timeout_ms: int = Field(120_000, gt=0)
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    # "kafka" = Spark's own connector (needs the spark-sql-kafka jar); same options, same row shape.
    spark_source: Literal["compactd-kafka", "kafka"] = "compactd-kafka"
    create_topics: bool = True
    # replicas of the topics compactd creates; -1 = the cluster's default.replication.factor
    topics_replication_factor: int = Field(-1, ge=-1)
    # Right before a consumed-retention delete, the committed offsets of the topic's groups are read from the cluster
    # (ListGroups + OffsetFetch, kept this long) and a delete past any counted group's offset there is skipped.
    # compactd's principal needs Describe on the groups. Off only where the cluster refuses it.
    cluster_offsets_check: bool = True
    # on: the check above; strict: a group compactd counts on the topic that the cluster does not list (ACLs, or a
    # group gone) also holds the delete; off: same as cluster_offsets_check false
    cluster_check: Literal["on", "strict", "off"] = "on"
    cluster_offsets_ttl_ms: int = Field(5_000, ge=0)
    # how often the known topics are checked against the cluster (one DescribeTopics round): a changed topic ID
    # resets a re-created topic's state, a topic missing from two checks in a row is forgotten
    topic_check_interval_ms: int = Field(60_000, gt=0)
    # while Redis does not answer, a batch waits and is retried with backoff doubling up to this long
    redis_retry_max_ms: int = Field(10_000, gt=0)
    # how often the job checks the topics with compaction.service on for a due run (one ListOffsets per topic)
    compaction_check_interval_ms: int = Field(5_000, gt=0)
    # a compaction run holds its topic's lease this long past its last renewal (renewed every quarter of it; a failed
    # renewal ends the run): a run killed with -9 on another host blocks the next one for at most this long (on the
    # same host its pid is seen gone at once)
    compaction_lease_ms: int = Field(10_000, ge=1_000)
    # a compaction's reading task holds at most this many winners before Spark's shuffle takes them (its memory
    # bound); a run whose partitions all hold fewer records skips the shuffle
    compaction_task_records: int = Field(250_000, ge=1)
    # SIGTERM: finish the running batch and drain the outbox within this long, else exit 1 (a 2nd SIGTERM: at once)
    stop_timeout_ms: int = Field(120_000, ge=0)

    @field_validator("thresholds")
    @classmethod
    def _valid_layers(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {scope: validate_layer(scope, layer) for scope, layer in value.items()}

    def kafka_connection(self) -> KafkaConnection:
        return KafkaConnection(self.bootstrap_servers, dict(self.kafka))

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
