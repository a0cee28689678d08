import hashlib

import numpy as np
import pytest
import torch
from PIL import Image

from mulo_sd.evaluation.metrics.clip_score import clip_score, load_clip
from mulo_sd.evaluation.metrics.fid import (
    INCEPTION_FILE,
    INCEPTION_URL,
    FIDStatistics,
    extract_features,
    extractor_fingerprint,
    frechet_distance,
    load_feature_extractor,
    load_statistics,
    reference_statistics,
)
from tests.real_eval_helpers import colour_images, save_tiny_clip, save_tiny_extractor


@pytest.fixture(scope="module")
def extractor_file(tmp_path_factory):
    return save_tiny_extractor(tmp_path_factory.mktemp("fid") / "tiny_extractor.pt2")


def save_images(folder, images):
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, image in enumerate(images):
        paths.append(folder / f"{i:03d}.png")
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(paths[-1])
    return paths


def random_images(n, seed, shift=0):
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 200, (n, 3, 16, 16), generator=generator)
    return (images + shift).clamp(0, 255).to(torch.uint8)


def test_fid_of_a_set_against_itself_is_zero_and_grows_with_a_shift(extractor_file, tmp_path):
    extractor = load_feature_extractor(extractor_file)
    paths = save_images(tmp_path / "a", random_images(24, 0))
    features = extract_features(extractor, paths, batch_size=5)
    assert features.shape == (24, 8) and features.dtype == torch.float64
    assert frechet_distance(features, features) == pytest.approx(0.0, abs=1e-6)
    other = extract_features(extractor, save_images(tmp_path / "b", random_images(24, 1)))
    shifted = extract_features(extractor, save_images(tmp_path / "c", random_images(24, 1, shift=55)))
    # another sample of the same distribution is close; the same sample brightened is far
    assert 0 < frechet_distance(other, features) < frechet_distance(shifted, features) / 5


def test_fid_statistics_file_gives_the_distance_of_the_features(extractor_file, tmp_path):
    extractor = load_feature_extractor(extractor_file)
    real = save_images(tmp_path / "real", random_images(20, 2))
    fake = extract_features(extractor, save_images(tmp_path / "fake", random_images(12, 3)))
    statistics = reference_statistics(extractor, tmp_path / "real", 16, cache=tmp_path / "ref.npz")
    expected = frechet_distance(fake, extract_features(extractor, real))
    assert frechet_distance(fake, statistics) == pytest.approx(expected, rel=1e-9)
    assert frechet_distance(fake, load_statistics(tmp_path / "ref.npz", dims=8)) == pytest.approx(
        expected, rel=1e-9
    )
    with np.load(tmp_path / "ref.npz") as data:
        assert sorted(data.files) == ["count", "mu", "sigma", "source"] and int(data["count"]) == 20
    FIDStatistics.of(fake).save(tmp_path / "ref.npz")  # another source: the cache is recomputed, not reused
    again = reference_statistics(extractor, tmp_path / "real", 16, cache=tmp_path / "ref.npz")
    assert torch.allclose(again.mu, statistics.mu)
    np.savez(tmp_path / "bad.npz", mu=np.zeros(8))
    with pytest.raises(ValueError, match=r"bad\.npz: FID statistics need the field 'sigma'"):
        load_statistics(tmp_path / "bad.npz")
    np.savez(tmp_path / "wide.npz", mu=np.zeros(4), sigma=np.eye(4))
    with pytest.raises(
        ValueError, match=r"wide\.npz: field 'mu' has 4 features, the feature extractor gives 8"
    ):
        load_statistics(tmp_path / "wide.npz", dims=8)


def test_a_missing_feature_extractor_names_the_file_and_where_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        load_feature_extractor(tmp_path / INCEPTION_FILE)
    message = str(error.value)
    assert str(tmp_path / INCEPTION_FILE) in message and INCEPTION_URL in message
    assert "nothing is downloaded" in message
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"junk\.pth is neither the FID Inception weights"):
        load_feature_extractor(tmp_path / "junk.pth")


def test_the_fid_inception_loads_its_weights_from_a_local_file(tmp_path, monkeypatch):
    from torch_fidelity import feature_extractor_inceptionv3 as inception

    def no_download(*args, **kwargs):
        raise AssertionError("the Inception weights must come from the local file")

    monkeypatch.setattr(inception, "load_state_dict_from_url", no_download)

    class RandomInception(inception.FeatureExtractorInceptionV3):
        def load_state_dict(self, state_dict, strict=True, assign=False):
            return None  # keep the random initialisation: a stand-in for the real weights file

    torch.save({}, tmp_path / "empty.pth")
    torch.manual_seed(0)
    weights = RandomInception("x", ["2048"], feature_extractor_weights_path=str(tmp_path / "empty.pth"))
    torch.save(weights.state_dict(), tmp_path / INCEPTION_FILE)
    extractor = load_feature_extractor(tmp_path / INCEPTION_FILE)
    assert torch.equal(extractor.Mixed_7c.branch1x1.conv.weight, weights.Mixed_7c.branch1x1.conv.weight)
    assert extractor(random_images(2, 0)).shape == (2, 2048)


def test_clip_score_ranks_matched_captions_above_shuffled_ones(tmp_path):
    folder = save_tiny_clip(tmp_path / "clip")
    assert {"config.json", "model.safetensors", "preprocessor_config.json", "vocab.json"} <= {
        p.name for p in folder.iterdir()
    }
    clip = load_clip(folder)
    images = colour_images()
    paths = save_images(tmp_path / "images", list(images.values()))
    captions = [f"a photo of a {colour} square" for colour in images]
    matched = clip_score(clip, paths, captions, batch_size=3)
    shuffled = clip_score(clip, paths, captions[3:] + captions[:3], batch_size=3)
    assert 0 <= shuffled < matched <= 100
    model, processor = clip  # the definition: 100 x cosine of the embeddings, mean over the images
    inputs = processor(text=captions, images=list(images.values()), return_tensors="pt", padding=True)
    with torch.no_grad():
        text = model.get_text_features(inputs["input_ids"], inputs["attention_mask"])
        image = model.get_image_features(inputs["pixel_values"])
    cosine = torch.nn.functional.cosine_similarity(text, image).mean()
    assert matched == pytest.approx(max(100 * float(cosine), 0.0), rel=1e-4)
    with pytest.raises(ValueError, match=r"8 images but 7 captions"):
        clip_score(clip, paths, captions[:7])


def test_a_missing_clip_folder_names_it_and_how_to_get_it(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"CLIP model folder not found \(no config\.json\): .*nope.*save_pretrained"
    ):
        load_clip(tmp_path / "nope")


def test_cached_reference_statistics_are_keyed_by_the_extractor_files_content(
    extractor_file, tmp_path, monkeypatch
):
    import mulo_sd.evaluation.metrics.fid as fid

    other = tmp_path / "other_extractor.pt2"  # the same network class with other weights
    program = torch.export.load(extractor_file)
    with torch.no_grad():
        for tensor in program.state_dict.values():
            tensor.mul_(2)
    torch.export.save(program, other)
    real = save_images(tmp_path / "real", random_images(20, 4))
    cache = tmp_path / "ref.npz"
    first = reference_statistics(load_feature_extractor(extractor_file), tmp_path / "real", 16, cache=cache)
    extractor = load_feature_extractor(other)
    second = reference_statistics(extractor, tmp_path / "real", 16, cache=cache)
    assert torch.allclose(second.mu, extract_features(extractor, real).mean(0))  # recomputed, not reused
    assert not torch.allclose(first.mu, second.mu)
    with np.load(cache) as data:
        source = str(data["source"])
    assert hashlib.sha256(other.read_bytes()).hexdigest() in source and "16 px" in source
    assert "protocol llamagen (centre-cropped square, LANCZOS to the resolution" in source
    torch.manual_seed(0)  # a module of the caller's own: keyed by its class and weights
    assert extractor_fingerprint(torch.nn.Linear(2, 2)) != extractor_fingerprint(torch.nn.Linear(2, 2))

    def no_extraction(*args, **kwargs):
        raise AssertionError("the cached statistics of this extractor file must be reused")

    monkeypatch.setattr(fid, "extract_features", no_extraction)
    again = reference_statistics(load_feature_extractor(other), tmp_path / "real", 16, cache=cache)
    assert torch.equal(again.mu, second.mu)
