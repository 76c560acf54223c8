"""The peak memory of one training run, estimated from its config before it starts.

A sweep checks every trial against the machine (or the trial's share of it) before Ray starts,
and ``hpo train`` checks its one run, so that a batch of 2^30 tokens for a model whose whole run
is 0.4M tokens is refused in one line instead of growing to gigabytes in every trial.

The estimate is an upper bound, in three parts:

- **state**: weights, gradients and AdamW's two moments, fp32: 16 bytes per parameter,
  embeddings included;
- **activations** of one micro-batch (``micro_batch_size`` tokens, or the whole batch), kept
  for the backward pass: per token and layer about 34·d values of 16-bit training (Korthikanti
  et al. 2022, without the attention matrix: attention here never materialises it), doubled
  for fp32, and the logits with their softmax and gradient (3·V fp32 values per token), and
  the int64 inputs and targets;
- **fixed**: the Python process with torch loaded and the training data held in memory
  (bytes, or the ids of a token dataset).

Measured with ``python -m trainers.memory CONFIG_JSON`` (peak RSS of two logging intervals
against this estimate), the tiny trainer of the tests on CPU: 367 / 600 / 1,194 MB at 2,048 /
16,384 / 65,536 tokens a step, estimated 452 / 733 / 1,693 MB (activations ~13 KB a token
measured, 20 KB estimated): an upper bound by up to 1.5x, never below.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from trainers.config import TrainConfig

#: Python with torch, numpy and the trainer imported, before any tensor (MB; ~330 MB measured).
PROCESS_BASE_MB = 400.0
#: fp32 weights + gradients + AdamW exp_avg and exp_avg_sq.
STATE_BYTES_PER_PARAM = 16
#: 16-bit activation values per token and layer kept for backward (34·d, Korthikanti et al.),
#: at 4 bytes each on CPU (fp32) and counted the same under bf16 autocast (an upper bound).
ACTIVATION_VALUES_PER_TOKEN_LAYER_PER_D = 34
ACTIVATION_BYTES = 4
#: Logits, their log-softmax and its gradient: fp32 values per token and vocabulary entry.
LOGIT_VALUES_PER_TOKEN_PER_V = 3


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak memory of one run, MB, by part."""

    state_mb: float
    activations_mb: float
    data_mb: float
    base_mb: float = PROCESS_BASE_MB

    @property
    def total_mb(self) -> float:
        return self.state_mb + self.activations_mb + self.data_mb + self.base_mb

    def describe(self) -> str:
        return (f"about {self.total_mb:,.0f} MB (activations {self.activations_mb:,.0f} MB, weights and "
                f"optimizer {self.state_mb:,.0f} MB, data {self.data_mb:,.0f} MB, process {self.base_mb:,.0f} MB)")


def estimate_train_memory(config: TrainConfig, data_tokens: int = 0, token_bytes: int = 1) -> MemoryEstimate:
    """The estimate for ``config``; ``data_tokens``: ids of training data held in memory
    (``trainers.corpus.training_tokens``), ``token_bytes`` each."""
    model = config.model
    params = model.n_params + model.n_embedding_params
    tokens = config.micro_batch_tokens
    per_token = (ACTIVATION_VALUES_PER_TOKEN_LAYER_PER_D * model.d_model * model.n_layers * ACTIVATION_BYTES
                 + LOGIT_VALUES_PER_TOKEN_PER_V * model.vocab_size * 4 + 2 * 8)
    mb = 2.0**20
    return MemoryEstimate(state_mb=params * STATE_BYTES_PER_PARAM / mb, activations_mb=tokens * per_token / mb,
                          data_mb=data_tokens * token_bytes / mb)


def machine_memory_mb() -> float:
    """Physical memory of this machine (MB), or of its cgroup where that is lower (a container,
    a Slurm allocation); inf where neither can be read."""
    total = float("inf")
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (ValueError, OSError, AttributeError):
        pass
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(limit_file).read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text) / 2**20)
    return total


if __name__ == "__main__":  # calibration: peak RSS of a few steps against the estimate
    import json
    import resource
    import sys

    from trainers.train import Trainer

    config = TrainConfig.model_validate(json.loads(sys.argv[1]))
    trainer = Trainer(config, warn_repeats=False)
    for _ in range(2):  # two logging intervals: every tensor of a step has been allocated
        trainer.train_interval()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    from trainers.corpus import training_tokens

    estimate = estimate_train_memory(config, training_tokens(config.data.model_dump()))
    print(json.dumps({"peak_mb": round(peak), "estimate_mb": round(estimate.total_mb), "parts": estimate.describe()}))
