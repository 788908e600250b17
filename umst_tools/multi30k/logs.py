"""Reading fairseq-train logs: updates, losses, training segments, times, validation curves, paces."""
import datetime
import os
import re


def last_update(train_log):
    """(updates done, last train loss) read from a fairseq log, or (0, None)."""
    if not os.path.exists(train_log):
        return 0, None
    upd, loss = 0, None
    with open(train_log, errors="replace") as f:
        for line in f:
            upd = max(upd, logged_update(line) or 0)
            line_loss = logged_loss(line)
            loss = loss if line_loss is None else line_loss
    return upd, loss


def logged_update(line):
    """The update count a fairseq log line reports (train_inner's ``num_updates=U``, an epoch summary's
    ``| num_updates U``), or None."""
    m = re.search(r"num_updates=(\d+)", line) or re.search(r"\| num_updates (\d+)", line)
    return int(m.group(1)) if m else None


def logged_loss(line):
    """The train loss a fairseq train_inner line reports (``loss=L``), or None."""
    m = re.search(r"\bloss=([\d.]+)", line)
    return float(m.group(1)) if m else None


LOG_TIME = re.compile(r"^\[?(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)")


def training_segments(train_log):
    """[{"start", "end" (seconds since the epoch), "from_update", "to_update", "loss", "points"}, ...]: one
    entry per training process that wrote to the log (the runner heads each with ``# ...``; a resumed
    process starts from the update of the checkpoint it loaded, which fairseq logs as ``(epoch E @ U
    updates)``); ``loss`` is the last train loss that process logged (None before its first); ``points``
    the (time, update) of each of its timed lines that reports an update, for a recent pace."""
    segments = []
    if not os.path.exists(train_log):
        return segments
    with open(train_log, errors="replace") as f:
        for line in f:
            if line.startswith("# "):
                m = re.match(r"# started (\S+)", line)
                start = datetime.datetime.fromisoformat(m.group(1)).timestamp() if m else None
                segments.append(dict(start=start, end=start, from_update=0, to_update=0, loss=None, points=[],
                                     started=m.group(1) if m else None))
                continue
            if not segments:
                segments.append(dict(start=None, end=None, from_update=0, to_update=0, loss=None, points=[]))
            seg = segments[-1]
            m = LOG_TIME.match(line)
            t = datetime.datetime.fromisoformat(m.group(1).replace("T", " ")).timestamp() if m else None
            if t is not None:
                seg["start"] = t if seg["start"] is None else seg["start"]
                seg["end"] = t
            m = re.search(r"Loaded checkpoint .*\(epoch \d+ @ (\d+) updates", line)
            if m:
                seg["from_update"] = seg["to_update"] = int(m.group(1))
            update = logged_update(line)
            if update is not None and t is not None:
                seg["points"].append((t, update))
            seg["to_update"] = max(seg["to_update"], update or 0)
            line_loss = logged_loss(line)
            seg["loss"] = seg["loss"] if line_loss is None else line_loss
    return [s for s in segments if s["start"] is not None]


def training_time(train_log, max_update):
    """Seconds of training for ``max_update`` updates: time per update over every segment of the log
    (validation and checkpoint saving included) times the budget, so that the updates a killed
    segment did after its last checkpoint, redone by the next, are not counted twice. None without
    any timed update."""
    seconds, _ = scaled_to_budget([(s, s["end"] - s["start"]) for s in training_segments(train_log)], max_update)
    return seconds


def scaled_to_budget(timed_segments, max_update):
    """(seconds per update over [(segment, its seconds), ...] times ``max_update``, updates measured over);
    (None, 0) without any update done."""
    done = sum(s["to_update"] - s["from_update"] for s, _ in timed_segments)
    if done <= 0:
        return None, 0
    return sum(t for _, t in timed_segments) / done * max_update, done


def valid_curve(train_log):
    """[(update, validation perplexity), ...] of a fairseq log, in order (one point per update count)."""
    points = {}
    if os.path.exists(train_log):
        with open(train_log, errors="replace") as f:
            for line in f:
                if "valid on" in line:
                    ppl, upd = re.search(r"\| ppl ([\d.]+)", line), re.search(r"\| num_updates (\d+)", line)
                    if ppl and upd:
                        points[int(upd.group(1))] = float(ppl.group(1))
    return sorted(points.items())


PACE_WINDOW = 600.0  # seconds: the progress line's pace is a training's over its latest 10 minutes


def recent_pace(segment, window=PACE_WINDOW):
    """Seconds per update of a training process over its last ``window`` seconds of logged updates, or over
    the whole process while it is younger: a pace (and finish time) that follows a change of neighbours,
    or a pause, within minutes instead of averaging it in for the rest of the run. None before its first
    logged update."""
    points = segment["points"]
    if points:
        last_t, last_u = points[-1]
        before = [(t, u) for t, u in points if t <= last_t - window]
        if before and last_u > before[-1][1]:
            return (last_t - before[-1][0]) / (last_u - before[-1][1])
    if segment["to_update"] > segment["from_update"]:
        return (segment["end"] - segment["start"]) / (segment["to_update"] - segment["from_update"])
    return None


CHECKPOINT_NAME = re.compile(r"^checkpoint(?:(\d+)|_\d+_(\d+)|_last)\.pt$")


def checkpoint_updates(path):
    """The update count a fairseq checkpoint was saved at."""
    import torch

    state = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    return state["optimizer_history"][-1]["num_updates"]
