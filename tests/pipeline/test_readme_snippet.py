"""README.md's MuLoPipeline snippet (section "Decoding"), run exactly as written."""

from __future__ import annotations

import re
from pathlib import Path

from PIL import Image

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- MuLoPipeline snippet -->"


def readme_snippet() -> str:
    """The fenced python block right under the marker."""
    text = README.read_text()
    assert text.count(MARKER) == 1, f"README.md must hold the marker {MARKER!r} once"
    block = re.match(r"\s*```python\n(.*?)\n```", text[text.index(MARKER) + len(MARKER) :], re.DOTALL)
    assert block, f"no ```python block right under {MARKER!r} in README.md"
    return block.group(1)


def test_the_readme_snippet_decodes_the_testbed_and_writes_the_image(tmp_path, monkeypatch, capsys):
    snippet = readme_snippet()
    assert len(snippet.splitlines()) <= 6
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(snippet, str(README), "exec"), namespace)
    assert Image.open(tmp_path / "sample.png").size == (128, 128)
    out = namespace["out"]
    assert out.tokens.shape == (1, 16, 16) and len(out.images) == len(out.stats) == 1
    assert "tokens_accepted" in capsys.readouterr().out
