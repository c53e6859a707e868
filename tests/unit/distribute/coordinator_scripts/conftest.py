"""These are programs for mpirun (test_coordinator_failover.py launches them), not test modules:
pytest (``--doctest-modules`` included) must not import them, since importing one runs it."""

collect_ignore_glob = ["*.py"]
