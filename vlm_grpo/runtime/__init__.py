"""What surrounds a run: the console, per-step monitoring and the sample log, the no-signal watch, preemption (a
checkpoint on SIGTERM/SIGUSR1) and a clean shutdown of every process."""
