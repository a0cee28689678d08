"""The package layout (docs/layout.md): the runtime's layers hold, the runtime never needs the trainer, and
every module and function stays short enough to read in one sitting."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "mulo_sd"
SOURCE_FOLDERS = ("mulo_sd", "training", "data")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# Installed from training/, data/ and conf/: import-linter, which reads the mulo_sd/ folder, cannot see them.
TRAINER_PACKAGES = ("mulo_sd.training", "mulo_sd.data", "mulo_sd.conf")


def lint_imports(package_parent: Path) -> subprocess.CompletedProcess:
    """`lint-imports` with pyproject.toml's contracts over the `mulo_sd` package found in package_parent."""
    executable = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(executable).exists():
        pytest.fail("lint-imports is missing: pip install -e '.[dev]' brings import-linter")
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run(
        [executable, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=package_parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def imported_modules(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, relative imports resolved."""
    package = path.relative_to(root).parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                found.append((node.lineno, f"{base}.{node.module}" if node.module else base))
            else:
                found.append((node.lineno, node.module))
    return found


def trainer_imports(root: Path) -> list[str]:
    """'file:line: module' for every import of the trainer's packages under root/mulo_sd."""
    return [
        f"{path.relative_to(root)}:{line}: {module}"
        for path in sorted((root / "mulo_sd").rglob("*.py"))
        for line, module in imported_modules(path, root)
        if any(module == name or module.startswith(name + ".") for name in TRAINER_PACKAGES)
    ]


def too_long(folders: tuple[str, ...]) -> list[str]:
    problems = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            source = path.read_text()
            name = path.relative_to(ROOT)
            if (lines := len(source.splitlines())) > MAX_MODULE_LINES:
                problems.append(f"{name}: {lines} lines")
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    if (length := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                        problems.append(f"{name}:{node.lineno}: {node.name} has {length} lines")
    return problems


def test_the_layer_contracts_hold():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken." in result.stdout


@pytest.mark.parametrize(
    ("module", "bad_import", "broken"),
    [
        ("nets/io.py", "import mulo_sd.pipeline.model_set", "mulo_sd.nets.io -> mulo_sd.pipeline.model_set"),
        ("tar/files.py", "import mulo_sd.testbed.captions", "mulo_sd.tar.files -> mulo_sd.testbed.captions"),
        ("decoding/accept.py", "import lightning", "mulo_sd.decoding.accept -> lightning"),
    ],
)
def test_an_import_across_a_layer_breaks_the_contract(tmp_path, module, bad_import, broken):
    copy = tmp_path / "mulo_sd"
    shutil.copytree(RUNTIME, copy, ignore=shutil.ignore_patterns("assets", "__pycache__"))
    with open(copy / module, "a") as file:
        file.write(f"\n{bad_import}  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert broken in result.stdout


def test_the_runtime_never_imports_the_trainer():
    assert trainer_imports(ROOT) == []


def test_the_trainer_import_check_sees_absolute_and_relative_imports(tmp_path):
    folder = tmp_path / "mulo_sd" / "decoding"
    folder.mkdir(parents=True)
    probe = "import numpy\nfrom mulo_sd.training.frozen import frozen\nfrom ..data import cli\n"
    (folder / "probe.py").write_text(probe)
    probe_path = Path("mulo_sd", "decoding", "probe.py").as_posix()
    assert trainer_imports(tmp_path) == [
        f"{probe_path}:2: mulo_sd.training.frozen",
        f"{probe_path}:3: mulo_sd.data",
    ]


def test_no_module_or_function_is_too_long_to_read():
    assert too_long(SOURCE_FOLDERS) == []
