"""The README's admission-policy table is the refused examples (deploy/examples/refused/): each file
listed once, with the message its first line documents; ``make e2e`` applies each and checks it."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REFUSED = REPO / "deploy" / "examples" / "refused"


def table() -> dict[str, str]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Admission policy"):]
    section = section[:section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| `") and ".yaml`" in line]
    out = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        out[cells[0].strip("`")] = cells[1]
    return out


def test_each_refused_example_is_in_the_readme_with_its_message() -> None:
    files = {p.name: p.read_text().splitlines()[0].removeprefix("# refused: ").strip()
             for p in sorted(REFUSED.glob("*.yaml"))}
    assert len(files) >= 10
    assert table() == files
