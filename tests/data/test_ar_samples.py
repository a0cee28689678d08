"""`mulo-data ar-samples` resumes a folder made with the same settings after its complete shards and refuses
one made with other settings or holding other files."""

import json

import pytest
from mulo_sd.data.ar_samples import MANIFEST, resume_point
from mulo_sd.data.shards import update_sizes

SETTINGS = {"models": "testbed", "seed": 0, "caption_seed": 1, "shard_size": 4}


def test_a_rerun_resumes_after_the_complete_shards(tmp_path):
    out = tmp_path / "ar"
    assert resume_point(str(out), SETTINGS) == 0
    assert json.loads((out / MANIFEST).read_text()) == SETTINGS
    (out / "ar-000000.tar").write_bytes(b"")
    update_sizes(str(out), {"ar-000000.tar": 4})
    (out / "ar-000001.tar.partial").write_bytes(b"")  # an interrupted shard is written again
    assert resume_point(str(out), SETTINGS) == 4


def test_a_short_last_shard_is_written_again_when_the_count_grows(tmp_path):
    out = tmp_path / "ar"
    resume_point(str(out), SETTINGS)
    for name in ("ar-000000.tar", "ar-000001.tar"):
        (out / name).write_bytes(b"")
    update_sizes(str(out), {"ar-000000.tar": 4, "ar-000001.tar": 2})  # --count 6: samples 4 and 5 only
    assert resume_point(str(out), SETTINGS) == 4


def test_other_settings_or_a_foreign_folder_are_refused(tmp_path):
    out = tmp_path / "ar"
    resume_point(str(out), SETTINGS)
    with pytest.raises(SystemExit, match="made with"):
        resume_point(str(out), {**SETTINGS, "seed": 1})
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.tar").write_bytes(b"")
    with pytest.raises(SystemExit, match="not empty"):
        resume_point(str(tmp_path / "other"), SETTINGS)
