"""The Spark compactd launches: its Python workers import the installed pyspark (compiled once), not the copy in
Spark's `python/lib/pyspark.zip` that each worker process would compile again (`jvm_start.spark_home_for_workers`)."""

from __future__ import annotations

from collections.abc import Iterator

import pyspark
import pytest

pytestmark = pytest.mark.spark


def test_python_workers_import_the_installed_pyspark_not_the_zip(spark) -> None:
    def where(_: object) -> Iterator[str]:
        import pyspark as worker_pyspark

        yield worker_pyspark.__file__

    assert spark.sparkContext.parallelize([1], 1).mapPartitions(where).collect() == [pyspark.__file__]
