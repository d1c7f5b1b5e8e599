"""The delete gate of the running job: deletes wait until the sources are read far enough (`__consumer_offsets`,
the admin agent's first complete poll, a rebuild's targets), and a Redis that lost the state the checkpoint assumes
holds every delete until the state is rebuilt from the sources. A mixin of `Application` (daemon/application.py),
which builds the objects it uses; the class declares each."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from compactd.control.agent_watch import AGENT_WAIT, NO_AGENT
from compactd.control.health import REBUILDING
from compactd.daemon.parts import JobParts
from compactd.kafka.admin import admin_client, high_watermarks, list_end_offsets
from compactd.policy.plan import NOT_CAUGHT_UP
from compactd.policy.readiness import Readiness
from compactd.sinks.kafka_admin import KafkaAdminSink
from compactd.streaming.checkpoint import batch_end_offsets, stream_id_for

if TYPE_CHECKING:
    from compactd.control.agent_watch import AgentWatch
    from compactd.sinks.base import ActionSink
    from compactd.sinks.nudge_ledger import NudgeLedger

log = logging.getLogger("compactd.job")

NO_SOURCE_S = 60.0  # a job whose sources nothing has written to this long after its start says so, once
AGENT_WAIT_CHECK_S = 5.0  # offsets_source admin: how often the agent topic is read until its first mark
AGENT_CHECK_S = 30.0  # and after it: is the agent still polling?
NO_SEGMENTS = (
    "no segment events on {topic} in {s:.0f} s: nothing tells compactd what is old, so no retention or compaction "
    "rule can fire; is an agent running? (`compactd agent --log-dir` beside each broker, or `compactd agent --admin` "
    'once per cluster where compactd is only a client: see docs/contract.md, "Real inputs")'
)


class DeleteGate(JobParts):
    """Readiness, the admin agent's marks, silent sources, a lost state and its rebuild."""

    # its own state, set by `Application.__init__` and changed only here (the gate's: `JobParts`)
    _agent_checked_at: float
    _sources_said: bool
    # what only it borrows from `Application`
    ledger: NudgeLedger
    sink: ActionSink
    agent_watch: AgentWatch | None

    def deletes_allowed(self) -> bool:
        """The delete gate: sources read far enough, no loss pending, and Redis still holds our epoch (one read,
        made when a delete is decided and again right before one is sent)."""
        return self.readiness.ready() and self.lost is None and self.guard.intact()

    def _arm_readiness(self) -> None:
        """Deletes wait until the stream has read the offsets topic (`__consumer_offsets`, or the commits topic the
        admin agent writes, once it marked a complete poll) up to its high watermarks now, and, while a rebuild of a
        lost state is unfinished (also one a crashed job began), every source up to where it stood."""
        targets: dict[str, dict[str, int]] = {}
        why = NOT_CAUGHT_UP
        rebuild = self.guard.rebuild_targets()
        if rebuild:
            targets.update(rebuild)
            why = REBUILDING
        self.rebuilding = bool(rebuild)
        watch = self.agent_watch
        if watch is not None and watch.mark is None:
            self._read_agent()
        if watch is not None and watch.mark is None:
            self.readiness = Readiness.waiting(AGENT_WAIT)
            self._gate_changed()
            log.info("delete gate closed: %s (%s)", AGENT_WAIT, self.settings.topics.agent)
            return
        if self.settings.offsets_source in ("consumer_offsets", "admin"):
            topic = self.settings.offsets_topic
            for p, hw in high_watermarks(self.conn, topic).items():
                targets.setdefault(topic, {})[p] = max(hw, targets.get(topic, {}).get(p, 0))
        self.readiness = Readiness(targets or None, why)
        self.readiness.observe(batch_end_offsets(self.spark_checkpoint))
        self._gate_changed()
        if targets:
            log.info("delete gate (%s): targets %s, open=%s", why, targets, self.readiness.ready())

    def _read_agent(self) -> bool:
        """The agent's newest mark; True at the first."""
        assert self.agent_watch is not None
        self._agent_checked_at = time.monotonic()
        return self.agent_watch.refresh()

    def _watch_agent(self) -> None:
        """offsets_source admin: the gate is armed at the agent's first complete poll (and the deletes it held are
        decided afresh at once if the stream has read that far); a silent agent is said once."""
        watch = self.agent_watch
        if watch is None:
            return
        every = AGENT_WAIT_CHECK_S if watch.mark is None else AGENT_CHECK_S
        if time.monotonic() - self._agent_checked_at < every:
            return
        if self._read_agent():
            assert watch.mark is not None
            log.info("admin agent: complete poll %s seen: the delete gate is armed", watch.mark.get("poll"))
            self._arm_readiness()
            if self.readiness.ready():
                self.summary.partitions += self.controller.evaluate_all()
        watch.check_silence()

    def _check_sources(self) -> None:
        """Once, NO_SOURCE_S after the start: a source nothing writes is said in one line, not left silent."""
        if self._sources_said or time.monotonic() - self.summary.started < NO_SOURCE_S:
            return
        self._sources_said = True
        if not self._segments_seen and self.state.health().get("segments_at") is None:
            log.warning(NO_SEGMENTS.format(topic=self.settings.topics.segments, s=NO_SOURCE_S))
        if self.agent_watch is not None and self.agent_watch.mark is None:
            log.warning(NO_AGENT.format(s=NO_SOURCE_S, cluster=self.settings.cluster))

    def _gate_changed(self) -> None:
        """The gate opened or closed: metrics, the state hash for explain, and the end of a rebuild."""
        is_open = self.readiness.ready() and self.lost is None
        if is_open and self.rebuilding:
            self.guard.rebuild_done()
            self.rebuilding = False
            log.info("state rebuilt from the sources: deletes enabled")
        self.metrics.offsets_caught_up.set(int(is_open))
        self.metrics.state_rebuilding.set(int(self.rebuilding or self.lost is not None))
        self.guard.show_gate(is_open, REBUILDING if self.lost is not None else self.readiness.why)

    def _redis_down(self, down: bool) -> None:
        self.metrics.redis_up.set(0 if down else 1)
        if down:
            self.metrics.redis_outages.inc()

    # ---- a lost state ----

    def _state_lost(self, why: str) -> None:
        """Redis no longer holds the state the checkpoint assumes: hold every delete from now on; the run loop
        rebuilds (a batch cannot restart the query it runs in)."""
        if self.lost is not None:
            return
        self.lost = why
        self.metrics.state_losses.inc()
        log.error("state lost: %s; deletes held, rebuilding from the sources", why)
        self._gate_changed()

    def _begin_rebuild(self, why: str) -> None:
        """Wipe, new epoch, read every source again from its start; the gate opens once they are read up to where
        they stand now (a job that dies in here, or before that, resumes the rebuild at its next start)."""
        if self.lost is None:
            self.lost = why
            self.metrics.state_losses.inc()
            log.error("state lost: %s; deletes held, rebuilding from the sources", why)
        if self._admin is None:
            self._admin = admin_client(self.conn)
        targets = list_end_offsets(self._admin, self.settings.source_topics(), "high")
        self.guard.begin_rebuild(targets)
        self.controller.forget_scheduled()  # the wipe took the deadlines it stored
        self._segments_seen = False
        self._recover_nudges()  # the wipe took the nudges' originals too: the ledger has them
        self.stream_id = stream_id_for(self.settings.checkpoint_dir)
        self.lost = None
        self.config.load()  # the layers went with the state: the config topic brings them back

    def _supersede(self) -> None:
        """A rebuild reads the sources from their start: the events each recorded reset dropped are dropped again
        (the decoder filters them where it reads), the state is bound again to the topic IDs it described, and the
        resets' causes are back for `explain`."""
        resets, ids = self.ledger.load_resets(), self.ledger.load_ids()
        self.controller.lifecycle.restore(ids)
        self.decoder = replace(self.decoder, superseded={t: r["positions"] for t, r in resets.items()})
        for topic, r in resets.items():
            self.state.restore_reset(topic, {"at": r["at"], "why": r["why"], "partitions": 0})
        if resets:
            log.info("rebuild: events of %d re-created topics from before their reset are dropped", len(resets))

    def _recover_nudges(self) -> None:
        """Nudges left on the cluster that Redis no longer knows (a state loss) come back from the ledger, to be put
        back by `Controller.restore_nudges`."""
        if isinstance(self.sink, KafkaAdminSink):
            on = self.sink.recover_nudges()
            if on:
                log.info("%d compaction nudges are on: each is put back once its topic has no compaction pending", on)
