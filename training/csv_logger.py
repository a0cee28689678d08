"""Lightning's CSVLogger, continued across launches: a run resumed into its own folder appends its rows to
metrics.csv, where Lightning's writer would delete the earlier launches' rows first."""

from __future__ import annotations

import csv

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment


class AppendingWriter(ExperimentWriter):
    def _check_log_dir_exists(self) -> None:
        # called by the writer's __init__, where Lightning deletes metrics.csv: read its columns instead, so
        # rows are appended and a new column rewrites the file with every earlier row (the writer's own code)
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as file:
                self.metrics_keys = list(csv.DictReader(file).fieldnames or [])


class AppendingCSVLogger(CSVLogger):
    """CSVLogger whose metrics.csv keeps the rows of earlier launches into the same folder (module docstring).
    A resume from a checkpoint before the last logged step repeats those steps below the earlier rows."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = AppendingWriter(log_dir=self.log_dir)
        return self._experiment
