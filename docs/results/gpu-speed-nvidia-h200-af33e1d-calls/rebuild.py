# Run from the repository root: python docs/results/gpu-speed-nvidia-h200-af33e1d-calls/rebuild.py
"""Rebuild docs/results/gpu-speed-nvidia-h200-af33e1d.json from its two calls' records and logs, by the rules of the
fixed speed_table (resumes keep the first call's warm-ups; peak memory across fairseq's resets)."""
import json, re, sys
sys.path.insert(0, ".")
from benchmarks import speed_table as st
D = "docs/results/gpu-speed-nvidia-h200-af33e1d-calls/"
first, second = json.load(open(D + "first-call.json")), json.load(open(D + "second-call.json"))
record = dict(second)
warm = dict(second["warm_up"])
warm.update({k: w for k, w in first["warm_up"].items() if w.get("losses_dropout_shifted") and not w.get("error")})
for key, w in warm.items():
    from_first = w.get("losses_dropout_shifted") and not w.get("error")
    w["concurrent"] = "8 compiled rows at once (first call)" if from_first else "6 compiled rows at once (second call)"
record["warm_up"] = warm
record["started"] = first["started"]
record["calls"] = [dict(started=first["started"], command=first["command"], install_s=first["install_s"]),
                   dict(started=second["started"], command=second["command"], install_s=second["install_s"])]
# peak memory: fairseq's gb_free (total GiB - max_memory_allocated GiB, 0.1 GiB steps) in each row's log
import tarfile
used = {}
for tarname in ("first-call-logs.tar.gz", "second-call-logs.tar.gz"):
    with tarfile.open(D + tarname) as t:
        for member in t.getmembers():
            if not member.name.endswith(("plugin-log.txt", "stock-log.txt")):
                continue
            label = None
            for line in t.extractfile(member).read().decode().splitlines():
                m = re.match(r"\[speed\] (.*): fairseq-train", line)
                if m:
                    label = m.group(1)
                m = re.search(r'"gb_free": "([0-9.]+)"', line)
                if m and label and "train_inner" in line:
                    used[label] = max(used.get(label, 0.0), record["memory_gib"] - float(m.group(1)))
for r in record["rows"]:
    label = st.row_label(r)
    if r.get("words_per_s") and label in used:
        r["peak_mib"] = round(used[label] * 1024)
        r["peak_mib_from"] = "fairseq's gb_free in the row's log (0.1 GiB steps)"
    r.pop("compile_s", None)
record["notes"] = [
    "peak MiB is read off fairseq's gb_free in each row's log: the measured peak_mib was taken after fairseq's last "
    "reset of the peak (the memory after training); speed_table now takes it across the resets (PeakMemory).",
    "GPU busy is the mean of nvidia-smi over the measured updates, recompiles included (compiled rows recompiled "
    "once between updates 9 and 12: see their words/s per interval); speed_table now gives the median of the log "
    "intervals, as words/s.",
    "the warm-ups ran several at once on the card and ran out of memory (8 at once in the first call, 6 in the "
    "second; fairseq skipped the batches), which moved their losses and widened the loss check's dropout noise "
    "(0.10 and 0.25 in two rows); speed_table now runs as many at once as the card's memory holds.",
    "stock --amp's FLOPs per token (897 M) count update 2 twice: fairseq's --amp retried it after an overflow; the "
    "probe now counts an update that was not retried. Its MFU is halved here (the plugin transformer's count, the "
    "same model).",
]
for r in record["rows"]:
    if r["stock"] and r["precision"] == "fp16-amp" and r.get("flops_per_token", 0) > 1.5 * 449.5e6:
        r["flops_per_token_measured"] = r.pop("flops_per_token")
        r.pop("mfu", None)
st.write_record("docs/results/gpu-speed-nvidia-h200-af33e1d.json", st.finish(record))
print(st.markdown(record))
