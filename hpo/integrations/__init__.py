"""Reports from the trainers teams already use: callbacks that tell Ray Tune what
``CollapseScheduler`` needs, derived from the trainer's own settings.

* :mod:`hpo.integrations.hf`: a Hugging Face ``TrainerCallback`` (``pip install -e ".[hf]"``);
* :mod:`hpo.integrations.lightning`: a Lightning ``Callback`` (``pip install -e ".[lightning]"``);
* :mod:`hpo.integrations.run_report`: the derivation they share (τ, TPP, schedule, N).
"""
