"""The console scripts `mulo-decode` and `mulo-eval` (pyproject.toml). `--help` / `-h` answers at once from
the config files (training/knob_help.py), before torch, Lightning or Hydra are imported; anything else,
Hydra's own `--hydra-help` included, runs the Hydra entry point (training/decode.py, training/evaluate.py).
"""

from __future__ import annotations

import sys

HELP_FLAGS = ("--help", "-h")
DECODE = "decode one caption with one method on a model set, print its statistics and write the image."
EVALUATE = (
    "decode prompts with every run of a preset side by side, batch 1, and write speed and quality tables "
    "against AR (docs/evaluation.md)."
)


def wants_help(arguments: list[str]) -> bool:
    return any(argument in HELP_FLAGS for argument in arguments)


def decode() -> None:
    if wants_help(sys.argv[1:]):
        from mulo_sd.training.knob_help import command_help

        note = "conf/decode.yaml, conf/decode/default.yaml"
        print(command_help("mulo-decode", DECODE, "decode", ("models",), ("decode",), note), end="")
        return
    from mulo_sd.training.decode import main

    main()


def evaluate() -> None:
    if wants_help(sys.argv[1:]):
        from mulo_sd.training.knob_help import command_help

        note = "conf/evaluate.yaml; the preset, eval=NAME, sets some of them, e.g. runs and prompts.count"
        print(command_help("mulo-eval", EVALUATE, "evaluate", ("eval", "models", "logger"), (), note), end="")
        return
    from mulo_sd.training.evaluate import main

    main()
