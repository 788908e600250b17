"""scripts/prepare-multi30k.sh on bad input: every raw file is checked before anything is extracted,
and a run that stops leaves no stage stamp and nothing under a final name (so nothing half-written
is taken for done). Tiny stand-in files, --parser none: each run stops before BPE and takes seconds."""
import os
import subprocess

import pytest

import e2e
import recipe_toy

ROOT = e2e.ROOT
SCRIPT = os.path.join(ROOT, "scripts", "prepare-multi30k.sh")
TINY = {"train": 12, "valid": 4, "test": 3, "test1": 3, "test2": 3}


def env(sources):
    return e2e.recipe_env(MULTI30K_SOURCES=sources)


def prepare(sources, work, raw=None, *extra):
    cmd = ["bash", SCRIPT, "--work-dir", str(work), "--parser", "none", "--workers", "1", "--bpe-merges", "20"]
    if raw is not None:
        cmd += ["--raw-dir", str(raw)]
    return subprocess.run(cmd + list(extra), env=env(sources), cwd=ROOT, capture_output=True, text=True)


@pytest.fixture
def standin(tmp_path):
    """(raw dir with the ten good files, sources list pinning them)."""
    raw = tmp_path / "raw"
    recipe_toy.write_multi30k_standin(str(raw), TINY)
    return raw, recipe_toy.write_multi30k_sources(tmp_path / "sources.txt", str(raw))


def assert_nothing_taken_for_done(work):
    assert not (work / ".stamps").exists() or not os.listdir(work / ".stamps"), sorted(os.listdir(work / ".stamps"))
    orig = work / "orig"
    assert not orig.exists() or not os.listdir(orig), sorted(os.listdir(orig))
    assert not (work / "tok").exists() and not (work / "data-bin").exists()


def test_truncated_archive_stops_naming_it(standin, tmp_path):
    raw, sources = standin
    f = raw / "val.de.gz"
    data = f.read_bytes()
    f.write_bytes(data[:len(data) // 2])
    proc = prepare(sources, tmp_path / "work", raw)
    assert proc.returncode == 1, proc.stderr
    assert f"ERROR: {f}: sha256 " in proc.stderr and f"({len(data) // 2} bytes)" in proc.stderr, proc.stderr
    assert "truncated, corrupted or not the pinned release" in proc.stderr
    assert proc.stderr.count("ERROR:") == 1  # the nine good files pass
    assert_nothing_taken_for_done(tmp_path / "work")


def test_corrupted_archive_stops_naming_it(standin, tmp_path):
    raw, sources = standin
    f = raw / "test_2017_mscoco.en.gz"
    data = bytearray(f.read_bytes())
    for i in range(20, 30):  # inside the deflate stream: same size, other bytes
        data[i] ^= 0xFF
    f.write_bytes(bytes(data))
    proc = prepare(sources, tmp_path / "work", raw)
    assert proc.returncode == 1, proc.stderr
    assert f"ERROR: {f}: sha256 " in proc.stderr and f"({len(data)} bytes)" in proc.stderr, proc.stderr
    assert "corrupted" in proc.stderr and proc.stderr.count("ERROR:") == 1
    assert_nothing_taken_for_done(tmp_path / "work")


def test_bad_gzip_with_matching_checksum_stops(standin, tmp_path):
    """A sources list pinning a broken file (a wrong list, not a wrong file) still stops at gzip -t."""
    raw, _ = standin
    f = raw / "train.en.gz"
    f.write_bytes(f.read_bytes()[:-8])  # no gzip trailer
    sources = recipe_toy.write_multi30k_sources(tmp_path / "pinned-broken.txt", str(raw))
    proc = prepare(sources, tmp_path / "work", raw)
    assert proc.returncode == 1 and f"ERROR: {f}: not a valid gzip stream" in proc.stderr, proc.stderr
    assert_nothing_taken_for_done(tmp_path / "work")


def test_missing_file_stops_naming_it(standin, tmp_path):
    raw, sources = standin
    (raw / "test_2016_flickr.de.gz").unlink()
    proc = prepare(sources, tmp_path / "work", raw)
    assert proc.returncode == 1, proc.stderr
    assert f"ERROR: missing {raw}/test_2016_flickr.de.gz" in proc.stderr, proc.stderr
    assert_nothing_taken_for_done(tmp_path / "work")


def test_download_keeps_a_bad_file_as_rejected(standin, tmp_path):
    """The download stage through a file:// url-prefix: the good files are fetched and verified, the
    corrupted one is kept as FILE.rejected (not under its name) and the script exits 1."""
    mirror, _ = standin
    sources = recipe_toy.write_multi30k_sources(tmp_path / "sources-url.txt", str(mirror),
                                                url_prefix=f"file://{mirror}")
    good = {n: recipe_toy.sha256(mirror / n) for n in os.listdir(mirror)}
    bad = mirror / "val.en.gz"
    bad.write_bytes(bad.read_bytes() + b"junk")
    work = tmp_path / "work"
    proc = prepare(sources, work)
    assert proc.returncode == 1, proc.stderr
    assert f"ERROR: {work}/raw/val.en.gz.part: sha256" in proc.stderr, proc.stderr
    assert "rejected downloads kept as *.rejected" in proc.stderr
    fetched = sorted(os.listdir(work / "raw"))
    assert fetched == sorted(n for n in good if n != "val.en.gz") + ["val.en.gz.rejected"], fetched
    for n in fetched:
        if not n.endswith(".rejected"):
            assert recipe_toy.sha256(work / "raw" / n) == good[n], n
    assert (work / "raw" / "val.en.gz.rejected").read_bytes() == bad.read_bytes()
    assert not (work / ".stamps" / "extract").exists() and not (work / "orig").exists()
    # A rerun does not take the rejected copy for the file: it fetches that one again (and only that one).
    proc = prepare(sources, work)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("] download file://") == 1 and f"download file://{bad}" in proc.stderr, proc.stderr
    assert not (work / "raw" / "val.en.gz").exists() and not (work / ".stamps" / "extract").exists()


def test_sides_with_different_line_counts_stop_naming_the_split(standin, tmp_path):
    raw, _ = standin
    f = raw / "val.de.gz"
    recipe_toy.write_gz(str(f), recipe_toy.read_gz(str(f))[:-1])
    sources = recipe_toy.write_multi30k_sources(tmp_path / "sources-short.txt", str(raw))
    proc = prepare(sources, tmp_path / "work", raw)
    assert proc.returncode == 1, proc.stderr
    n = TINY["valid"]
    assert f"ERROR: valid: {n} en lines but {n - 1} de lines" in proc.stderr, proc.stderr
    assert_nothing_taken_for_done(tmp_path / "work")


def test_toy_standin_where_shared_is_absent(tmp_path):
    """Without ../shared (a clone elsewhere) the stand-in is the toy corpus under the ten names."""
    origin, counts = recipe_toy.write_multi30k_standin(str(tmp_path / "raw"), TINY, shared_dir=None)
    assert origin == "toy" and counts == TINY
    for stem, split, _ in recipe_toy.MULTI30K_FILES:
        en, de = (recipe_toy.read_gz(str(tmp_path / "raw" / f"{stem}.{lang}.gz")) for lang in ("en", "de"))
        assert len(en) == len(de) == TINY[split] and all(en) and all(de), stem
    assert sorted(os.listdir(tmp_path / "raw")) == sorted(f"{s}.{lang}.gz" for s, _, _ in recipe_toy.MULTI30K_FILES
                                                          for lang in ("en", "de"))
