"""Nothing secret, nor a digest of it that a dictionary could invert, in what Spark shows of compactd's queries: the
plans (`explain(True)`, the query's logical plan string), which its UI and event logs carry, and the names of the
functions registered on the session. With a SASL password and a PEM private key configured, on a real Spark: the
stream's Kafka source options (the key travels as `kafka.ssl.keystore.key`, which Spark's default redaction pattern
does not match) and the compaction's JVM query (its function was named by an unsalted SHA-256 of the clients' JSON,
password included).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import secrets
from pathlib import Path
from typing import Any

import pytest

from compactd.compaction.spark_run import ReadRange, RunInput, WriteSpec, clients_json, jvm_query
from compactd.kafka.config import KafkaConnection
from compactd.streaming.connector import java_options
from compactd.streaming.decode import Decoder
from compactd.streaming.job import StreamingJob, StreamSpec

pytestmark = pytest.mark.spark


def plan_texts(df: Any) -> dict[str, str]:
    """What Spark shows of a DataFrame's plan: `explain(True)`'s output and the query's logical plan string."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        df.explain(True)
    qe = df._jdf.queryExecution()
    return {"explain": out.getvalue(), "query execution": qe.toString(), "logical plan": qe.logical().toString()}


def leaks(text: str, secrets_: dict[str, str]) -> list[str]:
    return [name for name, value in secrets_.items() if value in text]


def test_no_secret_nor_its_digest_reaches_a_plan_or_a_function_name(spark: Any, tmp_path: Path) -> None:
    password = f"pw-{secrets.token_hex(8)}"
    body = secrets.token_urlsafe(48)  # the key's base64 body: what must never be shown
    key = tmp_path / "client.key"
    key.write_text(f"-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n")
    cert = tmp_path / "client.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\nMIIBcert\n-----END CERTIFICATE-----\n")
    conn = KafkaConnection(
        "127.0.0.1:9093",
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "compactd",
            "sasl.password": password,
            "ssl.certificate.location": str(cert),
            "ssl.key.location": str(key),
        },
    )
    java = java_options(conn)
    assert password in java["sasl.jaas.config"] and body in java["ssl.keystore.key"]  # both configured, both used
    spec = WriteSpec({}, {}, "orders.compacted", 1_800_000_000_000, 0, java)
    hidden = {
        "password": password,
        "key": body,
        "digest of the clients": hashlib.sha256(clients_json(spec).encode()).hexdigest()[:16],
        "digest of the password": hashlib.sha256(password.encode()).hexdigest()[:16],
    }

    stream = StreamingJob(
        StreamSpec(java, ["compactd.segments"], Decoder("compactd.segments", "compactd.commits"), tmp_path / "cp"),
        spark,
        lambda batch: None,
    )._read()
    job = RunInput([ReadRange("orders", 0, 0, 10, False)], {"kind": "offset"}, False, 1)
    query = jvm_query(spark, job, spec)
    names = [f.name for f in spark.catalog.listFunctions() if f.name.startswith("compactd_view_run")]
    assert names
    shown = [
        *((f"stream source, {what}", text) for what, text in plan_texts(stream).items()),
        *((f"compaction query, {what}", text) for what, text in plan_texts(query).items()),
        *((f"function name {name}", name) for name in names),
    ]
    found = [f"{where}: {', '.join(leaks(text, hidden))}" for where, text in shown if leaks(text, hidden)]
    assert not found, "shown: " + "; ".join(found)
