"""When each partition is next evaluated (deadlines, compaction due) and the actions decided for it (live records,
the outbox, the last answered): what the controller schedules and the sinks carry out."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from compactd.keys import parse_partition_key, partition_key
from compactd.model import ActionRecord
from compactd.state.store_base import StoreBase, _s


class OutboxStore(StoreBase):
    """Deadlines; action records and the outbox."""

    # ---- deadlines -----------------------------------------------------------------------------

    def _zput(self, key: str, scores: dict[tuple[str, int], int | None]) -> None:
        """Set or remove (None) the score of each "<topic>/<partition>" member in one round trip."""
        put = {partition_key(t, n): at for (t, n), at in scores.items() if at is not None}
        drop = [partition_key(t, n) for (t, n), at in scores.items() if at is None]
        pipe = self.r.pipeline(transaction=False)
        if put:
            pipe.zadd(key, put)
        if drop:
            pipe.zrem(key, *drop)
        pipe.execute()

    def schedule(self, topic: str, partitions: Sequence[int], deadlines: Sequence[int]) -> None:
        """Store a chunk of one topic's deadlines (-1: none) in one script call (lua/schedule.lua): the same entries
        as `set_deadlines`, without packing a command per partition in the client."""
        self.schedule_many([(topic, partitions, deadlines)])

    def schedule_many(self, chunks: Sequence[tuple[str, Sequence[int], Sequence[int]]]) -> None:
        """`schedule` for several topics' chunks, pipelined in one round trip on a single server."""
        script, keys = self._script("schedule"), [self.k_deadlines]
        calls = [
            [topic, " ".join(f"{n} {d}" for n, d in zip(parts, deadlines, strict=True))]
            for topic, parts, deadlines in chunks
            if parts
        ]
        if self.cluster or len(calls) < 2:
            for args in calls:
                script(keys=keys, args=args)
            return
        pipe = self.r.pipeline(transaction=False)
        for args in calls:
            script(keys=keys, args=args, client=pipe)
        pipe.execute()

    # set_deadlines and records: the per-partition commands `schedule` and `live_records` replace in the
    # controller, kept as the reference they are tested against (and for explain and tests)
    def set_deadlines(self, deadlines: dict[tuple[str, int], int | None]) -> None:
        self._zput(self.k_deadlines, deadlines)

    def due(self, now: int, limit: int = 10_000) -> list[tuple[str, int]]:
        members = self.r.zrangebyscore(self.k_deadlines, "-inf", now, start=0, num=limit)
        return [parse_partition_key(m) for m in members]

    def deadline(self, topic: str, partition: int) -> int | None:
        score = self.r.zscore(self.k_deadlines, partition_key(topic, partition))
        return None if score is None else int(score)

    # ---- actions / outbox ----------------------------------------------------------------------

    def records(self, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], list[ActionRecord]]:
        keys = list(keys)
        kinds = ("compact", "delete_records")
        fields = [f"{partition_key(t, n)}/{k}" for t, n in keys for k in kinds]
        vals = self.r.hmget(self.k_rec, fields) if fields else []
        out: dict[tuple[str, int], list[ActionRecord]] = {k: [] for k in keys}
        for i, raw in enumerate(vals):
            if raw is not None:
                out[keys[i // len(kinds)]].append(ActionRecord.from_json(raw))
        return out

    def live_records(self, topic: str, partitions: Sequence[int]) -> dict[int, list[ActionRecord]]:
        """`records` for a chunk of one topic's partitions, only those that have any (lua/live_records.lua)."""
        if not partitions:
            return {}
        return _records(self._script("live_records")(keys=[self.k_rec], args=[topic, " ".join(map(str, partitions))]))

    def enqueue(self, *recs: ActionRecord) -> None:
        """Record decisions and put them in the outbox in one transaction (one round trip for a batch's decisions)."""
        self.settle(0, (), recs)

    def outbox(self, now: int | None = None, limit: int = 1000, start: int = 0) -> list[ActionRecord]:
        """Records due by `now` (all when None), oldest first, `limit` of them from the `start`-th. A refused action's
        score is its next retry time."""
        hi = "+inf" if now is None else now
        slots = self.r.zrangebyscore(self.k_outbox, "-inf", hi, start=start, num=limit)
        if not slots:
            return []
        vals = self.r.hmget(self.k_rec, slots)
        return [ActionRecord.from_json(v) for v in vals if v is not None]

    def retry(self, rec: ActionRecord, at: int) -> None:
        """Keep a refused or timed-out action in the outbox, due again at `at` (epoch ms)."""
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(self.k_rec, rec.slot, rec.to_json())
        pipe.zadd(self.k_outbox, {rec.slot: at})
        pipe.execute()

    def compactions_in_flight(self) -> int:
        """Compaction nudges sent and not yet answered by the cluster, over every topic. Counted inside Redis by a
        read-only script (lua/in_flight.lua): the same records as scanning them here, but only the number crosses the
        network, and one script sees one consistent set (a client-side HSCAN can return a record twice)."""
        return int(self._script("in_flight")(keys=[self.k_rec]))

    def outbox_depth(self) -> int:
        return int(self.r.zcard(self.k_outbox))

    def complete(self, *recs: ActionRecord) -> None:
        """Leave the outbox with the final status, in one transaction; a record stays until the cluster answers it."""
        if not recs:
            return
        raw = {rec.slot: rec.to_json() for rec in recs}
        kept = {r.slot: raw[r.slot] for r in recs if r.action != "restore_config"}
        restored = [r.slot for r in recs if r.action == "restore_config"]
        pipe = self.r.pipeline(transaction=True)  # a few commands, however many records
        if kept:
            pipe.hset(self.k_rec, mapping=kept)
        if restored:
            pipe.hdel(self.k_rec, *restored)
        pipe.zrem(self.k_outbox, *raw)
        pipe.hset(self.k_last, mapping={partition_key(r.topic, r.partition): raw[r.slot] for r in recs})
        pipe.execute()

    def answer(self, now: int, *recs: ActionRecord) -> None:
        """The cluster did what was asked: the records leave the live set, in one transaction (one each made a
        batch answering 60k compactions spend most of its time in round trips)."""
        self.settle(now, recs, ())

    def settle(self, now: int, answered: Sequence[ActionRecord], queued: Sequence[ActionRecord]) -> None:
        """`answer` then `enqueue`, in one transaction: a chunk's answered records leave the live set (each kept as
        its partition's last, answered at `now`) and its decisions enter it and the outbox. A slot answered and
        decided again is only overwritten: at 1M partitions most answered slots are, and removing each first cost
        Redis a command argument and the client its packing."""
        if not answered and not queued:
            return
        pipe = self.r.pipeline(transaction=True)  # a few commands, however many records (a reply each is slow)
        slots = [rec.slot for rec in queued]
        if answered:
            again = set(slots)
            gone = [slot for slot in (rec.slot for rec in answered) if slot not in again]
            if gone:
                pipe.hdel(self.k_rec, *gone)
                pipe.zrem(self.k_outbox, *gone)
            pipe.hset(
                self.k_last,
                mapping={partition_key(r.topic, r.partition): r.with_status(r.status, answered_at=now).to_json()
                         for r in answered},
            )  # fmt: skip
        if queued:
            pipe.hset(self.k_rec, mapping={slot: rec.to_json() for slot, rec in zip(slots, queued, strict=True)})
            pipe.zadd(self.k_outbox, {slot: rec.decided_at for slot, rec in zip(slots, queued, strict=True)})
        pipe.execute()

    def last_actions(self) -> dict[str, ActionRecord]:
        return {_s(k): ActionRecord.from_json(v) for k, v in self.r.hgetall(self.k_last).items()}

    def live_compactions(self, topic: str) -> int:
        """Compaction records live on the topic's partitions: one HMGET over them, not a scan of every record."""
        slots = [f"{partition_key(topic, n)}/compact" for n in self.partitions(topic)]
        return sum(raw is not None for raw in self.r.hmget(self.k_rec, slots)) if slots else 0


def _records(raws: Sequence[bytes]) -> dict[int, list[ActionRecord]]:
    """lua/live_records.lua's answer by partition, compact before delete_records (as `records` gives them)."""
    out: dict[int, list[ActionRecord]] = {}
    for rec in ActionRecord.many_from_json(raws):
        got = out.get(rec.partition)
        if got is None:
            out[rec.partition] = [rec]
        else:
            got.append(rec)
            got.sort(key=lambda r: r.action)
    return out
