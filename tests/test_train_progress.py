"""The quickstart's progress lines (umst_tools/train_progress.py), fed fairseq-train's own log lines."""
import io
import re

from umst_tools import train_progress


def _line(updates, wall, ups):
    return (f"2026-11-27 23:37:23 | INFO | train_inner | epoch 001:     20 / 26 loss=9.437, nll_loss=9.434, "
            f"ppl=691.85, wps=6788.3, ups={ups}, wpb=1649.5, bsz=117.6, num_updates={updates}, lr=0.0003, "
            f"gnorm=1.232, train_wall=5, wall={wall}\n")


def _etas(lines, tmp_path, monkeypatch, capsys, max_update):
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(lines)))
    assert train_progress.main(["--log", str(tmp_path / "train.log"), "--max-update", str(max_update),
                                "--every", "0"]) == 0
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
