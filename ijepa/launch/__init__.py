"""``ijepa submit``: runs of ``ijepa fit`` (one, or a sweep as one job array) on SLURM or on this
machine through ``submitit``, with requeue on preemption and a table of a sweep's results.

* :mod:`ijepa.launch.submit`: the command, its executors, and the job each run is;
* :mod:`ijepa.launch.sweep`: grids and lists of overrides;
* :mod:`ijepa.launch.table`: each run's overrides, state and final ``val/*`` metrics;
* :mod:`ijepa.launch.requeue`: the callback that moves Lightning's SLURM requeue to a step boundary.
"""
