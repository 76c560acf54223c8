"""Files shipped inside the package: the default predictor and the packaged sweep configs.

They are package data (``pyproject.toml``), found with ``importlib.resources``, so a normal
(non-editable) ``pip install`` finds them wherever it puts the package; nothing here assumes
a repository checkout next to the code. This folder holds the only copy of each file.

* ``predictors/default.json``: the shipped predictor (``hpo calibrate
  configs/calibration/default_sizes.yaml --fit-only --predictor-out`` writes it; 0.02M-1.2M
  parameters), the default of every sweep.
* ``sweeps/<name>.yaml``: sweeps runnable by name from any directory, ``hpo sweep quickstart``.
"""

from __future__ import annotations

import shutil
import tempfile
from importlib.resources import as_file, files
from pathlib import Path

#: The shipped predictor, relative to this package.
DEFAULT_PREDICTOR = "predictors/default.json"
SWEEPS = "sweeps"


def resource_path(relative: str) -> Path:
    """A real filesystem path of the package file ``relative`` (``predictors/default.json``).

    An unpacked install (what pip does) has the file on disk already; from a zipped package
    it is copied once into a temporary folder, so callers can always ``open``/``copy`` it.
    """
    resource = files(__name__).joinpath(relative)
    if isinstance(resource, Path):
        return resource
    target = Path(tempfile.gettempdir()) / "collapse-hpo-data" / relative
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with as_file(resource) as extracted:
            shutil.copyfile(extracted, target)
    return target


def default_predictor_path() -> Path:
    """The shipped default predictor JSON."""
    return resource_path(DEFAULT_PREDICTOR)


def packaged_sweeps() -> list[str]:
    """Names of the packaged sweep configs (``quickstart``, ...)."""
    folder = files(__name__).joinpath(SWEEPS)
    return sorted(entry.name[: -len(".yaml")] for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def packaged_sweep(name: str) -> Path:
    """The packaged sweep config called ``name`` (``KeyError`` if there is none)."""
    if name not in packaged_sweeps():
        raise KeyError(name)
    return resource_path(f"{SWEEPS}/{name}.yaml")


def sweep_config_path(config: str) -> Path:
    """A sweep CONFIG argument (``hpo sweep``, ``hpo submit``) as a file: an existing path, else
    a packaged sweep by name (``hpo sweep quickstart`` works from any directory, also from a
    wheel install)."""
    from hpo.common.overrides import ConfigError

    path = Path(config)
    if path.exists() or path.suffix or len(path.parts) > 1:
        return path  # read_yaml names a missing file, a directory or a binary file
    try:
        return packaged_sweep(config)
    except KeyError:
        raise ConfigError(f"{config}: no such file, nor a packaged sweep ({', '.join(packaged_sweeps())})") from None
