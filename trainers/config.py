"""Training configuration (validated) and the run controls derived from it.

`TrainConfig` is what a user writes (YAML or a dict); pydantic checks it and every error
names the offending field. `RunControls` is what the run *is* once the config is resolved:
the non-embedding parameter count N, the token budget D = TPP·N rounded to whole optimizer
steps, the AdamW timescale τ and the weight decay λ that realise it, and the µP multipliers.
`run_controls` computes it from the config alone (no torch), so a sweep can price and
describe a trial before building it.

τ convention (see docs/parameterization.md): the base LR η and base decay λ are what the
config holds. Hidden matrices train with η/m and decay λ·m (m = their fan-in ratio to the
base shape), so every decayed tensor has the same product η·λ and one τ = B/(η·λ·D)
describes the whole run.
"""

from __future__ import annotations

import math
import typing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from predictors.equations import adamw_timescale, tokens_per_param, weight_decay_for_timescale
from predictors.schedules import DecayShape, NamedSchedule, Schedule

Parameterization = Literal["completep", "mup", "sp"]

# Head size used when neither d_head nor n_heads is given.
DEFAULT_D_HEAD = 32
# SwiGLU hidden size: 8/3·d keeps the MLP at the parameter count of a 4·d GELU MLP;
# rounding to a multiple of 16 keeps the matrices friendly to AVX-512 and tensor cores.
FFN_RATIO = 8.0 / 3.0
FFN_MULTIPLE = 16


def default_ffn_dim(d_model: int) -> int:
    """8/3·d rounded to the nearest multiple of 16 (at least 16)."""
    return max(FFN_MULTIPLE, int(round(FFN_RATIO * d_model / FFN_MULTIPLE)) * FFN_MULTIPLE)


def _admits_bool(annotation: Any) -> bool:
    """Whether a field of this type may hold ``True``/``False`` (``bool``, ``Any``, a union with either)."""
    if annotation is bool or annotation is Any:
        return True
    return any(_admits_bool(arg) for arg in typing.get_args(annotation))


def refuse_bool_number(model: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """A ``field_validator("*", mode="before")`` body: refuse ``true``/``false`` (also inside
    a list) for a field that does not hold booleans. Pydantic reads ``tau: true`` as 1.0 and
    ``batch_size: true`` as 1, so a typo would train."""
    field = model.model_fields.get(info.field_name or "")
    if field is None or _admits_bool(field.annotation):
        return value
    values = value if isinstance(value, (list, tuple)) else [value]
    if any(isinstance(v, bool) for v in values):
        raise ValueError(f"{value!r} is a boolean, not a number".replace("True", "true").replace("False", "false"))
    return value


class _Strict(BaseModel):
    # extra="forbid": a misspelt key is an error that names it, never a silent default.
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return refuse_bool_number(cls, value, info)


class ModelConfig(_Strict):
    """Shape and parameterization of the GPT (see trainers/model.py).

    Width grows at a fixed head size by default (``d_head``, heads = d_model/d_head); set
    ``n_heads`` instead to keep the head count fixed and grow the head size. Set at most one.
    """

    d_model: int = Field(64, gt=0)
    n_layers: int = Field(2, gt=0)
    d_head: int | None = Field(None, gt=0)
    n_heads: int | None = Field(None, gt=0)
    d_ff: int | None = Field(None, gt=0)
    seq_len: int = Field(128, gt=0)
    # The base shape µP/CompleteP is defined relative to: at this shape they equal SP.
    base_d_model: int = Field(64, gt=0)
    base_n_layers: int = Field(2, gt=0)
    base_d_ff: int | None = Field(None, gt=0)
    parameterization: Parameterization = "completep"
    init_std: float = Field(0.08, gt=0)
    alpha_in: float = Field(1.0, gt=0)
    alpha_out: float = Field(1.0, gt=0)
    norm_eps: float = Field(1e-5, gt=0)
    # V: 256 = bytes (every corpus that is not a token dataset); a token dataset
    # (data.corpus a directory with train.bin/val.bin) sets its tokenizer's vocabulary.
    vocab_size: int = Field(256, ge=2)

    @model_validator(mode="after")
    def _check_heads(self) -> "ModelConfig":
        if self.d_head is not None and self.n_heads is not None:
            raise ValueError("model.d_head, model.n_heads: set at most one of them")
        heads_label = f"n_heads={self.n_heads}" if self.n_heads is not None else f"d_head={self.head_dim}"
        divisor = self.n_heads if self.n_heads is not None else self.head_dim
        if self.d_model % divisor:
            raise ValueError(f"model.d_model: {self.d_model} is not divisible into heads ({heads_label})")
        if self.base_d_model % divisor:
            raise ValueError(
                f"model.base_d_model: {self.base_d_model} is not divisible into heads ({heads_label})"
            )
        return self

    # Resolved shape. Plain properties, so a dump of the config holds what the user set.
    @property
    def head_dim(self) -> int:
        if self.n_heads is not None:
            return self.d_model // self.n_heads
        return self.d_head if self.d_head is not None else DEFAULT_D_HEAD

    @property
    def num_heads(self) -> int:
        return self.n_heads if self.n_heads is not None else self.d_model // self.head_dim

    @property
    def base_head_dim(self) -> int:
        """Head size of the base shape: the same head size, or the same head count."""
        if self.n_heads is not None:
            return self.base_d_model // self.n_heads
        return self.head_dim

    @property
    def ffn_dim(self) -> int:
        return self.d_ff if self.d_ff is not None else default_ffn_dim(self.d_model)

    @property
    def base_ffn_dim(self) -> int:
        if self.base_d_ff is not None:
            return self.base_d_ff
        if self.d_ff is None:
            return default_ffn_dim(self.base_d_model)
        # An explicit d_ff keeps its ratio to d_model at the base shape.
        return max(1, int(round(self.d_ff * self.base_d_model / self.d_model)))

    @property
    def width_multiplier(self) -> float:
        """m_N = d_model / base_d_model (1 under SP by definition of "no scaling")."""
        return self.d_model / self.base_d_model

    @property
    def depth_multiplier(self) -> float:
        """m_L = n_layers / base_n_layers."""
        return self.n_layers / self.base_n_layers

    @property
    def n_params(self) -> int:
        """N: non-embedding parameters (block matrices, block norms, final norm).

        Excludes the token embedding and the unembedding (lm_head); see
        docs/parameterization.md. Must equal ``GPT.n_params()`` (tested).
        """
        d, f = self.d_model, self.ffn_dim
        attention = 3 * d * d + d * d  # fused q,k,v and the output projection
        mlp = 2 * d * f + f * d  # fused gate,up and the down projection
        norms = 2 * d
        return self.n_layers * (attention + mlp + norms) + d

    @property
    def n_embedding_params(self) -> int:
        """Token embedding plus unembedding (untied): 2·V·d."""
        return 2 * self.vocab_size * self.d_model


class DataConfig(_Strict):
    """Where the tokens come from and how they are split and ordered."""

    # "stdlib" = the running interpreter's standard-library *.py sources; a directory
    # holding train.bin and val.bin = a token dataset (flat ids, see trainers.corpus.py);
    # otherwise a path to a text file or a directory of text files (read as bytes, sorted by path).
    corpus: str = "stdlib"
    # Byte corpora: the last val_fraction of the bytes is held out for validation
    # (a token dataset brings its own val.bin).
    val_fraction: float = Field(0.1, gt=0, lt=1)
    # Id width of a token dataset's files: uint16 (nanoGPT's, V <= 65,536) or uint32.
    token_dtype: Literal["uint16", "uint32"] = "uint16"
    # Seed of the training-window order; separate from the init seed so every trial of a
    # sweep can see the same data stream.
    data_seed: int = 0
    # Where the concatenated corpus is cached; default $COLLAPSE_HPO_CACHE or ~/.cache/collapse-hpo.
    cache_dir: str | None = None


class TrainConfig(_Strict):
    """One training run. Exactly one of ``tau`` and ``weight_decay`` must be given."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    tokens_per_param: float = Field(20.0, gt=0)
    # B, in tokens per optimizer step (a whole number of sequences).
    batch_size: int = Field(4096, gt=0)
    # Tokens per forward pass; gradients are accumulated when smaller than batch_size.
    micro_batch_size: int | None = Field(None, gt=0)
    # Peak base LR η: embeddings, norms and lm_head see it; hidden matrices see η/m.
    lr: float = Field(1e-2, gt=0)
    # AdamW timescale τ = B/(η·λ·D), or the base decay λ it implies (hidden matrices see λ·m).
    tau: float | None = Field(None, gt=0)
    weight_decay: float | None = Field(None, ge=0)
    schedule: NamedSchedule = "linear"
    warmup_fraction: float = Field(0.1, ge=0, le=1)
    decay_fraction: float = Field(0.2, ge=0, le=1)
    # The floor η(1)/η_peak of linear, cosine and wsd (0.1: "cosine to 10%").
    final_fraction: float = Field(0.0, ge=0, lt=1)
    # The shape of the wsd cooldown: linear (1 - p) or sqrt (1 - √p).
    decay_shape: DecayShape = "linear"
    seed: int = 0
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.95, ge=0, lt=1)
    adam_eps: float = Field(1e-8, gt=0)
    # Off by default: a global-norm clip is width-dependent under µP and changes the
    # AdamW update that τ describes.
    grad_clip: float | None = Field(None, gt=0)
    log_every: int = Field(10, gt=0)
    # Validation every eval_every steps (at a log boundary); always at the end of the run.
    eval_every: int | None = Field(None, gt=0)
    eval_tokens: int = Field(65536, gt=0)
    # Trailing moving-average window of smoothed_loss; default 2% of the run's tokens.
    smoothing_tokens: int | None = Field(None, ge=0)
    # "auto": CUDA when available, else CPU. The device used is recorded in controls.json.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # "auto": bf16 autocast (+ TF32 for the remaining fp32 matmuls) on CUDA, fp32 on CPU;
    # "float32" is full fp32 everywhere (no TF32).
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # torch.compile of the training forward/backward: true, false, or "auto" (on CPU for
    # runs of >= 8M tokens, where it was measured faster end to end; eager otherwise: see
    # trainers.train.resolve_compile and benchmarks/trainer_throughput.md).
    compile: bool | Literal["auto"] = "auto"
    threads: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _check_consistency(self) -> "TrainConfig":
        if (self.tau is None) == (self.weight_decay is None):
            raise ValueError("tau, weight_decay: set exactly one of them")
        seq_len = self.model.seq_len
        if self.batch_size % seq_len:
            raise ValueError(
                f"batch_size: {self.batch_size} tokens is not divisible by model.seq_len {seq_len}"
            )
        if self.data.token_dtype == "uint16" and self.model.vocab_size > 1 << 16:
            raise ValueError(
                f"data.token_dtype: uint16 ids stop at 65,535; model.vocab_size {self.model.vocab_size} "
                "needs token_dtype uint32")
        micro = self.micro_batch_size
        if micro is not None:
            if micro % seq_len:
                raise ValueError(
                    f"micro_batch_size: {micro} tokens is not divisible by model.seq_len {seq_len}"
                )
            if self.batch_size % micro:
                raise ValueError(
                    f"micro_batch_size: batch_size {self.batch_size} is not divisible by {micro}"
                )
        # Let the schedule check its own fractions, re-raised under the field names.
        try:
            self.lr_schedule
        except ValueError as error:
            raise ValueError(str(error)) from None
        return self

    @property
    def lr_schedule(self) -> Schedule:
        return Schedule(self.schedule, self.warmup_fraction, self.decay_fraction,
                        final_fraction=self.final_fraction, decay_shape=self.decay_shape)

    @property
    def micro_batch_tokens(self) -> int:
        return self.micro_batch_size if self.micro_batch_size is not None else self.batch_size


@dataclass(frozen=True)
class RunControls:
    """What a run is, derived from its config (see `run_controls`)."""

    n_params: int  # N, non-embedding
    n_embedding_params: int
    total_tokens: int  # D = total_steps · B
    total_steps: int
    batch_size: int  # B, tokens per step
    micro_batch_size: int
    grad_accum_steps: int
    tokens_per_param: float  # D/N as realised (D is rounded to whole steps)
    tau: float  # B/(η·λ·D) with the peak LR
    weight_decay: float  # λ_base
    lr: float  # η_base
    eta_hidden: float  # peak LR of decayed hidden matrices (η/m_N)
    lambda_hidden: float  # their decay (λ·m_N)
    width_multiplier: float
    depth_multiplier: float
    parameterization: str
    d_model: int
    n_layers: int
    n_heads: int
    d_head: int
    d_ff: int
    seq_len: int
    vocab_size: int  # V (256 = bytes)
    seed: int
    data_seed: int
    smoothing_tokens: int
    schedule: Schedule

    def to_dict(self) -> dict[str, Any]:
        """Flat dict; the schedule becomes schedule / warmup_fraction / decay_fraction /
        final_fraction / decay_shape."""
        out = asdict(self)
        out.update(
            schedule=self.schedule.name,
            warmup_fraction=self.schedule.warmup_fraction,
            decay_fraction=self.schedule.decay_fraction,
            final_fraction=self.schedule.final_fraction,
            decay_shape=self.schedule.decay_shape,
        )
        return out


def run_controls(config: TrainConfig) -> RunControls:
    """Resolve N, D, steps, τ and λ of a config, without building the model."""
    model = config.model
    n_params = model.n_params
    batch = config.batch_size
    # D = TPP·N rounded to a whole number of optimizer steps (at least one).
    total_steps = max(1, int(round(config.tokens_per_param * n_params / batch)))
    total_tokens = total_steps * batch
    if config.tau is not None:
        tau = float(config.tau)
        weight_decay = weight_decay_for_timescale(batch, config.lr, tau, total_tokens)
    else:
        weight_decay = float(config.weight_decay)  # type: ignore[arg-type]
        tau = adamw_timescale(batch, config.lr, weight_decay, total_tokens) if weight_decay > 0 else math.inf
    # Under SP nothing is rescaled with width (m = 1 for LR and decay).
    lr_width = 1.0 if model.parameterization == "sp" else model.width_multiplier
    smoothing = config.smoothing_tokens
    if smoothing is None:
        smoothing = int(round(0.02 * total_tokens))
    return RunControls(
        n_params=n_params,
        n_embedding_params=model.n_embedding_params,
        total_tokens=total_tokens,
        total_steps=total_steps,
        batch_size=batch,
        micro_batch_size=config.micro_batch_tokens,
        grad_accum_steps=batch // config.micro_batch_tokens,
        tokens_per_param=tokens_per_param(total_tokens, n_params),
        tau=tau,
        weight_decay=weight_decay,
        lr=config.lr,
        eta_hidden=config.lr / lr_width,
        lambda_hidden=weight_decay * lr_width,
        width_multiplier=model.width_multiplier,
        depth_multiplier=model.depth_multiplier,
        parameterization=model.parameterization,
        d_model=model.d_model,
        n_layers=model.n_layers,
        n_heads=model.num_heads,
        d_head=model.head_dim,
        d_ff=model.ffn_dim,
        seq_len=model.seq_len,
        vocab_size=model.vocab_size,
        seed=config.seed,
        data_seed=config.data.data_seed,
        smoothing_tokens=smoothing,
        schedule=config.lr_schedule,
    )


def load_train_config(source: str | Path | Mapping[str, Any] | TrainConfig) -> TrainConfig:
    """Validate a config from a YAML file path, a mapping, or an existing TrainConfig."""
    if isinstance(source, TrainConfig):
        return source
    if isinstance(source, Mapping):
        return TrainConfig.model_validate(dict(source))
    with open(source, encoding="utf-8") as handle:
        data = yaml.safe_load(handle) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a mapping at the top level of the YAML file")
    return TrainConfig.model_validate(data)


def override(config: TrainConfig, updates: Mapping[str, Any]) -> TrainConfig:
    """A re-validated copy with dotted-key updates, e.g. ``{"model.d_model": 128, "lr": 3e-3}``.

    Setting ``tau`` clears ``weight_decay`` and vice versa, so a sweep can switch which of
    the two it holds fixed.
    """
    data = config.model_dump()
    for key, value in updates.items():
        *parents, leaf = key.split(".")
        node = data
        for part in parents:
            if not isinstance(node.get(part), dict):
                raise ValueError(f"{key}: {part!r} is not a config section")
            node = node[part]
        node[leaf] = value
        if not parents and leaf in ("tau", "weight_decay") and value is not None:
            data["weight_decay" if leaf == "tau" else "tau"] = None
    return TrainConfig.model_validate(data)
