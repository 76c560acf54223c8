"""The training loop: AdamW with per-group µP settings, a scheduled LR, exact resume.

`Trainer(config)` builds the corpus, model and optimizer; `train_interval()` runs up to
``log_every`` optimizer steps and returns one log record; `run()` runs to the end. A
checkpoint holds everything the next step depends on (weights, AdamW moments, step, the
data generator's state and the log history), so a resumed run reproduces an uninterrupted
one bit for bit on CPU.

Log record keys: step, tokens, train_fraction, train_loss (mean over the interval),
smoothed_loss (trailing mean over ``smoothing_tokens``), val_loss (NaN unless evaluated in
this interval), lr (current LR of the hidden matrices), elapsed_s, diverged.

A run whose interval loss is non-finite or above 2·ln V (`divergence_loss`) stops with status
"diverged" (no exception).
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

import torch

from predictors.io import atomic_write_with
from predictors.smoothing import TrailingMean
from trainers.config import RunControls, TrainConfig, load_train_config, run_controls
from trainers.data import Corpus, TrainSampler, load_corpus, passes_over_data, repeated_data_warning, validation_windows
from trainers.model import GPT
from trainers.parameterization import param_groups

Status = Literal["running", "completed", "diverged"]
CHECKPOINT_FILE = "trainer.pt"
# Config fields that may differ between a checkpoint and the run that resumes it (they
# change where and how fast the same steps run, not which steps).
_RESUME_MAY_CHANGE = {"device", "threads", "compile"}
# A run has diverged when its interval loss is non-finite or above twice the loss of a
# uniform guess over the V tokens (2·ln 256 ≈ 11.1 nats for bytes). A too-large LR rarely
# produces inf/NaN (normalised activations and Adam's bounded steps keep things finite): it
# shows as losses of 10^2-10^5 nats, which this bound catches.
def divergence_loss(vocab_size: int) -> float:
    """2·ln V: the interval loss above which a run counts as diverged."""
    return 2.0 * math.log(vocab_size)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: 'cuda' was requested but CUDA is not available")
    return torch.device(device)


def resolve_autocast_dtype(dtype: str, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA by default; fp32 (no autocast) on CPU unless asked for."""
    if dtype == "bfloat16" or (dtype == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def resolve_tf32(dtype: str, device: torch.device) -> bool:
    """TF32 for the fp32 matmuls left outside bf16 autocast: on CUDA, unless ``dtype:
    float32`` asks for full fp32 precision. (No CPU has TF32.)"""
    return device.type == "cuda" and dtype != "float32"


# torch.compile pays for itself on CPU from about this many training tokens (D) on: the
# compiled step measured 1.03-1.20× the eager one (0.1M-3M parameters, B = 4,096, T = 128,
# 1 thread), but compiling took 40-65 s with a cold inductor cache (9-14 s warm), which the
# faster steps win back after 2-6M tokens (benchmarks/trainer_throughput.md).
COMPILE_MIN_TOKENS = 8_000_000


def _have_cpp_compiler() -> bool:
    """Inductor's CPU backend compiles C++: is the compiler it would use installed?"""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
        return True
    except Exception:  # no compiler, or an inductor too old/new for this check
        return False


def resolve_compile(setting: bool | str, device: torch.device, total_tokens: int) -> bool:
    """Whether the training forward/backward runs through ``torch.compile``.

    ``true``/``false`` are obeyed. ``"auto"`` compiles only where it was measured to be
    faster end to end: on CPU, for runs of at least COMPILE_MIN_TOKENS tokens (shorter runs
    spend more time compiling than the faster steps save), if a C++ compiler is installed.
    On CUDA it has not been measured, so "auto" stays eager there.
    """
    if setting != "auto":
        return bool(setting)
    return device.type == "cpu" and total_tokens >= COMPILE_MIN_TOKENS and _have_cpp_compiler()


def _make_adamw(groups: list[dict[str, Any]], config: TrainConfig) -> torch.optim.AdamW:
    """AdamW over ``groups``: the fused kernel (CPU since torch 2.4, CUDA), else foreach."""
    betas = (config.adam_beta1, config.adam_beta2)
    # One fused kernel for all tensors of a group instead of ~a dozen foreach ops: ~5x
    # faster than foreach on CPU for our tensor sizes (torch 2.13).
    try:
        return torch.optim.AdamW(groups, betas=betas, eps=config.adam_eps, fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(groups, betas=betas, eps=config.adam_eps, foreach=True)


def optimizer_kind(optimizer: torch.optim.Optimizer) -> str:
    """ "fused", "foreach" or "for-loop": which AdamW implementation runs."""
    if optimizer.defaults.get("fused"):
        return "fused"
    return "foreach" if optimizer.defaults.get("foreach") else "for-loop"


class Trainer:
    """One training run of a `TrainConfig` (or a mapping / YAML path that validates to one)."""

    def __init__(self, config: TrainConfig | Mapping[str, Any] | str | Path, warn_repeats: bool = True) -> None:
        """``warn_repeats``: print one line on stderr when the run makes more than one pass
        over its training tokens (a sweep warns once for all its trials instead)."""
        self.config = load_train_config(config)
        self.controls: RunControls = run_controls(self.config)
        if self.config.threads is not None:
            torch.set_num_threads(self.config.threads)
        self.device = resolve_device(self.config.device)
        self.autocast_dtype = resolve_autocast_dtype(self.config.dtype, self.device)
        self.tf32 = resolve_tf32(self.config.dtype, self.device)
        if self.device.type == "cuda":
            # Process-wide, so set both ways (a trial owns its process under Ray, but tests
            # and notebooks build several trainers). Never touched on CPU: "high" would also
            # switch oneDNN's fp32 matmuls to reduced precision (torch 2.13 sets
            # torch.backends.mkldnn.matmul.fp32_precision = "tf32").
            torch.set_float32_matmul_precision("high" if self.tf32 else "highest")
        self.compiled = resolve_compile(self.config.compile, self.device, self.controls.total_tokens)

        seq_len = self.config.model.seq_len
        self.corpus: Corpus = load_corpus(self.config.data, self.config.model.vocab_size)
        train_tokens, val_tokens = self.corpus.splits(self.config.data.val_fraction)
        self._divergence_loss = divergence_loss(self.config.model.vocab_size)
        # Passes over the training tokens (recorded in controls.json; > 1 repeats data).
        self.epochs = passes_over_data(self.controls.total_tokens, int(train_tokens.numel()))
        warning = repeated_data_warning(self.controls.total_tokens, int(train_tokens.numel()), self.config.data.corpus)
        if warn_repeats and warning:
            print(warning, file=sys.stderr, flush=True)
        self.sampler = TrainSampler(train_tokens, seq_len, self.config.data.data_seed)
        val_inputs, val_targets = validation_windows(val_tokens, seq_len, self.config.eval_tokens)
        self.val_inputs = val_inputs.to(self.device)
        self.val_targets = val_targets.to(self.device)

        # Init on the CPU from its own generator: the same weights on every device, and
        # independent of the global RNG and of the data seed.
        init_generator = torch.Generator().manual_seed(self.config.seed)
        self.model = GPT(self.config.model, generator=init_generator).to(self.device)
        groups = param_groups(
            self.model.named_parameters(),
            self.config.model,
            lr=self.config.lr,
            weight_decay=self.controls.weight_decay,
            eps=self.config.adam_eps,
        )
        self.optimizer = _make_adamw(groups, self.config)
        # The step's forward+loss: the compiled graph (built at the first step; forward and
        # backward fused by inductor) or the module itself. Evaluation and checkpoints
        # always use self.model, whose state_dict keys do not depend on compilation.
        self._forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = (
            torch.compile(self.model) if self.compiled else self.model  # type: ignore[assignment]
        )
        self.schedule = self.config.lr_schedule
        self.smoother = TrailingMean(self.controls.smoothing_tokens)

        self.step = 0
        self.status: Status = "running"
        self.history: list[dict[str, Any]] = []
        self._elapsed_before = 0.0  # wall time of earlier sessions (restored from checkpoints)
        self._started = time.perf_counter()
        self._sequences_per_step = self.controls.batch_size // seq_len
        self._sequences_per_micro = self.controls.micro_batch_size // seq_len
        # The interval's losses, written in place on the device each step and read once per
        # log interval: no host sync and no allocation per step.
        self._losses = torch.zeros(self.config.log_every, device=self.device)

    # ------------------------------------------------------------------ properties
    @property
    def total_steps(self) -> int:
        return self.controls.total_steps

    @property
    def done(self) -> bool:
        return self.status != "running"

    @property
    def elapsed_s(self) -> float:
        return self._elapsed_before + (time.perf_counter() - self._started)

    def lr_multiplier(self, step: int) -> float:
        """Schedule value for optimizer step ``step`` (0-based), taken at the middle of the
        step's interval so that neither the first nor the last step has lr = 0."""
        return self.schedule.at((step + 0.5) / self.total_steps)

    # ------------------------------------------------------------------ training
    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _to_device(self, batch: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return batch
        # From pinned memory the copy is asynchronous: the host queues the step without
        # waiting for the GPU (a pageable copy would block it). The pinned block comes from
        # PyTorch's caching host allocator, which reuses it only after this copy is done.
        return batch.pin_memory().to(self.device, non_blocking=True)

    def _train_step(self, slot: int = 0) -> torch.Tensor:
        """One optimizer step; writes its mean batch loss into ``self._losses[slot]`` and
        returns that (device) element. Nothing in it waits for the device."""
        multiplier = self.lr_multiplier(self.step)
        for group in self.optimizer.param_groups:
            # PyTorch AdamW decays by lr·weight_decay, so the decay follows the schedule too.
            group["lr"] = group["peak_lr"] * multiplier
        # The whole step's windows are drawn at once: the data stream does not depend on
        # how the step is split into micro-batches.
        inputs, targets = self.sampler.sample(self._sequences_per_step)
        inputs, targets = self._to_device(inputs), self._to_device(targets)
        total = self._losses[slot]
        accumulation = self.controls.grad_accum_steps
        if accumulation == 1:
            with self._autocast():
                loss = self._forward(inputs, targets)
            loss.backward()
            total.copy_(loss.detach())
        else:
            total.zero_()
            for micro_inputs, micro_targets in zip(
                inputs.split(self._sequences_per_micro), targets.split(self._sequences_per_micro)
            ):
                with self._autocast():
                    loss = self._forward(micro_inputs, micro_targets)
                (loss / accumulation).backward()
                total += loss.detach()
            total /= accumulation
        if self.config.grad_clip is not None:
            # Returns a device tensor (no sync); foreach kernels where the device has them.
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        # set_to_none: backward then hands its fresh gradient tensors to .grad (no memset and
        # no accumulate-add, which reusing zeroed .grad buffers would cost each step).
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return total

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the fixed validation windows."""
        self.model.eval()
        total, count = 0.0, 0
        for inputs, targets in zip(
            self.val_inputs.split(self._sequences_per_micro), self.val_targets.split(self._sequences_per_micro)
        ):
            with self._autocast():
                loss = self.model(inputs, targets)
            total += float(loss) * inputs.shape[0]
            count += inputs.shape[0]
        self.model.train()
        return total / count

    def train_interval(self) -> dict[str, Any]:
        """Train up to ``log_every`` steps and return the interval's log record."""
        if self.done:
            raise RuntimeError(f"train_interval: the run is already {self.status}")
        start_step = self.step
        n_steps = min(self.config.log_every, self.total_steps - self.step)
        for slot in range(n_steps):
            self._train_step(slot)
        # The one host sync of the interval: losses stay on the device until here.
        train_loss = float(self._losses[:n_steps].double().mean())
        diverged = not math.isfinite(train_loss) or train_loss > self._divergence_loss
        tokens = self.step * self.controls.batch_size
        smoothed = self.smoother.update(tokens, train_loss)
        if diverged:
            self.status = "diverged"
        elif self.step >= self.total_steps:
            self.status = "completed"
        every = self.config.eval_every
        evaluate_now = self.status == "completed" or (
            every is not None and not diverged and self.step // every > start_step // every
        )
        record = {
            "step": self.step,
            "tokens": tokens,
            "train_fraction": self.step / self.total_steps,
            "train_loss": train_loss,
            "smoothed_loss": smoothed,
            "val_loss": self.evaluate() if evaluate_now else float("nan"),
            "lr": self.controls.eta_hidden * self.lr_multiplier(self.step - 1),
            "elapsed_s": self.elapsed_s,
            "diverged": diverged,
        }
        self.history.append(record)
        return record

    def run(self, callback: Callable[[dict[str, Any]], Any] | None = None) -> list[dict[str, Any]]:
        """Train to the end (or divergence), calling ``callback(record)`` per record.

        Returns the whole history, including records from before a resume.
        """
        while not self.done:
            record = self.train_interval()
            if callback is not None:
                callback(record)
        return self.history

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, directory: str | Path) -> Path:
        """Write ``<directory>/trainer.pt`` atomically; returns its path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {
            "config": self.config.model_dump(mode="json"),
            "step": self.step,
            "status": self.status,
            "elapsed_s": self.elapsed_s,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "sampler": self.sampler.state_dict(),
            "history": self.history,
        }
        return atomic_write_with(directory / CHECKPOINT_FILE, lambda tmp: torch.save(state, tmp))

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore a checkpoint written by `save_checkpoint` for the same config."""
        path = Path(directory) / CHECKPOINT_FILE
        # weights_only: our own files hold only tensors, numbers, strings, lists and dicts.
        state = torch.load(path, map_location=self.device, weights_only=True)
        mine = self.config.model_dump(mode="json")
        # Validated again, so a checkpoint written before a field existed compares with its default.
        theirs = load_train_config(state["config"]).model_dump(mode="json")
        changed = sorted(
            key for key in set(mine) | set(theirs)
            if key not in _RESUME_MAY_CHANGE and mine.get(key) != theirs.get(key)
        )
        if changed:
            raise ValueError(f"load_checkpoint: config differs from the checkpoint's in {', '.join(changed)}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.sampler.load_state_dict({"generator": state["sampler"]["generator"].cpu()})
        self.step = int(state["step"])
        self.status = state["status"]
        self.history = list(state["history"])
        # Replaying the logged losses rebuilds the smoother exactly (same additions in the
        # same order), without reaching into its internals.
        self.smoother = TrailingMean(self.controls.smoothing_tokens)
        for record in self.history:
            self.smoother.update(record["tokens"], record["train_loss"])
        self._elapsed_before = float(state["elapsed_s"])
        self._started = time.perf_counter()
