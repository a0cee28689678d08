import json

import pytest

from mulo_sd.evaluation.prompt_sets import load_prompt_set, split_dev_test
from tests.real_eval_helpers import write_prompt_files


def write_coco(path, images, annotations):
    path.write_text(json.dumps({"images": images, "annotations": annotations}))
    return path


def test_coco_one_caption_per_image_in_id_order_seeded_per_image(tmp_path):
    images = [{"id": i, "file_name": f"{i:012d}.jpg"} for i in (30, 10, 20, 40)]
    annotations = [
        {"id": 100 * i + k, "image_id": i, "caption": f"image {i} caption {k}"}
        for i in (10, 20, 30)
        for k in range(5)
    ]
    path = write_coco(tmp_path / "captions.json", images, annotations)
    prompt_set = load_prompt_set(path, "coco", seed=0, images=tmp_path)
    assert [p.metadata["image_id"] for p in prompt_set.prompts] == [10, 20, 30]  # 40 has no caption
    assert prompt_set.skipped == 1 and prompt_set.skip_reason == "images without a caption"
    assert [p.index for p in prompt_set.prompts] == [0, 1, 2]
    assert all(p.text.startswith(f"image {p.metadata['image_id']} caption ") for p in prompt_set.prompts)
    assert prompt_set.prompts[1].reference == tmp_path / "000000000020.jpg"
    # the caption of an image depends on the seed and its id only, not on how many images are read
    first = load_prompt_set(path, "coco", count=1, seed=0).prompts
    assert first[0].text == prompt_set.prompts[0].text
    by_seed = {seed: [p.text for p in load_prompt_set(path, "coco", seed=seed).prompts] for seed in range(6)}
    assert len({tuple(texts) for texts in by_seed.values()}) > 1
    assert by_seed[0] == [p.text for p in load_prompt_set(path, "coco", seed=0).prompts]


def test_every_format_reads_its_file(tmp_path):
    captions = ["a red star on a noisy background", "two blue circles on a striped background"]
    files = write_prompt_files(tmp_path, captions)
    coco = load_prompt_set(files["coco"]["path"], "coco", images=files["coco"]["images"])
    assert [p.text for p in coco.prompts] == captions[::-1]  # ids descend with the caption order
    assert all(p.reference.is_file() for p in coco.prompts)
    mjhq = load_prompt_set(files["mjhq"]["path"], "mjhq", images=files["mjhq"]["images"])
    assert [p.text for p in mjhq.prompts] == captions
    assert mjhq.prompts[1].metadata == {"name": "img001", "category": "animals"}
    assert mjhq.prompts[1].reference == files["mjhq"]["images"] / "animals" / "img001.jpg"
    assert mjhq.prompts[1].reference.is_file()
    geneval = load_prompt_set(files["geneval"]["path"], "geneval")
    assert [p.text for p in geneval.prompts] == captions
    assert geneval.prompts[0].metadata == {
        "tag": "single_object", "include": [{"class": "star", "count": 1}], "prompt": captions[0],
    }  # fmt: skip
    lines = load_prompt_set(files["lines"]["path"], "lines", count=2)
    assert [p.text for p in lines.prompts] == captions and lines.skipped == 1  # the trailing blank line
    assert all(p.reference is None for p in geneval.prompts + lines.prompts)


def test_bad_prompt_files_name_the_file_and_the_field(tmp_path):
    path = write_coco(tmp_path / "c.json", [{"id": 1, "file_name": "a.jpg"}], [{"image_id": 1, "text": "x"}])
    with pytest.raises(ValueError, match=r"c\.json: annotations\[0\] needs a str field 'caption'"):
        load_prompt_set(path, "coco")
    (tmp_path / "g.jsonl").write_text(
        '{"prompt": "a photo of a cat", "tag": "single_object"}\n{"prompt": 3}\n'
    )
    with pytest.raises(ValueError, match=r"g\.jsonl: line 2 needs a str field 'prompt'"):
        load_prompt_set(tmp_path / "g.jsonl", "geneval")
    (tmp_path / "m.json").write_text(json.dumps({"x": {"prompt": "a cat"}}))
    with pytest.raises(ValueError, match=r"m\.json: entry 'x' needs a str field 'category'"):
        load_prompt_set(tmp_path / "m.json", "mjhq")
    (tmp_path / "p.txt").write_text("one\ntwo\n")
    with pytest.raises(ValueError, match=r"prompts\.count=3, but .*p\.txt holds 2 lines prompts"):
        load_prompt_set(tmp_path / "p.txt", "lines", count=3)
    with pytest.raises(ValueError, match=r"unknown prompt format 'csv'"):
        load_prompt_set(tmp_path / "p.txt", "csv")
    with pytest.raises(FileNotFoundError, match=r"prompt file not found: .*nothing\.json"):
        load_prompt_set(tmp_path / "nothing.json", "coco")


def test_dev_test_split_is_disjoint_complete_and_seeded():
    prompts = list(range(100))
    dev, test = split_dev_test(prompts, 30, seed=0)
    assert len(dev) == 30 and len(test) == 70
    assert not set(dev) & set(test) and sorted(dev + test) == prompts
    assert dev == sorted(dev) and test == sorted(test)  # each keeps the input order
    assert split_dev_test(prompts, 30, seed=0) == (dev, test)
    assert split_dev_test(prompts, 30, seed=1)[0] != dev
    assert dev != prompts[:30]  # random, not the first prompts
    with pytest.raises(ValueError, match=r"the dev split needs 1 to 99 of the 100 prompts, got 100"):
        split_dev_test(prompts, 100)
