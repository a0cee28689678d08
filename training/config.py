"""Where the entry points find their Hydra configs, and the resolvers those configs use.

The configs ship inside the package (`mulo_sd.conf`), and every path they name by default resolves through the
package or a per-user cache, never through the working directory, so the commands run from any folder:
- `${testbed:vq}`: the folder of a packaged testbed model (mulo_sd/assets/testbed/vq); `${testbed:}` the
  testbed folder itself (conf/models/testbed.yaml);
- `${cache_dir:data}`: a folder under the user's cache for generated data, shared by runs started anywhere:
  $MULO_SD_CACHE, else $XDG_CACHE_HOME/mulo-sd, else ~/.cache/mulo-sd.
- `${job_or_time:%Y-%m-%d_%H-%M-%S}` (the default run folder's name): $SLURM_JOB_ID inside a SLURM job, so
  every rank of a multi-node run, each started at its own time, writes to the same folder (and a requeued job
  finds its checkpoints again); elsewhere the current time in that format and the pid, so runs started in the
  same second get folders of their own.
Importing this module registers the resolvers; it does not import Lightning.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

import mulo_sd.conf
from omegaconf import OmegaConf

from mulo_sd.pipeline.testbed_models import TESTBED_DIR

CONFIG_DIR = Path(mulo_sd.conf.__file__).resolve().parent


def cache_dir(sub: str = "") -> str:
    """The user's mulo-sd cache folder (module docstring), or `sub` inside it."""
    root = os.environ.get("MULO_SD_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "mulo-sd")
    return os.path.join(root, sub) if sub else root


def testbed_model(name: str = "") -> str:
    """The packaged testbed model folder `name` (`${testbed:}`: the testbed folder itself); an unknown name is
    an error listing the known ones."""
    if not name:
        return str(TESTBED_DIR)
    folder = TESTBED_DIR / name
    if not folder.is_dir():
        known = sorted(p.name for p in TESTBED_DIR.iterdir() if p.is_dir())
        raise ValueError(
            f"${{testbed:{name}}}: no packaged testbed model '{name}' in {TESTBED_DIR}; known: {known}"
        )
    return str(folder)


def job_or_time(pattern: str) -> str:
    """$SLURM_JOB_ID when set, else the current time formatted by `pattern` and the pid (module docstring)."""
    return os.environ.get("SLURM_JOB_ID") or f"{datetime.now().strftime(pattern)}_{os.getpid()}"


for _name, _resolver in (("testbed", testbed_model), ("cache_dir", cache_dir), ("job_or_time", job_or_time)):
    if not OmegaConf.has_resolver(_name):
        # cached like Hydra's ${now:}: a config resolved twice names one folder
        OmegaConf.register_new_resolver(_name, _resolver, use_cache=_name == "job_or_time")
