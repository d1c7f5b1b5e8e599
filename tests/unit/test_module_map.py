"""docs/architecture.md's module map is the one app/module_map.py reads from the code: a module added, moved or
removed, or a docstring changed, shows there (`make docs` writes it)."""

from __future__ import annotations

from pathlib import Path

from compactd.app.module_map import FOLDERS, OUTPUT, ROOT, current, docstring, render


def test_the_documents_map_is_the_generated_one() -> None:
    assert current(OUTPUT.read_text()) == render(), "docs/architecture.md's module map is stale: run `make docs`"


def test_every_folder_of_the_package_is_on_the_map_and_every_module_says_what_it_holds() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench", "deploy"}
    assert packages == set(FOLDERS)
    modules = [m for folder in FOLDERS for m in sorted((ROOT / folder).glob("*.py"))]
    assert [str(m.relative_to(ROOT)) for m in modules if not docstring(m)] == []
    rendered = render()  # once: it reads every module (once a module, it was 52 s of a worker in make test)
    assert [m.name for m in modules if m.name != "__init__.py" and f"`{Path(m).stem}`" not in rendered] == []
