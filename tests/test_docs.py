"""The project's documents are in the project: every ``*.md`` a file cites exists in the
repository, and every ``design.md §N`` names a section the design document has."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("tagplan", "tests", "bench", "docs", "migrations", "deploy")
PRODUCT_OUTPUTS = {"report.md"}
"""Files the product writes (``tagplan plan -o`` writes ``report.md``), not documents."""

_URL = re.compile(r"https?://\S+")
_CITED = re.compile(r"[\w./-]*[\w-]\.md\b")
_SECTION = re.compile(r"design\.md §(\d+)")


def _texts() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "BENCHMARKS.md"]
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in {".py", ".md", ".yaml", ".yml", ".toml"} and path.is_file():
                found.append(path)
    return [p for p in found if p.exists()]


def _resolves(name: str, source: Path) -> bool:
    bases = (source.parent, ROOT, ROOT / "docs")
    return name in PRODUCT_OUTPUTS or any((base / name).is_file() for base in bases)


def test_every_cited_document_is_in_the_repository() -> None:
    missing = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in _texts()
        for name in _CITED.findall(_URL.sub("", path.read_text(encoding="utf-8")))
        if not _resolves(name, path)
    ]
    assert missing == []


def test_design_sections_cited_exist() -> None:
    headings = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^## (\d+)\. ", headings, flags=re.MULTILINE))
    wrong = [
        f"{path.relative_to(ROOT)}: §{number}"
        for path in _texts()
        for number in _SECTION.findall(path.read_text(encoding="utf-8"))
        if number not in sections
    ]
    assert wrong == []
