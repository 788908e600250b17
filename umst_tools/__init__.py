"""umst_tools: the project's fairseq-free Python (no import of fairseq or torch at module level).

What the recipes and scripts run around fairseq: the GPU check (``gpu_check``) and the light build of
fairseq-fixed from its source archive (``fairseq_source``). ``scripts/`` holds their thin entry points. For the
tests: the mutation check (``mutation``: faults planted one at a time, each against the tests that claim to guard
it; ``python -m umst_tools.mutation``).
"""
