"""No loader runs code from a file it is given (mulo_sd/nets/safe_files.py): each gets a crafted pickle whose
unpickling would create a marker file, refuses it naming the file, the classes it needs and the opt-in (or how
to re-save it), and the marker is never written."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mulo_sd.evaluation.metrics.clip_score import load_clip
from mulo_sd.evaluation.metrics.fid import load_feature_extractor
from mulo_sd.llamagen.t5 import T5TextEncoder
from mulo_sd.nets.pixel_samplers import load_sr_model
from mulo_sd.nets.safe_files import UnsafePickleError, load_torch_file, pickle_globals
from mulo_sd.tar.files import check_mllm_folder, read_tatok_shape
from mulo_sd.tar.mllm import TarMLLM
from mulo_sd.tar.tatok import TATokDecoder, TATokError
from tests.official_fixtures import write_tiny_t5
from tests.pickle_fixtures import WritesMarker, make_bin_hostile, save_hostile
from tests.real_eval_helpers import save_tiny_clip
from tests.tar_fixtures import write_tatok_file, write_tiny_tar_mllm

OPEN = r"\['(_?io|builtins)\.open'\]"  # what WritesMarker's pickle names


def test_a_code_carrying_pickle_is_refused_naming_its_globals_and_the_opt_in(tmp_path):
    marker = tmp_path / "marker"
    path = save_hostile(tmp_path / "hostile.pt", marker, {"w": torch.ones(2)})
    assert len(pickle_globals(path)) == 1
    refusal = rf"hostile\.pt needs {OPEN} to unpickle.*pass my\.opt_in=true"
    with pytest.raises(UnsafePickleError, match=refusal):
        load_torch_file(path, opt_in="my.opt_in=true")
    resave = r"load it once with torch\.load.*torch\.save only its tensors"
    with pytest.raises(UnsafePickleError, match=resave):
        load_torch_file(path)  # a loader without an opt-in says how to re-save the file
    torch.save({"hook": WritesMarker(marker)}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(UnsafePickleError, match=r"legacy\.pt needs \['(_?io|builtins)\.open'\]"):
        load_torch_file(tmp_path / "legacy.pt", opt_in="x", mmap=True)
    assert not marker.exists()
    torch.save({"w": torch.ones(2)}, tmp_path / "plain.pt")
    assert torch.equal(load_torch_file(tmp_path / "plain.pt", mmap=True)["w"], torch.ones(2))
    load_torch_file(path, trust_pickle=True)  # the opt-in unpickles fully: the marker's code runs
    assert marker.exists()


def test_a_super_resolution_file_is_unpickled_only_with_trust_pickle(tmp_path):
    marker = tmp_path / "marker"
    save_hostile(tmp_path / "hostile.pt", marker)
    with pytest.raises(UnsafePickleError, match=rf"hostile\.pt needs {OPEN} .*pass trust_pickle=True"):
        load_sr_model(tmp_path / "hostile.pt", 2, torch.device("cpu"))
    assert not marker.exists()
    torch.save(nn.Upsample(scale_factor=2), tmp_path / "module.pt")  # a whole module is a pickle of classes
    cpu = torch.device("cpu")
    with pytest.raises(UnsafePickleError, match=r"nn\.modules\.upsampling\.Upsample.*trust_pickle=True"):
        load_sr_model(tmp_path / "module.pt", 2, cpu)
    assert isinstance(load_sr_model(tmp_path / "module.pt", 2, cpu, trust_pickle=True).network, nn.Upsample)
    torch.jit.save(torch.jit.script(nn.Conv2d(3, 3, 1)), tmp_path / "scripted.pt")  # TorchScript needs none
    assert load_sr_model(tmp_path / "scripted.pt", 2, cpu)(torch.zeros(1, 3, 4, 4)).shape[1] == 3


def test_a_code_carrying_fid_inception_file_is_refused_naming_fid_trust_pickle(tmp_path):
    marker = tmp_path / "marker"
    save_hostile(tmp_path / "inception.pth", marker)  # torch-fidelity unpickles it with weights_only=False
    refusal = rf"inception\.pth needs {OPEN} .*pass fid\.trust_pickle=true"
    with pytest.raises(UnsafePickleError, match=refusal):
        load_feature_extractor(tmp_path / "inception.pth")
    assert not marker.exists()


def test_a_code_carrying_clip_folder_is_refused_with_how_to_resave_it(tmp_path):
    marker = tmp_path / "marker"
    folder = save_tiny_clip(tmp_path / "clip", steps=1)
    make_bin_hostile(folder, marker)
    resave = r"CLIPModel\.from_pretrained\('.*clip', weights_only=False\)\.save_pretrained"
    with pytest.raises(UnsafePickleError, match=rf"pytorch_model\.bin needs {OPEN} .*safetensors: `{resave}"):
        load_clip(folder)
    assert not marker.exists()


def test_a_code_carrying_t5_folder_is_refused_with_how_to_resave_it(tmp_path):
    marker = tmp_path / "marker"
    make_bin_hostile(write_tiny_t5(tmp_path / "t5"), marker)
    refusal = rf"pytorch_model\.bin needs {OPEN} .*T5EncoderModel\.from_pretrained"
    with pytest.raises(UnsafePickleError, match=refusal):
        T5TextEncoder(tmp_path / "t5")
    assert not marker.exists()


def test_code_carrying_tar_files_are_refused(tmp_path):
    marker = tmp_path / "marker"
    write_tatok_file(tmp_path / "ta_tok.pth", 24)
    make_bin_hostile(write_tiny_tar_mllm(tmp_path / "mllm"), marker)
    refusal = rf"pytorch_model\.bin needs {OPEN} .*Qwen2ForCausalLM\.from_pretrained"
    with pytest.raises(UnsafePickleError, match=refusal):
        check_mllm_folder(tmp_path / "mllm")
    with pytest.raises(UnsafePickleError, match=r"pytorch_model\.bin needs"):
        TarMLLM.from_pretrained(tmp_path / "mllm", tmp_path / "ta_tok.pth")
    save_hostile(tmp_path / "hostile.pth", marker, torch.load(tmp_path / "ta_tok.pth", weights_only=True))
    with pytest.raises(TATokError, match=rf"hostile\.pth needs {OPEN} .*torch\.save only its tensors"):
        TATokDecoder.from_checkpoint(tmp_path / "hostile.pth")
    with pytest.raises(UnsafePickleError, match=rf"hostile\.pth needs {OPEN}"):
        read_tatok_shape(tmp_path / "hostile.pth")
    assert not marker.exists()
