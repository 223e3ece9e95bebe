"""A training process's life around the step: what it checks before any process starts
(preflight.py), its process group and device (distributed.py), its console (console.py), its
signals, its launcher's death and its last word (worker_guard.py, interrupt.py, rank_process.py),
the watchdog that names a stalled rank (watchdog.py), its run folder and the folder's lock
(run_folder.py, run_lock.py), and the divergence guard that stops it on a non-finite step
(divergence.py). Nothing here knows the model's step: the trainer (kenotron/train/) uses these,
and the launcher (kenotron/launch/) starts the processes."""
