"""Show fairseq-train's progress compactly on the terminal; keep the full log in a file.

    fairseq-train ... --log-format simple --log-interval 50 2>&1 \
        | python scripts/train_progress.py --log train.log --max-update 1000

Every line fairseq writes goes to ``--log`` unchanged. The terminal gets a line
per ``--log-interval``, at most one every ``--every`` seconds (update count, epoch, training loss of the interval, the
latest validation loss, updates/s, elapsed wall time and an ETA from the rate of the
last ``ETA_WINDOW`` seconds of training: a run whose speed changes -- another job on the machine, a slower
epoch -- gets an ETA that follows it), the model size, warnings/errors/tracebacks, and fairseq's
"done training" line. Exit status: 0 (the caller checks fairseq's own status with
``set -o pipefail``).
"""
import argparse
import re
import sys
import time

KV = re.compile(r"([a-z_]+)=([-0-9.e+]+)")
ETA_WINDOW = 120.0  # seconds of fairseq's wall clock the ETA's rate is taken over


def eta_seconds(history, max_update):
    """Seconds left to ``max_update`` at the rate of the last ETA_WINDOW seconds of ``history``, a list of
    (updates, wall seconds) of fairseq's train_inner records, oldest first; None without a rate yet."""
    n, wall = history[-1]
    n0, w0 = next(((n0, w0) for n0, w0 in reversed(history[:-1]) if wall - w0 >= ETA_WINDOW), history[0])
    if n0 >= n or w0 >= wall:  # no earlier record to measure from: the average since training started
        n0, w0 = 0, 0.0
    return (max_update - n) * (wall - w0) / (n - n0) if n > n0 and wall > w0 else None


def fields_pipe(line):
    """'| loss 4.3 | num_updates 48' -> {'loss': '4.3', 'num_updates': '48'}"""
    return dict(m.groups() for m in re.finditer(r"\| ([a-z_]+) ([-0-9.e+]+)\b", line))


def fmt_seconds(s):
    s = int(round(s))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", required=True, help="file that receives every line")
    ap.add_argument("--max-update", type=int, default=0)
    ap.add_argument("--every", type=float, default=10.0, help="seconds between progress lines, at least")
    args = ap.parse_args(argv)
    valid_loss = None
    history = []  # (updates, wall seconds) of every train_inner record
    in_traceback = False
    last_shown = -args.every
    with open(args.log, "w", encoding="utf-8") as log:
        for line in sys.stdin:
            log.write(line)
            log.flush()
            text = line.rstrip("\n")
            out = None
            if in_traceback or text.startswith("Traceback"):
                in_traceback = True
                out = text
            elif "| WARNING |" in text or "| ERROR |" in text:
                out = text
            elif "num. shared model params" in text or "num. model params" in text:
                out = "  model: " + text.split(" | ")[-1]
            elif "| train_inner |" in text:
                kv = dict(KV.findall(text))
                epoch = re.search(r"epoch (\d+)", text)
                n, wall = int(float(kv.get("num_updates", 0))), float(kv.get("wall", 0))
                history.append((n, wall))
                if time.monotonic() - last_shown < args.every and n != args.max_update:
                    continue
                last_shown = time.monotonic()
                parts = [f"update {n:>{len(str(args.max_update or n))}}" + (f"/{args.max_update}" if args.max_update else "")]
                if epoch:
                    parts[0] += f" (epoch {int(epoch.group(1))})"
                parts.append(f"train loss {float(kv.get('loss', 'nan')):.3f}")
                if valid_loss is not None:
                    parts.append(f"valid loss {valid_loss:.3f}")
                parts.append(f"{float(kv.get('ups', 'nan')):.2f} updates/s")
                eta = ""
                left = eta_seconds(history, args.max_update) if args.max_update and n and wall else None
                if left is not None:
                    eta = f", ETA {fmt_seconds(left)}"
                parts.append(f"{fmt_seconds(wall)} elapsed{eta}")
                out = "  " + " | ".join(parts)
            elif "valid on 'valid' subset" in text:
                valid_loss = float(fields_pipe(text).get("loss", "nan"))
            elif "done training in" in text:
                out = "  " + text.split(" | ")[-1]
            if out is not None:
                print(out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
