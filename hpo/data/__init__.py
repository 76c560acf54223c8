"""Files shipped inside the package: the default predictor and the packaged sweep configs.

They are package data (``pyproject.toml``), found with ``importlib.resources``, so a normal
(non-editable) ``pip install`` finds them wherever it puts the package; nothing here assumes
a repository checkout next to the code. This folder holds the only copy of each file.

* ``predictors/default.json``: the shipped predictor (``hpo calibrate
  configs/calibration/default_sizes.yaml --fit-only --predictor-out`` writes it; 0.02M-1.2M
  parameters), the default of every sweep.
* ``predictors/public_lm.json``: fitted on public training logs of 33M–93M-parameter language
  models (``benchmarks/public_sweeps.py`` writes it; licence and source in its provenance and in
  ``curves/README.md``), the default of a sweep whose model is nearer its sizes than
  the CPU default's (N above about 4M, the geometric middle; :func:`default_predictor_path`).
* ``sweeps/<name>.yaml``: sweeps runnable by name from any directory, ``hpo sweep quickstart``.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
import tempfile
from importlib.resources import as_file, files
from pathlib import Path
from typing import Optional

#: The shipped predictor, relative to this package.
DEFAULT_PREDICTOR = "predictors/default.json"
#: Every packaged predictor: the CPU default (0.02M–1.2M) and the one fitted on public language
#: models of 33M–93M parameters (``predictors/public_lm.json``; its provenance and licence there).
PACKAGED_PREDICTORS = (DEFAULT_PREDICTOR, "predictors/public_lm.json")
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


@functools.lru_cache(maxsize=1)
def packaged_predictors() -> dict[str, tuple[float, float, str]]:
    """The packaged predictors (relative paths) with the smallest and largest non-embedding model
    size each was fitted on (its ``provenance["model_sizes"]``) and the loss it was fitted on
    (``provenance["metric"]``; ``loss`` where not recorded). Read once a process: the files are
    package data (~0.5 MB of JSON), and a sweep asks for its predictor's path several times."""
    out = {}
    for relative in PACKAGED_PREDICTORS:
        provenance = json.loads(resource_path(relative).read_text())["provenance"]
        sizes = [float(n) for n in provenance["model_sizes"]]
        out[relative] = (min(sizes), max(sizes), str(provenance.get("metric") or "loss"))
    return out


def default_predictor_path(n_params: Optional[float] = None, metric: Optional[str] = None) -> Path:
    """The packaged predictor the product uses for a run of ``n_params`` non-embedding parameters
    deciding on ``metric`` (``loss`` or ``val_loss``; None: any): the one whose fitted sizes lie
    nearest N in log (inside a predictor's range is distance 0); where that one is fitted on another
    metric, the nearest fitted on ``metric`` if N is within ``OFF_SCALE_SIZE_RATIO`` (30×) of its
    sizes, else still the nearest (whose metric the sweep's check then names, with the fix).
    Without N, the CPU default (``predictors/default.json``, the quickstart's scale).

    Example:
        >>> default_predictor_path().name, default_predictor_path(1e5).name, default_predictor_path(85e6).name
        ('default.json', 'default.json', 'public_lm.json')
        >>> default_predictor_path(25e6, metric="loss").name  # 21x the CPU one's sizes, fitted on loss
        'default.json'
        >>> default_predictor_path(1e5, metric="val_loss").name  # 140x below the public one's: not it
        'default.json'
    """
    from predictors.predictor import OFF_SCALE_SIZE_RATIO

    if n_params is None or not (math.isfinite(float(n_params)) and float(n_params) > 0):
        return resource_path(DEFAULT_PREDICTOR)
    n = math.log(float(n_params))

    def distance(span: tuple[float, float, str]) -> float:
        low, high = math.log(span[0]), math.log(span[1])
        return max(low - n, n - high, 0.0)

    spans = packaged_predictors()
    nearest = min(spans, key=lambda relative: (distance(spans[relative]), relative))
    same = [k for k in spans if metric is None or spans[k][2] == metric]
    if metric is not None and spans[nearest][2] != metric and same:
        best = min(same, key=lambda relative: (distance(spans[relative]), relative))
        if distance(spans[best]) < math.log(OFF_SCALE_SIZE_RATIO):
            return resource_path(best)
    return resource_path(nearest)


#: The public 124M bench and its ladder as a curve file (``curves/README.md``: source, licence).
PUBLIC_CURVES = "curves/public_lr_scheduling.parquet"


def public_curves_path() -> Path:
    """The packaged public curves (``hpo.calibration.log_import.load_curve_bench`` reads them)."""
    return resource_path(PUBLIC_CURVES)


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
