"""Turn the errors a user causes (config, paths, data, diverging loss) into one paragraph and exit 1."""

from __future__ import annotations

import contextlib
import os
import sys

from hydra.errors import HydraException
from lightning.fabric.utilities.exceptions import MisconfigurationException
from omegaconf.errors import OmegaConfBaseException


class DiskFull(OSError):
    """No room on the disk for a file the run must write (a checkpoint): the user frees space or moves the run."""


USER_ERRORS = (
    HydraException,  # includes InstantiationException: a constructor rejected a config value
    OmegaConfBaseException,
    MisconfigurationException,
    FileNotFoundError,
    FloatingPointError,
    ValueError,
    KeyError,
    ImportError,
    DiskFull,
)


@contextlib.contextmanager
def report_user_errors():
    """``HYDRA_FULL_ERROR=1`` keeps the full traceback, as in every Hydra app."""
    try:
        yield
    except USER_ERRORS as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        message = str(err).strip() or type(err).__name__
        print(
            f"Error ({type(err).__name__}): {message}\n(set HYDRA_FULL_ERROR=1 for the full traceback)",
            file=sys.stderr,
        )
        sys.exit(1)
