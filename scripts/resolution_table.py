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

# summary.csv column -> (table header, its interval's prefix or None)
MEASURES = {
    "speedup_median": ("speedup", "speedup"),
    "step_ratio_median": ("step ratio", None),
    "fd_ratio": ("FD / AR's", "fd_ratio"),
    "d_sceneeval": ("d SceneEval", "d_sceneeval"),
}


def read_summary(folder: Path) -> dict[str, dict]:
    """Family -> its summary.csv entry on the reported split (the first non-dev split, as summary.md)."""
    path = folder / "summary.csv"
    if not path.is_file():
        raise SystemExit(f"{path} not found: give the folder of a finished mulo-eval run")
    rows = list(csv.DictReader(path.open()))
    splits = [split for split in dict.fromkeys(row["split"] for row in rows) if split != "dev"]
    if not splits:
        raise SystemExit(f"{path} holds dev prompts only: the resolution table reports test prompts")
    return {row["family"]: row for row in rows if row["split"] == splits[0]}


def cell(row: dict, column: str, prefix: str | None) -> str:
    value = row.get(column)
    if value in (None, ""):
        return "-"
    text = f"{float(value):.3g}"
    low, high = (row.get(f"{prefix}_lo"), row.get(f"{prefix}_hi")) if prefix else (None, None)
    return f"{text} [{float(low):.3g}, {float(high):.3g}]" if low not in (None, "") else text


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
    header = ["method", "grid", "AR wall s", *(name for name, _ in MEASURES.values())]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for family in families:
        for grid, summary in grids.items():
            if family not in summary:
                continue
            row = summary[family]
            ar = next(entry for entry in summary.values() if entry["method"] == "ar")
            cells = [family, grid, f"{float(ar['wall_s_median']):.3g}"]
            cells += [cell(row, column, prefix) for column, (_, prefix) in MEASURES.items()]
            lines.append("| " + " | ".join(cells) + " |")
    print("\n".join(lines))
    plot(grids, families, args.out)
    print(f"wrote {args.out}")


def plot(grids: dict[str, dict], families: list[str], out: Path) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(3.2 * len(MEASURES), 3.2))
    names = list(grids)
    for axes, (column, (title, _)) in zip(figure.subplots(1, len(MEASURES)), MEASURES.items(), strict=True):
        for family in families:
            points = [(n, float(grids[g][family][column])) for n, g in enumerate(names)
                      if family in grids[g] and grids[g][family].get(column) not in (None, "")]  # fmt: skip
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
