import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from mulo_sd.evaluation.metrics.hpsv2 import HPS_FILES, hps_image, hps_scores, load_hps
from mulo_sd.nets.safe_files import UnsafePickleError
from tests.pickle_fixtures import save_hostile
from tests.real_eval_helpers import TINY_HPS_MODEL, colour_images, save_tiny_hps


@pytest.fixture(scope="module")
def hps_file(tmp_path_factory):
    return save_tiny_hps(tmp_path_factory.mktemp("hps") / "HPS_v2.1_compressed.pt")


@pytest.fixture(autouse=True)
def no_download(monkeypatch):
    """Nothing may download: every fetch of open_clip and the Hugging Face hub fails the test."""
    import huggingface_hub

    def refuse(*args, **kwargs):
        raise AssertionError("HPSv2 must load from the local file only")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)
    monkeypatch.setattr(open_clip.pretrained, "download_pretrained", refuse)
    monkeypatch.setattr(open_clip.pretrained, "download_pretrained_from_hf", refuse)


def save_images(folder, images):
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, image in enumerate(images):
        paths.append(folder / f"{i:03d}.png")
        Image.fromarray(image).save(paths[-1])
    return paths


def test_hps_scores_are_the_cosine_of_open_clips_own_normalised_features(hps_file, tmp_path):
    hps = load_hps(hps_file, TINY_HPS_MODEL)
    assert isinstance(hps.tokenizer, open_clip.SimpleTokenizer) and hps.image_size == 32
    generator = np.random.default_rng(0)
    arrays = [generator.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(5)]
    paths = save_images(tmp_path / "images", arrays)
    prompts = ["a red square", "a cat on a mat", "two dogs", "a blue car at night", "a bowl of soup"]
    scores = hps_scores(hps, paths, prompts, batch_size=2)
    # hpsv2/img_score.py: model(image, text) -> normalised features, logits = image @ text.T, the diagonal
    model = open_clip.create_model(TINY_HPS_MODEL, pretrained=None)
    model.load_state_dict(torch.load(hps_file, weights_only=True)["state_dict"])
    model.eval()
    mean, std = torch.tensor(hps.mean)[:, None, None], torch.tensor(hps.std)[:, None, None]
    images = torch.stack([(torch.from_numpy(a).permute(2, 0, 1) / 255 - mean) / std for a in arrays])
    with torch.no_grad():
        image_features, text_features, _ = model(images, open_clip.get_tokenizer(TINY_HPS_MODEL)(prompts))
    expected = torch.diagonal(image_features @ text_features.T)
    assert scores == pytest.approx(expected.tolist(), abs=1e-5)
    assert len(set(scores)) == 5 and all(-1 <= s <= 1 for s in scores)
    with pytest.raises(ValueError, match=r"5 images but 4 prompts"):
        hps_scores(hps, paths, prompts[:4])


def test_a_non_square_image_is_resized_on_its_long_side_and_padded_with_zero(hps_file, tmp_path):
    hps = load_hps(hps_file, TINY_HPS_MODEL)
    red = colour_images(16)["red"].permute(1, 2, 0).numpy()
    wide = np.concatenate([red] * 4, axis=1)  # 16 x 64: to 8 x 32, then 12 rows of padding above and below
    (path,) = save_images(tmp_path / "wide", [wide])
    pixels = hps_image(path, hps)
    assert pixels.shape == (3, 32, 32)
    zero = (-torch.tensor(hps.mean) / torch.tensor(hps.std))[:, None, None]
    assert torch.allclose(pixels[:, :12], zero.expand(3, 12, 32))
    assert torch.allclose(pixels[:, 20:], zero.expand(3, 12, 32))
    assert not torch.allclose(pixels[:, 12:20], zero.expand(3, 8, 32))


def test_hps_model_from_a_config_file_of_ones_own(hps_file):
    config = hps_file.parent / "open_clip_configs" / f"{TINY_HPS_MODEL}.json"
    hps = load_hps(hps_file, str(config))
    assert hps.image_size == 32
    with pytest.raises(
        FileNotFoundError, match=r"open_clip model config not found: .*nope\.json \(hps\.model\)"
    ):
        load_hps(hps_file, str(config.with_name("nope.json")))


def test_a_missing_or_wrong_hps_file_is_an_error_naming_it(hps_file, tmp_path):
    missing = tmp_path / HPS_FILES["v2.1"]
    with pytest.raises(FileNotFoundError) as error:
        load_hps(missing, TINY_HPS_MODEL)
    message = str(error.value)
    assert f"HPSv2 checkpoint not found: {missing}" in message
    assert "HPS_v2.1_compressed.pt" in message and "xswu/HPSv2" in message and "hps.checkpoint=" in message
    torch.save({"model": {}}, tmp_path / "bare.pt")
    with pytest.raises(
        ValueError, match=r"bare\.pt: an HPS checkpoint holds \{'state_dict': \.\.\.\}, found \['model'\]"
    ):
        load_hps(tmp_path / "bare.pt", TINY_HPS_MODEL)
    with pytest.raises(ValueError, match=r"does not fit open_clip's ViT-B-32"):
        load_hps(hps_file, "ViT-B-32")
    marker = tmp_path / "marker"
    save_hostile(tmp_path / "hostile.pt", marker)
    with pytest.raises(UnsafePickleError):
        load_hps(tmp_path / "hostile.pt", TINY_HPS_MODEL)
    assert not marker.exists()
