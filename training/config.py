"""Where the entry points find their Hydra configs, and the resolvers those configs use.

The configs ship inside the package (`mulo_sd.conf`), and every path they name by default resolves through the
package or a per-user cache, never through the working directory, so the commands run from any folder:
- `${testbed:vq}`: the folder of a packaged testbed model (mulo_sd/assets/testbed/vq);
- `${cache_dir:data}`: a folder under the user's cache for generated data, shared by runs started anywhere:
  $MULO_SD_CACHE, else $XDG_CACHE_HOME/mulo-sd, else ~/.cache/mulo-sd.
Importing this module registers the resolvers; it does not import Lightning.
"""

from __future__ import annotations

import os
from pathlib import Path

import mulo_sd.conf
from omegaconf import OmegaConf

from mulo_sd.testbed import TESTBED_DIR

CONFIG_DIR = Path(mulo_sd.conf.__file__).resolve().parent


def cache_dir(sub: str = "") -> str:
    """The user's mulo-sd cache folder (module docstring), or `sub` inside it."""
    root = os.environ.get("MULO_SD_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "mulo-sd")
    return os.path.join(root, sub) if sub else root


def testbed_model(name: str) -> str:
    """The packaged testbed model folder `name`; an unknown name is an error listing the known ones."""
    folder = TESTBED_DIR / name
    if not folder.is_dir():
        known = sorted(p.name for p in TESTBED_DIR.iterdir() if p.is_dir())
        raise ValueError(
            f"${{testbed:{name}}}: no packaged testbed model '{name}' in {TESTBED_DIR}; known: {known}"
        )
    return str(folder)


for _name, _resolver in (("testbed", testbed_model), ("cache_dir", cache_dir)):
    if not OmegaConf.has_resolver(_name):
        OmegaConf.register_new_resolver(_name, _resolver)
