"""Atomic file writes, JSON, and the runner's log line."""
import json
import os
import shutil
import time


def log(msg):
    print(f"[multi30k {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def clock(seconds):
    """A duration as the progress line gives it: 42s, 17 min, 3.2 h."""
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


def read_json(path):
    with open(path) as f:
        return json.load(f)


def replace_atomically(path, fill):
    """Have ``fill`` write PATH.tmp, then rename it to PATH: a kill at any moment leaves the old file or
    the new one, never a truncated one; a failed ``fill`` leaves no PATH.tmp."""
    try:
        fill(path + ".tmp")
        os.replace(path + ".tmp", path)
    finally:
        if os.path.exists(path + ".tmp"):
            os.remove(path + ".tmp")


def write_file(path, text):
    """Write PATH atomically: never a truncated file that the next run would die on (or a page cut short)."""
    def fill(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    replace_atomically(path, fill)


def copy_file(src, dst):
    """Copy SRC to DST atomically: archive_run and restore_run tell a finished copy by its last file being
    there, and repair_checkpoints rebuilds checkpoint_last.pt, so no file may be there half-copied."""
    replace_atomically(dst, lambda tmp: shutil.copyfile(src, tmp))


def write_json(path, obj, **dump_args):
    write_file(path, json.dumps(obj, **dump_args))
