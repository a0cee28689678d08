"""The package carries its licence (LICENSE, pyproject.toml's `license`) and how to cite the paper it
implements (CITATION.cff)."""

from __future__ import annotations

from pathlib import Path

import tomllib
import yaml

REPO = Path(__file__).resolve().parents[1]


def test_the_licence_is_the_full_apache_2_text_and_pyproject_names_it():
    text = (REPO / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    for clause in (
        "1. Definitions.",
        "4. Redistribution.",
        "9. Accepting Warranty or Additional Liability.",
        "END OF TERMS AND CONDITIONS",
        "APPENDIX: How to apply the Apache License to your work.",
    ):
        assert clause in text, clause
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]


def test_citation_names_the_paper():
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["license"] == "Apache-2.0"
    paper = citation["preferred-citation"]
    assert paper["title"] == "Multi-Scale Local Speculative Decoding for Image Generation"
    assert [author["family-names"] for author in paper["authors"]] == ["Peruzzo", "Sautière", "Habibian"]
    assert paper["year"] == 2026 and "CVPR" in paper["conference"]["name"]
    assert paper["url"] == "https://arxiv.org/abs/2601.05149"
    assert {"type": "other", "value": "arXiv:2601.05149", "description": "arXiv identifier"} in paper[
        "identifiers"
    ]
