"""The runs of an evaluation (docs/evaluation.md section 1): a run is one operating point, a method with its
knobs; config entries expand into runs (a knob sweep gives one run per value), and the one plain-AR run is
the reference every speedup and paired difference is measured against. A run with `compile: true` decodes
through torch.compile'd model steps (mulo_sd/nets/compiled.py), so a compiled AR can stand beside the eager
one; the reference is the eager AR run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mulo_sd.pipeline.decode_entry import required_models, resolve_knobs
from mulo_sd.pipeline.run_models import check_folders

REFERENCE_METHOD = "ar"
ENTRY_KEYS = ("method", "family", "label", "knobs", "sweep", "folders", "ablation", "compile")


@dataclass
class RunSpec:
    """One operating point: `method` with `knobs`. `family` groups a knob sweep into one curve / table row
    (default: the method); `label` names the run uniquely (default: family and knobs); `folders` (role ->
    folder) gives the run its own model for a role (mulo_sd/pipeline/run_models.py); `ablations` names the
    ablation tables the run appears in; `compile`: the run decodes through compiled model steps (give it a
    family or label of its own beside the eager run of the same method)."""

    method: str
    knobs: dict = field(default_factory=dict)
    family: str = ""
    label: str = ""
    folders: dict = field(default_factory=dict)
    ablations: tuple[str, ...] = ()
    compile: bool = False

    def __post_init__(self):
        resolve_knobs(self.method, self.knobs)  # a bad method or knob fails before anything is decoded
        self.family = self.family or self.method
        self.label = self.label or " ".join([self.family, *(f"{k}={v}" for k, v in self.knobs.items())])
        check_folders(self.label, self.folders, required_models(self.method, self.knobs))


def expand_runs(entries: list[dict]) -> list[RunSpec]:
    """Run specs from config entries `{method, family?, label?, knobs?, sweep?: {knob: [values]}, folders?:
    {role: folder}, ablation?: name or [names], compile?: bool}`; a sweep (one knob) gives one run per value,
    labelled '<family> <knob>=<value>'; `label` names a run without a sweep."""
    runs = []
    for entry in entries:
        unknown = sorted(set(entry) - set(ENTRY_KEYS))
        if unknown or "method" not in entry:
            raise ValueError(f"a run entry has keys {', '.join(ENTRY_KEYS)} (method required), got {entry}")
        knobs, family = dict(entry.get("knobs") or {}), entry.get("family") or entry["method"]
        sweep, folders = dict(entry.get("sweep") or {}), dict(entry.get("folders") or {})
        ablations = entry.get("ablation") or ()
        ablations = (ablations,) if isinstance(ablations, str) else tuple(ablations)
        compile = bool(entry.get("compile"))
        if len(sweep) > 1:
            raise ValueError(f"a run entry sweeps one knob, got {sorted(sweep)} for family '{family}'")
        if sweep and entry.get("label"):
            raise ValueError(
                f"a run entry with a sweep is labelled by its values, not label '{entry['label']}'"
            )
        if not sweep:
            label = entry.get("label") or ""
            runs.append(RunSpec(entry["method"], knobs, family, label, folders, ablations, compile))
            continue
        ((name, values),) = sweep.items()
        for value in values:
            label = f"{family} {name}={value}"
            runs.append(
                RunSpec(entry["method"], {**knobs, name: value}, family, label, folders, ablations, compile)
            )
    return runs


def reference_run(runs: list[RunSpec]) -> RunSpec:
    """The single eager plain-AR run every speedup is measured against."""
    references = [run for run in runs if run.method == REFERENCE_METHOD and not run.compile]
    if len(references) != 1:
        raise ValueError(
            f"the run set needs exactly one '{REFERENCE_METHOD}' run (the speed reference), got "
            f"{[run.label for run in references]}"
        )
    labels = [run.label for run in runs]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise ValueError(f"run labels must be unique, got {duplicates} more than once")
    return references[0]


def compiled_reference_run(runs: list[RunSpec]) -> RunSpec | None:
    """The compiled plain-AR run, a second speed reference (speedup_compiled_ar), or None without one."""
    compiled = [run for run in runs if run.method == REFERENCE_METHOD and run.compile]
    if len(compiled) > 1:
        raise ValueError(
            f"the run set has at most one compiled '{REFERENCE_METHOD}' run (the compiled speed reference), "
            f"got {[run.label for run in compiled]}"
        )
    return compiled[0] if compiled else None
