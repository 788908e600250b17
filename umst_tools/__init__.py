"""umst_tools: the project's fairseq-free Python (no import of fairseq or torch at module level).

What the recipes and scripts run around fairseq: scoring, collecting results, the Multi30k runner, the WMT
rehearsal, the local Slurm cluster, batch tables and training progress. ``scripts/`` holds their thin entry points.
The tools of the project's own tests and benchmarks (the GPU check, the mutation check) live in ``umst_dev``.
"""
