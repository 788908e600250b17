"""The quickstart's progress lines (umst_tools/train_progress.py), fed fairseq-train's own log lines."""
import io
import re

from umst_tools import train_progress


def _line(updates, wall, ups):
    return (f"2026-11-27 23:37:23 | INFO | train_inner | epoch 001:     20 / 26 loss=9.437, nll_loss=9.434, "
            f"ppl=691.85, wps=6788.3, ups={ups}, wpb=1649.5, bsz=117.6, num_updates={updates}, lr=0.0003, "
            f"gnorm=1.232, train_wall=5, wall={wall}\n")


def _etas(lines, tmp_path, monkeypatch, capsys, max_update, every=0):
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(lines)))
    assert train_progress.main(["--log", str(tmp_path / "train.log"), "--max-update", str(max_update),
                                "--every", str(every)]) == 0
    shown = capsys.readouterr().out
    assert (tmp_path / "train.log").read_text() == "".join(lines)  # every line kept, unchanged
    return [(int(n), m) for n, m in re.findall(r"update +(\d+)/\d+ .*?ETA (\S+)", shown)]


def test_the_eta_follows_a_change_of_speed(tmp_path, monkeypatch, capsys):
    """20 updates every 5 s up to update 480, then 20 every 36 s (another job took the cores): the ETA at
    update 720 is the 80 updates left at the recent rate, 144 s -- not 58 s from the average since the start
    (the quickstart printed "0.55 updates/s ... ETA 58s" with 80 updates left)."""
    lines, wall = [], 0
    for n in range(20, 801, 20):
        wall += 5 if n <= 480 else 36
        lines.append(_line(n, wall, 4.0 if n <= 480 else 0.55))
    etas = dict(_etas(lines, tmp_path, monkeypatch, capsys, 800))
    assert etas[720] == "2m24s", etas  # 80 updates x 36 s / 20
    assert etas[400] == "1m40s", etas  # steady: the same as the average, 400 x 5 s / 20


def test_the_first_record_estimates_from_the_start_of_training(tmp_path, monkeypatch, capsys):
    etas = _etas([_line(20, 7, 4.11)], tmp_path, monkeypatch, capsys, 800)
    assert etas == [(20, "4m33s")], etas  # 780 x 7 / 20 s, as the quickstart showed


def test_the_terminal_gets_the_model_size_warnings_the_validation_loss_the_end_and_a_traceback_whole(
        tmp_path, monkeypatch, capsys):
    """What else the terminal shows of fairseq's log (``--log-format simple``), line for line: the model's size,
    a warning, each progress line with the latest validation loss once there is one, fairseq's last line, and a
    traceback from its first line to the end of the input; nothing of the rest (the dictionaries, the model's
    repr)."""
    lines = ["2026-11-27 23:37:01 | INFO | fairseq_cli.train | TransformerModel(\n",
             "2026-11-27 23:37:01 | INFO | fairseq_cli.train | num. shared model params: 2,803,328 "
             "(num. trained: 2,803,328)\n",
             "2026-11-27 23:37:01 | INFO | fairseq_cli.train | num. model params: 9,123\n",
             "2026-11-27 23:37:02 | INFO | fairseq.tasks.translation | [src] dictionary: 60 types\n",
             "2026-11-27 23:37:03 | WARNING | fairseq.trainer | NOTE: gradient overflow detected\n",
             _line(20, 7, 4.11),
             "2026-11-27 23:37:30 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 8.683 | "
             "nll_loss 7.937 | ppl 245.01 | wps 7494.2 | wpb 1410.5 | bsz 92.2 | num_updates 26\n",
             _line(40, 14, 4.0),
             "2026-11-27 23:37:31 | ERROR | fairseq.trainer | an error\n",
             "2026-11-27 23:38:00 | INFO | fairseq_cli.train | done training in 18.4 seconds\n",
             "Traceback (most recent call last):\n", '  File "train.py", line 1, in <module>\n',
             "2026-11-27 23:38:01 | INFO | fairseq_cli.train | a line inside the traceback\n",
             "RuntimeError: boom\n"]
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(lines)))
    assert train_progress.main(["--log", str(tmp_path / "train.log"), "--max-update", "800", "--every", "0"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "  model: num. shared model params: 2,803,328 (num. trained: 2,803,328)",
        "  model: num. model params: 9,123",
        "2026-11-27 23:37:03 | WARNING | fairseq.trainer | NOTE: gradient overflow detected",
        "  update  20/800 (epoch 1) | train loss 9.437 | 4.11 updates/s | 7s elapsed, ETA 4m33s",
        "  update  40/800 (epoch 1) | train loss 9.437 | valid loss 8.683 | 4.00 updates/s | 14s elapsed, ETA 4m26s",
        "2026-11-27 23:37:31 | ERROR | fairseq.trainer | an error",
        "  done training in 18.4 seconds",
        "Traceback (most recent call last):",
        '  File "train.py", line 1, in <module>',
        "2026-11-27 23:38:01 | INFO | fairseq_cli.train | a line inside the traceback",
        "RuntimeError: boom"]
    assert (tmp_path / "train.log").read_text() == "".join(lines)


def test_progress_lines_come_at_most_every_few_seconds_but_the_last_update_s_always(tmp_path, monkeypatch,
                                                                                     capsys):
    """With ``--every 3600`` a run of 40 records shows its first progress line and the one of ``--max-update``;
    without ``--max-update`` there is no ETA and the count is not padded."""
    lines = [_line(n, n // 4, 4.0) for n in range(20, 801, 20)]
    assert [n for n, _ in _etas(lines, tmp_path, monkeypatch, capsys, 800, every=3600)] == [20, 800]
    monkeypatch.setattr("sys.stdin", io.StringIO(lines[0]))
    assert train_progress.main(["--log", str(tmp_path / "train.log"), "--every", "0"]) == 0
    assert capsys.readouterr().out == "  update 20 (epoch 1) | train loss 9.437 | 4.00 updates/s | 5s elapsed\n"


def test_the_eta_s_window_its_edges_and_no_rate_yet():
    """``eta_seconds`` at its edges: a record exactly ``ETA_WINDOW`` seconds back is the one the rate is taken from;
    a window whose records have the same update count or the same wall time as the last falls back to the average
    since the start; no update or no time yet gives no ETA (not a division by zero)."""
    assert train_progress.ETA_WINDOW == 120.0
    history = [(5, 0.0), (10, 20.0), (20, 130.0), (30, 140.0)]
    assert train_progress.eta_seconds(history, 100) == 70 * 120.0 / 20  # from (10, 20.0), 120 s back exactly
    assert train_progress.eta_seconds([(20, 5.0), (20, 10.0)], 100) == 80 * 10.0 / 20
    assert train_progress.eta_seconds([(10, 10.0), (20, 10.0)], 100) == 80 * 10.0 / 20
    assert train_progress.eta_seconds([(0, 5.0)], 100) is None
    assert train_progress.eta_seconds([(5, 0.0)], 100) is None
    assert [train_progress.fmt_seconds(s) for s in (59.4, 60, 61)] == ["59s", "1m00s", "1m01s"]


def test_each_line_reaches_the_terminal_as_it_comes_and_the_log_file_is_required(tmp_path):
    """Fed through a pipe, as the quickstart runs it: a line shows before fairseq writes the next one (the
    progress is live, not held in a buffer until the end); without ``--log`` it stops with argparse's usage."""
    import os
    import select
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # (a pipe buffers, as in a terminal's)
    proc = subprocess.Popen([sys.executable, "-m", "umst_tools.train_progress", "--log", str(tmp_path / "t.log")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        proc.stdin.write("2026-11-27 23:37:03 | WARNING | fairseq.trainer | NOTE: a warning\n")
        proc.stdin.flush()
        assert select.select([proc.stdout], [], [], 60)[0], "no line within 60 s while fairseq runs on"
        assert proc.stdout.readline() == "2026-11-27 23:37:03 | WARNING | fairseq.trainer | NOTE: a warning\n"
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    no_log = subprocess.run([sys.executable, "-m", "umst_tools.train_progress"], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True)
    assert no_log.returncode == 2 and "the following arguments are required: --log" in no_log.stderr
