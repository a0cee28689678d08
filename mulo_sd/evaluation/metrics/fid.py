"""FID with torchmetrics' FrechetInceptionDistance, the feature extractor loaded from a local file (nothing
downloads; docs/real_evaluation.md).

    extractor = load_feature_extractor("/models/weights-inception-2015-12-05-6726825d.pth")
    reference = reference_statistics(extractor, "coco/val2017", size=256)   # or load_statistics("coco.npz")
    fid = frechet_distance(extract_features(extractor, generated_paths, resolution=256), reference)

Feature extractors:
- the FID Inception-v3 (the TensorFlow FID network as torch-fidelity ports it, torchmetrics' default
  extractor, 2048 features): its weights file `INCEPTION_FILE`, fetched once from `INCEPTION_URL`;
- any module saved with torch.export (a `.pt2` file) that maps uint8 images [N, 3, H, W] to features
  [N, D], exported with a dynamic batch dimension: a small network for a quick check, or another feature
  space.
Images reach the extractor through a resizing protocol (`fid_protocols.py`: `llamagen`, the default,
`clean` or `adm`), the same for generated and reference images. Features are extracted once per image and
the distance is torchmetrics' own computation over them, so the subsets of one set of images (dev and test
prompts) cost no second pass through the extractor.

The Inception weights file is a pickle, which torch-fidelity unpickles fully: it is read with
weights_only=True first and refused, naming the classes it needs, when it holds more than tensors (unless
`fid.trust_pickle=true`; mulo_sd/nets/safe_files.py).

Reference statistics: `mu` [D] and `sigma` [D, D] (and `count`) in an `.npz` file, the layout pytorch-fid
and clean-fid write; `reference_statistics` computes them from a folder of real images (under the protocol,
at the evaluation resolution) and caches them in such a file, keyed by the extractor file's sha256 and the
protocol.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from mulo_sd.evaluation.metrics.fid_protocols import DEFAULT_FID_PROTOCOL, describe, protocol_batches
from mulo_sd.evaluation.metrics.images import image_files
from mulo_sd.nets.safe_files import UnreadableTorchFile, load_torch_file

INCEPTION_FILE = "weights-inception-2015-12-05-6726825d.pth"
INCEPTION_URL = f"https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/{INCEPTION_FILE}"
TRUST_OPT_IN = "fid.trust_pickle=true"
FINGERPRINT = "fid_extractor_sha256"  # the attribute load_feature_extractor sets: its file's sha256


def check_extractor_file(path: str | Path) -> Path:
    """`path`, after checking that the feature extractor file exists (the error says where to get it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"FID feature extractor not found: {path}. The standard FID Inception is {INCEPTION_FILE} "
            f"(91 MB): download {INCEPTION_URL} on a machine with internet and pass its path as "
            "fid.extractor=<path>; nothing is downloaded at run time."
        )
    return path


def load_feature_extractor(
    path: str | Path, device: str | torch.device = "cpu", trust_pickle: bool = False
) -> nn.Module:
    """The FID Inception from its weights file, or a torch.export `.pt2` module (module docstring). A weights
    file whose pickle needs more than tensors and plain containers is refused unless `trust_pickle`
    (`fid.trust_pickle=true`): unpickling it could run code stored in it. The module carries the file's
    sha256 (`extractor_fingerprint`)."""
    path = check_extractor_file(path)
    data = path.read_bytes()
    if path.suffix == ".pt2":
        extractor = torch.export.load(io.BytesIO(data)).module()
    else:
        extractor = _inception(path, data, trust_pickle)
    setattr(extractor, FINGERPRINT, hashlib.sha256(data).hexdigest())
    return extractor.to(device)


def _inception(path: Path, data: bytes, trust_pickle: bool) -> nn.Module:
    from torchmetrics.image.fid import NoTrainInceptionV3

    neither = f"{path} is neither the FID Inception weights ({INCEPTION_FILE}) nor a torch.export .pt2 file"
    try:
        if not trust_pickle:  # torch-fidelity unpickles fully (weights_only=False): check the bytes first
            load_torch_file(path, opt_in=TRUST_OPT_IN, data=data)
        # the bytes just checked, not the file again
        weights = io.BytesIO(data)
        return NoTrainInceptionV3(
            name="inception-v3-compat", features_list=["2048"], feature_extractor_weights_path=weights
        )
    except (UnreadableTorchFile, RuntimeError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
        raise ValueError(f"{neither}: {str(error).splitlines()[0]}") from None


def extractor_fingerprint(extractor: nn.Module) -> str:
    """sha256 of the file `extractor` was loaded from (load_feature_extractor), else of its class and
    weights: what reference statistics computed with it are keyed by."""
    digest = getattr(extractor, FINGERPRINT, None)
    if digest is not None:
        return digest
    hasher = hashlib.sha256(type(extractor).__qualname__.encode())
    for name, tensor in extractor.state_dict().items():
        hasher.update(name.encode() + tensor.detach().cpu().flatten().view(torch.uint8).numpy().tobytes())
    return hasher.hexdigest()


@torch.no_grad()
def extract_features(
    extractor: nn.Module,
    paths: list[Path],
    resolution: int | None = None,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    protocol: str = DEFAULT_FID_PROTOCOL,
) -> torch.Tensor:
    """float64 [N, D] features of the images at `paths` under the resizing `protocol` at `resolution`
    (None: the images' own size; fid_protocols.py), on the CPU."""
    features = [
        extractor(batch.to(device)).reshape(len(batch), -1).double().cpu()
        for batch in protocol_batches(list(paths), protocol, resolution, batch_size)
    ]
    return torch.cat(features)


@dataclass
class FIDStatistics:
    mu: torch.Tensor  # float64 [D]
    sigma: torch.Tensor  # float64 [D, D]
    count: int

    @classmethod
    def of(cls, features: torch.Tensor) -> FIDStatistics:
        if len(features) < 2:
            raise ValueError(f"FID statistics need at least 2 images, got {len(features)}")
        features = features.double()
        return cls(features.mean(0), torch.cov(features.T), len(features))

    def save(self, path: str | Path, source: str = "") -> Path:
        np.savez(path, mu=self.mu.numpy(), sigma=self.sigma.numpy(), count=self.count, source=source)
        return Path(path)


def load_statistics(path: str | Path, dims: int | None = None) -> FIDStatistics:
    """Statistics from an `.npz` with `mu` and `sigma` (`count` optional); `dims`: the extractor's feature
    count, which they must match."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"FID reference statistics not found: {path}")
    with np.load(path) as data:
        for name in ("mu", "sigma"):
            if name not in data:
                raise ValueError(
                    f"{path}: FID statistics need the field '{name}', found {sorted(data.files)}"
                )
        mu, sigma = torch.from_numpy(data["mu"]).double(), torch.from_numpy(data["sigma"]).double()
        count = int(data["count"]) if "count" in data else 2
    if mu.ndim != 1 or sigma.shape != (len(mu), len(mu)):
        raise ValueError(f"{path}: field 'sigma' must be [D, D] for 'mu' [D], got {tuple(sigma.shape)}")
    if dims is not None and len(mu) != dims:
        raise ValueError(
            f"{path}: field 'mu' has {len(mu)} features, the feature extractor gives {dims}: statistics "
            "from another feature space"
        )
    return FIDStatistics(mu, sigma, count)


def reference_statistics(
    extractor: nn.Module,
    reference: str | Path,
    size: int,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    cache: str | Path | None = None,
    protocol: str = DEFAULT_FID_PROTOCOL,
) -> FIDStatistics:
    """Statistics of `reference`: an `.npz` statistics file, or a folder of real images brought to `size`
    under the resizing `protocol`. A folder's statistics are saved to `cache` and read back from it while
    folder, file count, protocol, size and the extractor (its file's sha256: `extractor_fingerprint`) stay
    the same."""
    reference = Path(reference)
    if reference.suffix == ".npz":
        return load_statistics(reference)
    files = image_files(reference)
    source = (
        f"{reference.resolve()} | {len(files)} images | protocol {describe(protocol, size)} | "
        f"extractor sha256 {extractor_fingerprint(extractor)}"
    )
    if cache is not None and Path(cache).is_file():
        with np.load(cache) as data:
            if "source" in data and str(data["source"]) == source:
                return load_statistics(cache)
    statistics = FIDStatistics.of(extract_features(extractor, files, size, batch_size, device, protocol))
    if cache is not None:
        statistics.save(cache, source)
    return statistics


class _Precomputed(nn.Module):
    """Passes features through, so torchmetrics' FID accumulates and compares features extracted earlier."""

    def __init__(self, dims: int):
        super().__init__()
        self.num_features = dims

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features


def frechet_distance(features: torch.Tensor, reference: torch.Tensor | FIDStatistics) -> float:
    """FID of images with `features` [N, D] against reference features [M, D] or statistics."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    # the features are already gathered: no sync with other ranks (which have finished)
    metric = FrechetInceptionDistance(feature=_Precomputed(features.shape[1]), sync_on_compute=False)
    if isinstance(reference, FIDStatistics):
        if len(reference.mu) != features.shape[1]:
            raise ValueError(f"reference has {len(reference.mu)} features, the images {features.shape[1]}")
        # the metric's running sums that give back exactly this mean and covariance
        n = max(reference.count, 2)
        metric.real_features_sum = reference.mu * n
        metric.real_features_cov_sum = reference.sigma * (n - 1) + n * torch.outer(reference.mu, reference.mu)
        metric.real_features_num_samples = torch.tensor(n)
    else:
        metric.update(reference.double(), real=True)
    metric.update(features.double(), real=False)
    return float(metric.compute())
