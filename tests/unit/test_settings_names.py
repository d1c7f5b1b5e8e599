"""A renamed setting keeps working under its first name: `evaluation_shares` became `evaluation_slices` (KIP-932's
share groups own the word "share"), and an operator's file or environment that still says the old name must keep its
slices rather than fall back to the driver without a word."""

from __future__ import annotations

from pathlib import Path

import pytest

from compactd.settings import Settings, load_settings


@pytest.mark.parametrize("name", ["evaluation_slices", "evaluation_shares"])
def test_the_yaml_file_may_name_it_either_way(tmp_path: Path, name: str) -> None:
    cfg = tmp_path / "compactd.yaml"
    cfg.write_text(f"{name}: 3\n", encoding="utf-8")
    assert load_settings(cfg).evaluation_slices == 3


@pytest.mark.parametrize("var", ["COMPACTD_EVALUATION_SLICES", "COMPACTD_EVALUATION_SHARES"])
def test_the_environment_may_name_it_either_way(monkeypatch: pytest.MonkeyPatch, var: str) -> None:
    monkeypatch.setenv(var, "4")
    assert Settings().evaluation_slices == 4


def test_a_misspelt_name_is_still_refused() -> None:
    with pytest.raises(ValueError, match="evaluation_slicez"):
        Settings(evaluation_slicez=2)  # type: ignore[call-arg]
