import json
import os
import re

import pytest
import torch
from PIL import Image

import mulo_sd.evaluation.generation as generation
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.evaluation.generation import gather_records, generate, read_records, run_folder_name
from mulo_sd.evaluation.geneval_format import list_samples, sample_path
from mulo_sd.evaluation.prompt_sets import load_prompt_set
from mulo_sd.evaluation.runs import RunSpec
from mulo_sd.pipeline.decode_entry import decode, tensor_to_pil
from mulo_sd.pipeline.testbed_models import load_models
from mulo_sd.testbed.prompts import pil_to_tensor
from tests.real_eval_helpers import synthscenes_captions, write_prompt_files
from tests.training.test_decode_cli import save_tiny_testbed

RUNS = [RunSpec("ar", family="AR"), RunSpec("zipar", {"window": 4}, family="ZipAR")]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return load_models(save_tiny_testbed(tmp_path_factory.mktemp("testbed")), names=["vq", "target"])


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory):
    return write_prompt_files(tmp_path_factory.mktemp("prompts"), synthscenes_captions(8))


class Killed(Exception):
    pass


def counting_decode(monkeypatch, kill_after=None):
    """Replace generate's decode with one that counts its calls (and raises after `kill_after` of them)."""
    calls = []

    def counted(*args, **kwargs):
        if kill_after is not None and len(calls) == kill_after:
            raise Killed
        calls.append(args[2])
        return decode(*args, **kwargs)

    monkeypatch.setattr(generation, "decode", counted)
    return calls


def test_a_killed_run_resumes_without_redoing_finished_images(models, prompt_files, tmp_path, monkeypatch):
    prompts = load_prompt_set(prompt_files["lines"]["path"], "lines", count=4).prompts
    out = tmp_path / "images"
    calls = counting_decode(monkeypatch, kill_after=5)
    with pytest.raises(Killed):
        generate(models, RUNS, prompts, [0, 1], SamplerConfig(), out, progress=False)
    assert len(calls) == 5
    ar = out / "AR"
    first = {path: os.stat(path).st_mtime_ns for _, _, path in list_samples(ar)}
    assert len(first) == 5 and len(read_records(ar)[0]) == 5
    with open(ar / "stats.rank0.jsonl", "a") as f:
        f.write('{"label": "AR", "prompt_in')  # a record cut short by the kill
    sample_path(ar, 3, 0).unlink()  # and an image whose record was written but whose PNG is gone
    calls = counting_decode(monkeypatch)
    counts = generate(models, RUNS, prompts, [0, 1], SamplerConfig(), out, progress=False)
    assert len(calls) == counts.decoded == 2 * 4 * 2 - 5 + 1 and counts.resumed == 4
    assert counts.bad_lines == 1
    redone = sample_path(ar, 3, 0)
    assert all(os.stat(path).st_mtime_ns == t for path, t in first.items() if path != redone)
    rows = gather_records(out, RUNS, prompts, [0, 1])
    assert [(r["label"], r["prompt_index"], r["seed"]) for r in rows] == [
        (run.label, p.index, seed) for run in RUNS for p in prompts for seed in (0, 1)
    ]
    calls = counting_decode(monkeypatch)
    assert generate(models, RUNS, prompts, [0, 1], SamplerConfig(), out, progress=False).decoded == 0
    assert calls == []


def test_images_and_records_in_geneval_layout(models, prompt_files, tmp_path):
    prompt_set = load_prompt_set(prompt_files["geneval"]["path"], "geneval", count=3)
    generate(models, RUNS[:1], prompt_set.prompts, [0, 7], SamplerConfig(), tmp_path, progress=False)
    run_dir = tmp_path / run_folder_name("AR")
    # found the way GenEval's evaluation/evaluate_images.py walks a folder
    found = []
    for folder in sorted(os.listdir(run_dir)):
        if os.path.isdir(run_dir / folder) and folder.isdigit():
            with open(run_dir / folder / "metadata.jsonl") as fp:
                metadata = json.load(fp)
            assert metadata == prompt_set.prompts[int(folder)].metadata  # the file's own line, unchanged
            names = sorted(os.listdir(run_dir / folder / "samples"))
            found += [(folder, name) for name in names if re.match(r"\d+\.png", name)]
    assert found == [(f"{i:05d}", f"{seed:04d}.png") for i in range(3) for seed in (0, 7)]
    records, bad = read_records(run_dir)
    record = records[1, 7]
    assert bad == 0 and record["prompt"] == prompt_set.prompts[1].text and record["batch_size"] == 1
    assert record["target_forwards"] == 64 and record["image_wall_s"] == record["wall_s"] > 0
    # batch 1: the image is the one decode() gives for that prompt and seed
    expected = decode("ar", models, [prompt_set.prompts[1].text], {}, SamplerConfig(), 7).image[0]
    saved = pil_to_tensor(Image.open(sample_path(run_dir, 1, 7)))
    assert torch.equal(saved, pil_to_tensor(tensor_to_pil(expected)))


def test_ranks_share_the_prompts_without_overlap_and_batches_decode_together(
    models, prompt_files, tmp_path, monkeypatch
):
    prompts = load_prompt_set(prompt_files["coco"]["path"], "coco", count=7).prompts
    calls = counting_decode(monkeypatch)
    for rank in (0, 1):
        generate(
            models, RUNS[:1], prompts, [0], SamplerConfig(), tmp_path, rank, 2, batch_size=3, progress=False
        )
    assert [len(batch) for batch in calls] == [3, 1, 3]  # rank 0: prompts 0 2 4 | 6; rank 1: 1 3 5
    records, _ = read_records(tmp_path / "AR")
    assert sorted(records) == [(i, 0) for i in range(7)]
    assert {key: r["rank"] for key, r in records.items()} == {(i, 0): i % 2 for i in range(7)}
    assert records[2, 0]["batch_size"] == 3 and records[2, 0]["image_wall_s"] == records[2, 0]["wall_s"] / 3
    with pytest.raises(RuntimeError, match=r"run 'AR' lacks 1 image\(s\) .*rerun the same command"):
        gather_records(tmp_path, RUNS[:1], prompts + [prompts[0].__class__(7, "a red star")], [0])


def test_a_compiled_run_decodes_through_compiled_steps(models, prompt_files, tmp_path, monkeypatch):
    """A run's `compile` reaches decode in real-prompt generation too; its images are the eager run's."""
    given = []

    def recording(*args, **kwargs):
        given.append(kwargs.get("compile"))
        return decode(*args, **kwargs)

    monkeypatch.setattr(generation, "decode", recording)
    prompts = load_prompt_set(prompt_files["geneval"]["path"], "geneval", count=1).prompts
    runs = [RunSpec("ar", family="AR"), RunSpec("ar", family="AR (compiled)", compile=True)]
    generate(models, runs, prompts, [0], SamplerConfig(), tmp_path, progress=False)
    assert given == [False, True]
    eager, compiled = (Image.open(sample_path(tmp_path / run_folder_name(run.family), 0, 0)) for run in runs)
    assert torch.equal(pil_to_tensor(eager), pil_to_tensor(compiled))
