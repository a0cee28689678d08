import numpy as np
import pytest
import torch
from PIL import Image

from mulo_sd.evaluation.metrics.fid import (
    extract_features,
    frechet_distance,
    load_feature_extractor,
    reference_statistics,
)
from mulo_sd.evaluation.metrics.fid_protocols import (
    FID_PROTOCOLS,
    center_crop_arr,
    clean_resize,
    describe,
    protocol_image,
)
from tests.real_eval_helpers import save_tiny_extractor


@pytest.fixture(scope="module")
def extractor(tmp_path_factory):
    return load_feature_extractor(save_tiny_extractor(tmp_path_factory.mktemp("fid") / "tiny.pt2"))


def save_random(folder, n, seed, size):
    folder.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        # smooth blobs plus noise: resizing filters treat them differently
        base = generator.integers(0, 256, (size[1] // 4, size[0] // 4, 3), dtype=np.uint8)
        image = Image.fromarray(base).resize(size, Image.Resampling.NEAREST)
        noisy = np.asarray(image).astype(int) + generator.integers(-30, 30, (size[1], size[0], 3))
        paths.append(folder / f"{i:03d}.png")
        Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(paths[-1])
    return paths


def test_two_protocols_give_different_fids_for_the_same_images(extractor, tmp_path):
    generated = save_random(tmp_path / "generated", 12, 0, (32, 32))
    save_random(tmp_path / "real", 16, 1, (56, 40))  # non-square, larger: cropped and resized
    fids = {}
    for protocol in FID_PROTOCOLS:
        reference = reference_statistics(
            extractor, tmp_path / "real", 16, cache=tmp_path / f"{protocol}.npz", protocol=protocol
        )
        features = extract_features(extractor, generated, 16, protocol=protocol)
        fids[protocol] = frechet_distance(features, reference)
    assert fids["llamagen"] > 0 and fids["adm"] > 0 and fids["clean"] > 0
    # the same images, three protocols, three numbers: the option changes what is measured
    assert abs(fids["llamagen"] - fids["adm"]) > 0.05 * max(fids.values())
    assert abs(fids["llamagen"] - fids["clean"]) > 1e-6
    with np.load(tmp_path / "adm.npz") as data:
        assert "protocol adm (ADM center_crop_arr to the resolution" in str(data["source"])


def test_protocol_images_take_the_shapes_and_filters_of_their_evaluators(tmp_path):
    (path,) = save_random(tmp_path / "one", 1, 2, (56, 40))
    adm = protocol_image(path, "adm", 16)
    assert adm.shape == (3, 16, 16) and adm.dtype == torch.uint8  # the Inception resizes it itself
    for protocol in ("llamagen", "clean"):
        assert protocol_image(path, protocol, 16).shape == (3, 299, 299)
    with Image.open(path) as image:
        image = image.convert("RGB")
        # ADM: 56 x 40 -> halved (BOX, short side >= 2 x 16) to 28 x 20 -> bicubic to 22 x 16 -> centre crop
        halved = image.resize((28, 20), Image.Resampling.BOX)
        expected = np.asarray(halved.resize((22, 16), Image.Resampling.BICUBIC))[:, 3:19]
        assert np.array_equal(adm.permute(1, 2, 0).numpy(), expected)
        # LlamaGen: centre square 40 x 40 (8 columns off each side), LANCZOS to 16, clean-fid's resize
        square = image.crop((8, 0, 48, 40)).resize((16, 16), Image.Resampling.LANCZOS)
        assert torch.equal(
            protocol_image(path, "llamagen", 16),
            torch.from_numpy(np.asarray(clean_resize(square)).copy()).permute(2, 0, 1),
        )
        big = Image.fromarray(np.zeros((80, 100, 3), dtype=np.uint8))
        assert center_crop_arr(big, 16).size == (16, 16)  # halved (BOX) to 50 x 40 first
    # clean-fid's resize is bicubic on float32 channels, not PIL's uint8 bicubic
    flat = Image.fromarray(np.full((16, 16, 3), 100, dtype=np.uint8))
    assert np.all(np.asarray(clean_resize(flat)) == 100)
    with pytest.raises(
        ValueError, match=r"protocol='torchmetrics' is not one of \['adm', 'clean', 'llamagen'\]"
    ):
        protocol_image(path, "torchmetrics")
    assert describe("llamagen", 256).startswith("llamagen (centre-cropped square, LANCZOS to the resolution")
    assert describe("adm", None).endswith("resolution the images' own size)")
