"""Fault-tolerant data parallel on torchft: replica groups that drop out and rejoin without a restart.

- checks.py: the `[fault_tolerance]` section's checks (no torch: the launcher runs them first);
- torchft_import.py: torchft, imported once, refused in one line when its version cannot run here;
- lighthouse.py: the lighthouse the launcher (or a test) starts, and each group's environment;
- state_transfer.py: the run's state as plain tensors for a recovering peer, and back;
- timed_transport.py: torchft's transports of that state (HTTP, or the groups' process group),
  marking the rejoin timeline;
- rejoin_timeline.py: each phase of a group's start and of a survivor's failure in the log, and
  the reader that turns them into seconds per phase (scripts/bench_fault_tolerance.py);
- replicas.py: the JobExtension that makes a job one replica group (quorum, cross-group
  all-reduce, commit, recovery);
- diloco.py: the semi-synchronous variant (DiLoCo: an outer step every fault_tolerance.sync_every steps);
- attach.py: the extensions a config asks for (the launcher's rank program hands them to the Trainer).

This package imports train/ (it is a training feature); train/ never imports it. Importing the
package itself imports neither torch nor torchft (the launcher's checks must start fast).
"""
