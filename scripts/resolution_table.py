"""docs/resolution.png and the resolution table of docs/results.md: every method's speedup over AR, step
ratio, FD ratio and SceneEval difference at each grid size, read from `mulo-eval` runs made on the same
captions and seeds with different model sets (e.g. `eval=readme`, 16x16 tokens, and `eval=headline_256`).

    python scripts/resolution_table.py 16x16=runs/eval_readme 32x32=runs/eval_headline_256 [--out PNG]

Each argument is `<grid>=<run folder>` (the folder holds summary.csv); the table is printed as markdown, one
row per method and grid, and the plot has one panel per measure with one line per method across the grids.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from mulo_sd.evaluation.tables import markdown_table, with_intervals

# summary.csv column -> its plot panel's title (the table shows the columns with their intervals)
MEASURES = {
    "speedup_median": "speedup",
    "step_ratio_median": "step ratio",
    "fd_ratio": "FD / AR's",
    "d_sceneeval": "d SceneEval",
}


def read_summary(folder: Path) -> dict[str, dict]:
    """Family -> its summary.csv entry on the reported split (the first non-dev split, as summary.md), the
    numbers as floats."""
    path = folder / "summary.csv"
    if not path.is_file():
        raise SystemExit(f"{path} not found: give the folder of a finished mulo-eval run")
    rows = list(csv.DictReader(path.open()))
    splits = [split for split in dict.fromkeys(row["split"] for row in rows) if split != "dev"]
    if not splits:
        raise SystemExit(f"{path} holds dev prompts only: the resolution table reports test prompts")
    if not any(row["method"] == "ar" for row in rows):
        raise SystemExit(f"{path} has no AR run: every speedup is over AR")
    shown = [row for row in rows if row["split"] == splits[0]]
    return {row["family"]: {key: _value(text) for key, text in row.items()} for row in shown}


def _value(text: str):
    """A summary.csv cell as the summary held it: bool, int, float, text, or None where empty."""
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text or None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="<grid>=<mulo-eval run folder>, smallest grid first")
    parser.add_argument("--out", type=Path, default=Path("docs/resolution.png"))
    args = parser.parse_args()
    grids = {}
    for item in args.runs:
        grid, _, folder = item.partition("=")
        if not folder:
            parser.error(f"expected <grid>=<run folder>, got {item!r}")
        grids[grid] = read_summary(Path(folder))
    families = list(dict.fromkeys(family for summary in grids.values() for family in summary))
    ar_wall = {grid: next(e for e in summary.values() if e["method"] == "ar")["wall_s_median"]
               for grid, summary in grids.items()}  # fmt: skip
    rows = [{**summary[family], "method": family, "grid": grid, "ar_wall_s": ar_wall[grid]}
            for family in families for grid, summary in grids.items() if family in summary]  # fmt: skip
    print(markdown_table(with_intervals(rows), ("method", "grid", "ar_wall_s", *MEASURES)))
    plot(grids, families, args.out)
    print(f"wrote {args.out}")


def plot(grids: dict[str, dict], families: list[str], out: Path) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(3.2 * len(MEASURES), 3.2))
    names = list(grids)
    for axes, (column, title) in zip(figure.subplots(1, len(MEASURES)), MEASURES.items(), strict=True):
        for family in families:
            points = [(n, grids[g][family][column]) for n, g in enumerate(names)
                      if family in grids[g] and grids[g][family].get(column) is not None]  # fmt: skip
            if points and family != "AR":
                axes.plot(*zip(*points, strict=True), marker="o", label=family)
        axes.set_xticks(range(len(names)), names)
        axes.set_title(title, fontsize=9)
        axes.set_xlabel("token grid")
    figure.axes[0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(out, dpi=90)


if __name__ == "__main__":
    main()
