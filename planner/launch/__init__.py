"""The planner launch: the entry point ``launch.sh`` runs under ``accelerate launch``.

``python -m planner.launch --job-dir PLAN --model M --data D`` trains the user's model on the user's
data with the Hugging Face Trainer, exactly as the plan in PLAN says: the standard files
(training_args.json through ``HfArgumentParser``, the accelerate YAML and DeepSpeed JSON through
accelerate launch) are read by the real libraries; runtime.json is applied by planner.runtime; the
configuration the files mean is read by ``planner check``'s own reader (planner.check.job_files),
and at the end the live objects of the run are compared with it (planner.launch.live).

Layer: above check and runtime, beside the CLI (tests/test_layers.py); torch, transformers and
accelerate are imported when a function runs. Exit codes: 0 trained as planned, 1 the live run
differs from the plan (it names how), 2 bad input (files, flags, model or data), 3 a package the
plan needs is missing (it names the module and the pip extra of planner that installs it).
"""
