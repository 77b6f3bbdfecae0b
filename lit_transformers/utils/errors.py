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
    except BrokenPipeError:
        # the reader of our output left (``lit-translate < in | head``): stop without a traceback, and point
        # stdout at /dev/null so that Python's flush at exit does not raise the same error again (Python's
        # documented recipe for SIGPIPE, signal module docs)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except USER_ERRORS as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        message = str(err).strip() or type(err).__name__
        print(
            f"Error ({type(err).__name__}): {message}\n(set HYDRA_FULL_ERROR=1 for the full traceback)",
            file=sys.stderr,
        )
        sys.exit(1)
