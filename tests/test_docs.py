"""Every `*.md` file the repository cites exists, and so does every section and anchor it names; so does every
source path it cites under the project's own folders (`mulo_sd/nets/gpt.py`, `tests/test_layout.py`,
`conf/eval/headline.yaml`).

A mention is resolved from the repository root (`docs/algorithm.md`, `README.md`; a bare `algorithm.md` is
missing unless the root holds one); a markdown link in a .md file from that file's folder, as GitHub does.
`docs/x.md section N` (or `sections N-M`) needs a heading `N.` in that file, a link `x.md#anchor` a heading
with that anchor.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".yaml", ".md"}
SKIP_DIRS = {".venv", ".git", "build", "dist", "__pycache__"}  # and hidden and *.egg-info folders
# Files that the code writes (mulo-eval) or a test creates: named, not cited.
NOT_CITATIONS = {"summary.md", "matched.md", "notes.md", "paper_table.md"}

URL = re.compile(r"\w+://\S+")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+?\.md)(?:#([^)\s]*))?\)")  # text and target
MENTION = re.compile(r"(?<![\w./-])([\w./-]*\w\.md)\b")
# A path into the project's folders: moved or deleted modules, configs and tests must not stay cited.
SOURCE_PATH = re.compile(
    r"(?<![\w./-])((?:mulo_sd|training|tests|scripts|conf)/[\w./-]*\w\.(?:py|yaml|sbatch)|data/[\w./-]*\w\.py)\b"
)  # data/x.yaml is a config group's file, cited relative to conf/
SECTION = re.compile(r"(docs/[\w./-]+\.md)`?,?\s+sections?\s+(\d+)(?:\s*-\s*(\d+))?")
HEADING = re.compile(r"^(#+)\s+(.*?)\s*$")


def source_files(root: Path):
    """The .py, .yaml and .md files under root, outside virtualenvs, VCS data and build outputs."""
    for path in sorted(root.rglob("*")):
        parts = path.relative_to(root).parts[:-1]
        skipped = any(p in SKIP_DIRS or p.startswith(".") or p.endswith(".egg-info") for p in parts)
        if path.suffix in SUFFIXES and path.is_file() and not skipped:
            yield path


def headings(path: Path) -> list[str]:
    """Heading texts of a markdown file, fenced code blocks left out."""
    found, fenced = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else HEADING.match(line)
        if match:
            found.append(match.group(2))
    return found


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def broken_citations(root: Path, skip: tuple[Path, ...] = ()) -> list[str]:
    """'file:line: problem' for every cited .md path, section or anchor that does not exist under root."""
    problems = []
    for path in source_files(root):
        if path in skip:
            continue
        text = URL.sub("", path.read_text())
        name = path.relative_to(root).as_posix()

        def report(offset: int, message: str, name=name, text=text) -> None:
            problems.append(f"{name}:{text.count(chr(10), 0, offset) + 1}: {message}")

        if path.suffix == ".md":
            for match in LINK.finditer(text):
                target = (path.parent / match.group(1)).resolve()
                if not target.is_file():
                    report(match.start(), f"link to missing {match.group(1)}")
                elif match.group(2) and match.group(2) not in map(anchor, headings(target)):
                    report(match.start(), f"link to missing anchor {match.group(1)}#{match.group(2)}")
            text = LINK.sub(lambda m: " " * len(m.group(0)), text)  # keep offsets, drop the links
        for match in MENTION.finditer(text):
            cited = match.group(1)
            if Path(cited).name not in NOT_CITATIONS and not (root / cited).is_file():
                report(match.start(), f"cites missing {cited}")
        for match in SOURCE_PATH.finditer(text):
            if not (root / match.group(1)).is_file():
                report(match.start(), f"cites missing {match.group(1)}")
        for match in SECTION.finditer(text):
            cited = root / match.group(1)
            if not cited.is_file():
                continue  # reported above
            numbers = {int(n) for n in match.group(2, 3) if n}
            present = {int(m.group(1)) for h in headings(cited) if (m := re.match(r"(\d+)\.", h))}
            for number in sorted(numbers - present):
                report(match.start(), f"cites missing section {number} of {match.group(1)}")
    return sorted(problems, key=_position)


def _position(problem: str) -> tuple[str, int, str]:
    """Sort key of a problem line: file, line number, message."""
    file, line, message = problem.split(":", 2)
    return file, int(line), message


def test_every_cited_markdown_file_section_and_anchor_exists():
    # this file is skipped: its checker test writes deliberately broken citations
    assert broken_citations(ROOT, skip=(Path(__file__).resolve(),)) == []


def test_checker_reports_missing_files_sections_and_anchors(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "See [design](docs/a.md#2-two), [`b.md`](docs/b.md), [gone](docs/gone.md).\n"
    )
    (tmp_path / "docs" / "a.md").write_text(
        "# A\n\n## 1. One\n\n```bash\n# 3. not a heading\n```\n\n## 2. Two\n\n"
        "[sibling](b.md), [bad anchor](a.md#9-nine), see https://example.org/x/missing.md\n"
    )
    (tmp_path / "docs" / "b.md").write_text("# B\n")
    (tmp_path / "code.py").write_text(
        '"""Rules (docs/a.md section 2), islands (docs/a.md sections 1-3),\n'
        "old (algorithm.md section 4), README.md, docs/b.md, docs/none.md.\n"
        "Code: mulo_sd/nets/gone.py, tests/test_here.py, conf/eval/none.yaml; a/mulo_sd/x.py is not ours.\n"
        'Writes summary.md and matched.md."""\n'
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_here.py").write_text("")
    (tmp_path / "conf.yaml").write_text("# see `docs/a.md` section 3\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "lib.py").write_text("# algorithm.md\n")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "copy.py").write_text("# evaluation.md\n")
    assert broken_citations(tmp_path) == [
        "README.md:1: link to missing docs/gone.md",
        "code.py:1: cites missing section 3 of docs/a.md",
        "code.py:2: cites missing algorithm.md",
        "code.py:2: cites missing docs/none.md",
        "code.py:3: cites missing conf/eval/none.yaml",
        "code.py:3: cites missing mulo_sd/nets/gone.py",
        "conf.yaml:1: cites missing section 3 of docs/a.md",
        "docs/a.md:11: link to missing anchor a.md#9-nine",
    ]
