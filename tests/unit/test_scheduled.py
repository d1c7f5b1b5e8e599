"""The memory of stored deadlines (control/scheduled.py): a row is skipped only when Redis holds exactly its values."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from compactd.control.scheduled import Scheduled


def arr(*xs: int) -> np.ndarray:
    return np.asarray(xs, dtype=np.int64)


def test_only_rows_whose_values_differ_from_the_last_stored_are_changed() -> None:
    s = Scheduled()
    assert s.changed("t", [0, 1], arr(5, 6)).tolist() == [True, True]  # nothing stored yet
    s.remember("t", [0, 1], [5, 6])
    assert s.changed("t", [0, 1, 7], arr(5, 9, 5)).tolist() == [False, True, True]
    assert s.changed("u", [0], arr(5)).tolist() == [True]  # per topic


def test_age_a_wipe_and_another_writer_make_every_row_unknown() -> None:
    clock = [0.0]
    s = Scheduled(max_age_s=300, monotonic=lambda: clock[0])
    s.remember("t", [3], [5])
    clock[0] = 299
    assert not s.changed("t", [3], arr(5)).any()
    clock[0] = 301  # a zset entry lost unnoticed is stored again at the next evaluation after this
    assert s.changed("t", [3], arr(5)).all()
    s.remember("t", [3], [5])
    s.forget()
    assert s.changed("t", [3], arr(5)).all()
    s.remember("t", [3], [5])
    s.off()
    s.remember("t", [3], [5])
    assert s.changed("t", [3], arr(5)).all()


ops = st.lists(
    st.tuples(
        st.booleans(),  # remember (True) or ask
        st.sampled_from(["a", "b"]),
        st.lists(st.tuples(st.integers(0, 300), st.integers(-1, 3)), max_size=6, unique_by=lambda x: x[0]),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_a_row_is_skipped_only_when_the_last_stored_values_are_its_own(history: list) -> None:
    s, stored = Scheduled(), {}
    for remember, topic, rows in history:
        parts = [p for p, _ in rows]
        dl = [d for _, d in rows]
        if remember:
            s.remember(topic, parts, dl)
            stored.update({(topic, p): d for p, d in rows})
        else:
            changed = s.changed(topic, parts, arr(*dl)).tolist()
            assert changed == [stored.get((topic, p)) != d for p, d in rows]
