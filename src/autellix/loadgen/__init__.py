"""The program-level benchmark: the workloads' agent programs (``autellix.workloads``)
against a live gateway or bare engines (``runner``), the sweep over rates and
systems (``sweep``) and the emulated cluster (``cluster``)."""
