# Run from the repository root: python docs/results/gpu-speed-nvidia-h200-c706df0-calls/rebuild.py
"""Rebuild docs/results/gpu-speed-nvidia-h200-c706df0.json from its two calls' records, by the rules of the fixed
speed_table: the second call (a fresh machine, its warm-ups stopped at a 48 s cap) keeps the first call's finished
warm-ups (speed_table.merge_warm_ups), and the transformer of Prime's shape, named in --archs beside Prime-simple,
is planned once (it was planned twice; neither call reached it)."""
import json
import sys

sys.path.insert(0, ".")
from benchmarks import speed_table as st  # noqa: E402

D = "docs/results/gpu-speed-nvidia-h200-c706df0-calls/"
first, second = json.load(open(D + "first-call.json")), json.load(open(D + "second-call.json"))
record = dict(second)
record["warm_up"] = st.merge_warm_ups(first["warm_up"], second["warm_up"])
plan, seen = [], set()
for p in second["plan"]:
    key = st.row_key(p)
    if key not in seen:
        seen.add(key)
        plan.append(dict(p))
for p in plan:  # what plan() now marks: the transformer of an arch's own shape, counted by no target
    if p["name"] == "transformer_prime_shape":
        p["baseline_row"] = True
record["plan"] = plan
for r in record["rows"]:
    if r["name"] == "transformer_prime_shape":
        r["baseline_row"] = True
st.write_record("docs/results/gpu-speed-nvidia-h200-c706df0.json", st.finish(record))
