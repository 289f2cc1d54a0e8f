"""Writing one `## ...` section of docs/benchmarks.md, leaving the others as they are."""

from __future__ import annotations

from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def replace_section(section: str, body: str, doc: Path = DOC) -> None:
    """Replace the section headed `section` (up to the next `## `) by `body`, or append it."""
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    start = text.find(section)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + body
    else:
        end = text.find("\n## ", start + len(section))
        text = text[:start] + body + (text[end + 1:] if end >= 0 else "")
    doc.write_text(text)
