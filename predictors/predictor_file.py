"""The predictor file: its schema (strict JSON, validated with pydantic) and the document a
predictor is written as and read from (``Predictor.to_dict``/``from_dict``/``save``/``load``).

Every section a later version added is optional, so files of every version load unchanged;
the sections with their own classes (ranking error, reference curves, monitor band, the
per-group decision errors) are validated by those classes' ``from_dict``.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from predictors.align import AlignSettings
from predictors.decision_error import DecisionError
from predictors.io import json_safe
from predictors.monitor import OLD_BAND_SCHEMA, NoiseBand
from predictors.ranking import RankingError
from predictors.references import ReferenceCurves
from predictors.surrogate import SurrogateParams

SCHEMA = "collapse-hpo/predictor"
# Version 2 added params.irreducible_loss and decision_error.cross_scale, version 3 the
# ranking_error, version 4 the size term (params.m_size_exp, size_ref), the reference curves
# and the per-group decision errors (decision_error.groups); all optional, so version-1 to -3
# files still load unchanged.
SCHEMA_VERSION = 4


def to_document(predictor: Any) -> dict[str, Any]:
    """The JSON document of a ``Predictor`` (see :class:`PredictorFile`)."""
    p = predictor.params
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "params": {
            "b_const": p.b_const,
            "b_exp": p.b_exp,
            "q_const": p.q_const,
            "q_exp": p.q_exp,
            "m": p.m,
            "eps1": p.eps1,
            "eps2": p.eps2,
            "irreducible_loss": p.irreducible_loss,
            "m_size_exp": p.m_size_exp,
            "size_ref": p.size_ref,
            "m_fitted": bool(predictor.m_fitted),
        },
        "alignment": predictor.align.to_dict(),
        "decision_error": None if predictor.decision_error is None else predictor.decision_error.to_dict(),
        "ranking_error": None if predictor.ranking_error is None else predictor.ranking_error.to_dict(),
        "references": None if predictor.references is None else predictor.references.to_dict(),
        "monitor": None if predictor.monitor is None else predictor.monitor.to_dict(),
        "provenance": json_safe(predictor.provenance),
    }


def from_document(data: Any, source: str = "predictor") -> tuple[Any, ...]:
    """Validate a document (as written by :func:`to_document`): the ``Predictor``'s fields in
    order. Raises ``ValueError`` naming ``source`` and the offending field."""
    try:
        doc = PredictorFile.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{source}: invalid predictor file: {_describe(exc)}") from None
    pr = doc.params
    _check_calibrated_ranges(pr, source)
    try:
        params = SurrogateParams(pr.b_const, pr.b_exp, pr.q_const, pr.q_exp, pr.m, pr.eps1, pr.eps2,
                                 pr.irreducible_loss, pr.m_size_exp, pr.size_ref)
        align = AlignSettings(**doc.alignment.model_dump())
        de = None if doc.decision_error is None else DecisionError.from_model(doc.decision_error)
        re_ = None if doc.ranking_error is None else RankingError.from_dict(doc.ranking_error)
        refs = None if doc.references is None else ReferenceCurves.from_dict(doc.references)
        band = None if doc.monitor is None else _monitor_band(doc.monitor, source)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{source}: invalid predictor file: ranking_error, references or groups: {exc!r}"
                         if isinstance(exc, (KeyError, TypeError)) else
                         f"{source}: invalid predictor file: {exc}") from None
    return params, pr.m_fitted, align, de, dict(doc.provenance), re_, refs, band


def _check_calibrated_ranges(params: Any, source: str) -> None:
    """A fitted parameter outside the ranges calibration searches (``FitBounds``; a fit clips
    to them) came from no calibration: refused, instead of predictions such as 0.25 ± 0.37 for
    a trial ending at 2.19 (``m: 1e300``)."""
    from predictors.fit_objective import FitBounds

    bounds = FitBounds()
    for name in ("b_const", "b_exp", "q_const", "q_exp", "m", "m_size_exp"):
        low, high = getattr(bounds, name)
        value = getattr(params, name)
        # A little slack: values written at a bound and read back after rounding stay accepted.
        if isinstance(value, (int, float)) and not (low - 1e-9 * abs(low) <= value <= high + 1e-9 * abs(high)):
            raise ValueError(f"{source}: invalid predictor file: params.{name}: {value!r} is outside [{low:g}, {high:g}], "
                             "the range calibration fits it in; recalibrate (hpo calibrate) or fix the file")


def _monitor_band(section: dict[str, Any], source: str) -> Optional[NoiseBand]:
    """The monitor band; a band of an older version (of the residual itself, not of its change
    after the window) is dropped with a warning: the monitor is then uncalibrated, and the rest
    of the predictor still loads."""
    if section.get("schema") == OLD_BAND_SCHEMA:
        warnings.warn(f"{source}: its monitor band was written by an older version (the band of the residual, "
                      "not of its change); the monitor is uncalibrated until hpo calibrate is rerun", stacklevel=3)
        return None
    return NoiseBand.from_dict(section, source="monitor")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class ParamsModel(_Strict):
    b_const: float = Field(gt=0)
    b_exp: float
    q_const: float = Field(gt=0)
    q_exp: float
    m: float = Field(gt=0)
    eps1: float = Field(gt=0)
    eps2: float = Field(gt=0)
    irreducible_loss: float = Field(0.0, ge=0)
    m_size_exp: float = 0.0
    size_ref: float = Field(1.0, gt=0)
    m_fitted: bool


class AlignModel(_Strict):
    objective: Literal["log", "l2", "l1"]
    start_ratio: float = Field(ge=0, le=1)
    min_start: float = Field(ge=0, lt=1)
    min_points: int = Field(ge=1)


class DecisionErrorModel(_Strict):
    stop_fractions: list[float] = Field(min_length=1)
    rel_error: list[float] = Field(min_length=1)
    statistic: str = "rms"
    n_curves: int = Field(default=0, ge=0)
    source: str = "in-sample"
    bias: Optional[list[float]] = None
    cross_scale: Optional[list[float]] = None
    cross_scale_source: Optional[str] = None
    # Validated by predictors.distance.ErrorGroup.from_dict (version 4).
    groups: Optional[list[dict[str, Any]]] = None

    @field_validator("rel_error")
    @classmethod
    def _non_negative(cls, v: list[float]) -> list[float]:
        if any(x < 0 for x in v):
            raise ValueError("relative errors must be ≥ 0")
        return v

    @field_validator("stop_fractions")
    @classmethod
    def _fractions(cls, v: list[float]) -> list[float]:
        if any(x <= 0 or x > 1 for x in v) or any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError("must be strictly increasing training fractions in (0, 1]")
        return v

    @model_validator(mode="after")
    def _lengths(self) -> "DecisionErrorModel":
        if len(self.stop_fractions) != len(self.rel_error):
            raise ValueError("stop_fractions and rel_error must have the same length")
        if self.bias is not None and len(self.bias) != len(self.stop_fractions):
            raise ValueError("bias must have one entry per stop fraction")
        if self.cross_scale is not None:
            if len(self.cross_scale) != len(self.stop_fractions):
                raise ValueError("cross_scale must have one entry per stop fraction")
            if any(x < 0 for x in self.cross_scale):
                raise ValueError("cross_scale errors must be ≥ 0")
        return self


class PredictorFile(_Strict):
    """The on-disk schema of a predictor (versions 1–4; each adds optional fields)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True, populate_by_name=True)

    schema_: Literal["collapse-hpo/predictor"] = Field(alias="schema")
    schema_version: Literal[1, 2, 3, 4]
    params: ParamsModel
    alignment: AlignModel
    decision_error: Optional[DecisionErrorModel] = None
    # Validated by predictors.ranking.RankingError.from_dict (version 3).
    ranking_error: Optional[dict[str, Any]] = None
    # Validated by predictors.references.ReferenceCurves.from_dict (version 4).
    references: Optional[dict[str, Any]] = None
    # Validated by predictors.monitor.NoiseBand.from_dict (an optional section; no version bump).
    monitor: Optional[dict[str, Any]] = None
    provenance: dict[str, Any] = Field(default_factory=dict)


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join("schema" if x == "schema_" else str(x) for x in err["loc"]) or "(document)"
        parts.append(f"field '{loc}': {err['msg']}")
    more = len(exc.errors()) - 5
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")




__all__ = ["SCHEMA", "SCHEMA_VERSION", "PredictorFile", "from_document", "to_document"]
