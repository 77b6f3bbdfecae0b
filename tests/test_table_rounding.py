"""log_table is the one place a table's numbers are rounded: to four significant digits, or to the decimal
places a column is read with (chrF to 1, as sacreBLEU prints it), the same in CSV as on every dashboard."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.loggers import CSVLogger

from lit_transformers.utils.dashboards import log_table

ROWS = [("Hallo Welt", 45.2671, 0.123456789, 7), ("Guten Tag", 100.0, 0.98765, 12)]
COLUMNS = ["hypothesis", "chrF", "probability", "images"]


def _csv_trainer(tmp_path: Path) -> tuple[L.Trainer, CSVLogger]:
    logger = CSVLogger(tmp_path, name="csv")
    return L.Trainer(logger=logger, accelerator="cpu", enable_progress_bar=False), logger


def test_named_columns_take_their_decimals_and_the_rest_four_significant_digits(tmp_path):
    trainer, logger = _csv_trainer(tmp_path)
    log_table(trainer, "val/translations", COLUMNS, ROWS, decimals={"chrF": 1})
    with open(Path(logger.log_dir) / "val_translations.csv", encoding="utf-8", newline="") as f:
        assert list(csv.reader(f)) == [
            ["step", *COLUMNS],
            ["0", "Hallo Welt", "45.3", "0.1235", "7"],  # f"{45.2671:.1f}", f"{0.123456789:.4g}"
            ["0", "Guten Tag", "100.0", "0.9877", "12"],
        ]


def test_decimals_of_a_column_the_table_lacks_are_refused(tmp_path):
    trainer, _ = _csv_trainer(tmp_path)
    with pytest.raises(ValueError, match=r"decimals names \['chrf'\], which are not among its columns"):
        log_table(trainer, "val/translations", COLUMNS, ROWS, decimals={"chrf": 1})
