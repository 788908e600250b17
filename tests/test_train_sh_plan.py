"""scripts/train.sh --dry-run and the Slurm scripts: the commands planned for several machines of several GPUs.

No GPU is needed: train.sh plans from --gpus. The sbatch scripts run on Slurm itself (a local cluster of two nodes,
tests/slurm_cluster.py). ``_slurm_stand_ins`` (a stand-in ``srun`` that runs a command once per node with
SLURM_NODEID set, and ``scontrol show hostnames``) remains for checks of what a script plans without Slurm
(tests/test_docs.py's checking form of the documented sbatch lines, launch.sh's host list)."""
import json
import os
import re
import stat
import subprocess
import time

import pytest

import e2e
import slurm_cluster

TRAIN_SH = os.path.join(e2e.ROOT, "scripts", "train.sh")


def env(**extra):
    out = {**e2e.cli_env(), "PYTHON": os.path.join(e2e.BIN, "python")}
    out.pop("CUDA_VISIBLE_DEVICES", None)
    out.update(extra)
    return out


def plan(row, *args, **environ):
    proc = subprocess.run(["bash", TRAIN_SH, row, "--data", "/data/bin", "--dry-run", *args], env=env(**environ),
                          cwd=e2e.ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1], proc.stderr


def field(command, name):
    m = re.search(rf"(?:^|\s){re.escape(name)}=(\S+)", command)
    return m.group(1) if m else None


def ranks(command):
    """The ranks fairseq will give this machine's processes: distributed_rank .. + visible devices - 1."""
    base = int(field(command, "distributed_training.distributed_rank") or 0)
    visible = field(command, "CUDA_VISIBLE_DEVICES").split(",")
    return set(range(base, base + len(visible)))


@pytest.mark.parametrize("nodes,gpus", [(2, 4), (3, 2)])
def test_every_machine_uses_its_gpus_and_ranks_never_overlap(nodes, gpus):
    commands = [plan("umst-t2-umst-base", "--gpus", str(gpus), "--nnodes", str(nodes), "--node-rank", str(r),
                     "--master-addr", "node0")[0] for r in range(nodes)]
    seen = set()
    for command in commands:
        assert field(command, "CUDA_VISIBLE_DEVICES") == ",".join(str(i) for i in range(gpus))
        assert field(command, "distributed_training.distributed_world_size") == str(nodes * gpus)
        assert field(command, "distributed_training.distributed_init_method") == "tcp://node0:29500"
        mine = ranks(command)
        assert not mine & seen, f"ranks {mine & seen} planned twice"
        seen |= mine
    assert seen == set(range(nodes * gpus))
    # the row's 8 GPUs x update_freq 8 become nodes x gpus x (64 / (nodes x gpus))
    assert field(commands[0], "optimization.update_freq") == f"\\[{64 // (nodes * gpus)}\\]"


def test_fewer_gpus_than_the_machine_has_keeps_the_first_ones():
    command, _ = plan("umst-t2-umst-base", "--gpus", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "n0",
                      CUDA_VISIBLE_DEVICES="3,5,6,7")
    assert field(command, "CUDA_VISIBLE_DEVICES") == "3,5"
    assert ranks(command) == {2, 3}


def test_bf16_flag_is_named_for_what_it_does():
    command, _ = plan("umst-t2-umst-base", "--gpus", "8", "--amp-bf16")
    assert "common.amp=true" in command and "+common.amp_dtype=bfloat16" in command and "common.fp16=false" in command
    proc = subprocess.run(["bash", TRAIN_SH, "umst-t2-umst-base", "--data", "/d", "--bf16"], env=env(),
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--amp-bf16" in proc.stderr
    # on a CPU too: the line says what the run does (bf16 autocast), not fp32
    command, stderr = plan("umst-t2-umst-base", "--gpus", "0", "--amp-bf16")
    assert "common.amp=true" in command and "no GPU: CPU, bf16 autocast (--amp-bf16)" in stderr, stderr
    assert "no GPU: CPU, fp32," in plan("umst-t2-umst-base", "--gpus", "0")[1]


def _slurm_stand_ins(bin_dir, hosts):
    """``srun --nodes=N ...``: runs the command once per node with SLURM_NODEID/SLURM_NNODES set;
    ``scontrol show hostnames``: prints ``hosts``, then many more."""
    srun = bin_dir / "srun"
    srun.write_text("#!/usr/bin/env bash\nN=1\nwhile [[ \"$1\" == --* ]]; do\n"
                    "  case \"$1\" in --nodes=*) N=\"${1#--nodes=}\" ;; esac; shift\ndone\n"
                    "for ((i = 0; i < N; i++)); do SLURM_NODEID=$i SLURM_NNODES=$N \"$@\" || exit $?; done\n")
    scontrol = bin_dir / "scontrol"
    # a long host list, as on a big job: a reader that stops after the first host must not kill the job
    scontrol.write_text("#!/usr/bin/env bash\nprintf '%s\\n' " + " ".join(hosts) + "\nseq 200000 | sed 's/^/spare-/'\n")
    for p in (srun, scontrol):
        p.chmod(p.stat().st_mode | stat.S_IEXEC)


@pytest.fixture(scope="module")
def slurm():
    """A real Slurm cluster of two nodes on this machine (tests/slurm_cluster.py; skips where Slurm cannot run)."""
    with slurm_cluster.cluster() as slurm_env:
        yield slurm_env


def _run_job(environ, *sbatch_args, timeout=120):
    job = subprocess.run(["sbatch", "--parsable", *sbatch_args], env=environ, cwd=e2e.ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    deadline = time.monotonic() + timeout
    while (state := slurm_cluster.job_field(environ, job, "JobState")) not in ("COMPLETED", "FAILED", "CANCELLED",
                                                                               "TIMEOUT", "NODE_FAIL"):
        assert time.monotonic() < deadline, state
        time.sleep(0.3)
    return int(job), state


# the job's options and what each node's train.sh command must then hold: the compile options (train.sh --compile,
# --cudagraphs with --batch-buckets) and a third positional, the save directory
JOB_OPTIONS = {
    "train-1node.sbatch": (["--cudagraphs", "--batch-buckets", "12"],
                           ["+common.compile=true", "+common.compile_cudagraphs=true", "++task.num_batch_buckets=12"]),
    "train-2nodes.sbatch": (["/ckpt", "--compile"], ["+common.compile=true", "checkpoint.save_dir=/ckpt"]),
}


@pytest.mark.parametrize("script,nodes,tokens", [("train-1node.sbatch", 1, None), ("train-2nodes.sbatch", 2, 1792)])
def test_sbatch_scripts_plan_one_train_sh_per_node(slurm, tmp_path, script, nodes, tokens):
    """Submitted to Slurm itself with TRAIN_SH_DRY_RUN=1 and GPUS_PER_NODE=8 (the nodes have no GPU; --gres=none):
    srun starts launch.sh once per node, each plans its train.sh command for 8 GPUs with its ranks and the
    rendezvous at the job's first node, and each node's task gets the job's --cpus-per-task (srun is given it: Slurm
    22.05's srun does not take it, and this cluster binds tasks to cores); the job's options reach every node's
    train.sh (``JOB_OPTIONS``)."""
    cpus = min(2, len(os.sched_getaffinity(0)))
    out = tmp_path / "job.out"
    environ = {**env(), **{k: v for k, v in slurm.items() if k == "SLURM_CONF"}, "TRAIN_SH_DRY_RUN": "1",
               "GPUS_PER_NODE": "8"}
    options, expected = JOB_OPTIONS[script]
    job, state = _run_job(environ, "--gres=none", f"--cpus-per-task={cpus}", f"--output={out}",
                          os.path.join("scripts", "slurm", script), "prime-t1-prime-big", "/data/wmt14", *options,
                          *(["--max-tokens", str(tokens)] if tokens else []))
    text = out.read_text()
    assert state == "COMPLETED", text[-3000:]
    commands = [line for line in text.splitlines() if "fairseq_cli.hydra_train" in line]
    assert len(commands) == nodes, text[-3000:]
    seen = set()
    for command in commands:
        assert field(command, "distributed_training.distributed_world_size") == str(8 * nodes)
        assert field(command, "CUDA_VISIBLE_DEVICES") == "0,1,2,3,4,5,6,7"
        assert "+common.amp_dtype=bfloat16" in command and "task.data=/data/wmt14" in command
        assert all(f" {o} " in f"{command} " for o in expected), (expected, command)
        # prime-t1 rows assume 4 GPUs x update_freq 32 at 3,584 tokens: 128 / (8 x nodes), times 3584 / --max-tokens
        scale = 3584 // tokens if tokens else 1
        assert field(command, "optimization.update_freq") == f"\\[{128 * scale // (8 * nodes)}\\]"
        assert field(command, "dataset.max_tokens") == (str(tokens) if tokens else None)
        if nodes > 1:
            assert field(command, "distributed_training.distributed_init_method") == f"tcp://n1:{20000 + job % 20000}"
        assert not ranks(command) & seen
        seen |= ranks(command)
    assert seen == set(range(8 * nodes))
    affinity = re.findall(r"\[launch\] node (n\d) \(rank (\d) of \d\): CPU affinity \S+ \((\d+) CPUs; the job asked "
                          r"--cpus-per-task (\d+)\)", text)
    assert sorted(a[:2] for a in affinity) == [(f"n{i + 1}", str(i)) for i in range(nodes)], text[-3000:]
    assert all(int(count) == int(asked) == cpus for _, _, count, asked in affinity), affinity


def test_launch_takes_the_first_host_of_a_long_list(tmp_path):
    """launch.sh reads the job's first node from ``scontrol show hostnames`` without a pipe into head: on a big job
    (a stand-in scontrol printing 200,000 more hosts), a reader that stopped after the first host would have
    killed scontrol with SIGPIPE and, under pipefail, the job with status 141."""
    _slurm_stand_ins(tmp_path, ["gpu-a", "gpu-b"])
    environ = env(PATH=f"{tmp_path}:{os.environ['PATH']}", SLURM_JOB_ID="1234", SLURM_JOB_NODELIST="gpu-[a-b]",
                  SLURM_NNODES="2", SLURM_NODEID="1", TRAIN_SH_DRY_RUN="1", GPUS_PER_NODE="8")
    proc = subprocess.run(["bash", os.path.join(e2e.ROOT, "scripts", "slurm", "launch.sh"), "prime-t1-prime-big",
                           "/data/wmt14", "/ckpt"], env=environ, cwd=e2e.ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    command = [line for line in proc.stdout.splitlines() if "fairseq_cli.hydra_train" in line][0]
    assert field(command, "distributed_training.distributed_init_method") == "tcp://gpu-a:21234"
    assert ranks(command) == set(range(8, 16))


def test_the_effective_batch_table_in_the_docs_is_current():
    from umst_tools import batch_table

    with open(os.path.join(e2e.ROOT, "docs", "wmt-on-gpus.md"), encoding="utf-8") as f:
        page = f.read()
    assert batch_table.markdown() in page, "regenerate with: python -m umst_tools.batch_table"
    cards = "\n".join("  " + line for line in batch_table.cards_markdown().splitlines())
    assert cards in page, "regenerate with: python -m umst_tools.batch_table --cards (indented two spaces)"


# ---------------------------------------------------------------------------------------------------------
# The entry points find the project's environment themselves (scripts/lib/env.sh): from a login shell or a
# Slurm job nothing is active, and PYTHON is not set.

LOGIN_SHELL = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin"}  # what `env -i` leaves


def _bare(cmd, cwd=e2e.ROOT, **extra):
    return subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in {**LOGIN_SHELL, **extra}.items()), *cmd],
                          cwd=cwd, capture_output=True, text=True)


def test_train_sh_finds_the_project_venv_from_a_bare_shell():
    venv_python = os.path.join(e2e.ROOT, ".venv", "bin", "python")
    if not os.path.isfile(venv_python):
        pytest.skip("no .venv in this checkout (scripts/setup_env.sh makes it); the active-venv case below runs")
    proc = _bare(["bash", "scripts/train.sh", "umst-t2-umst-base", "--data", "D", "--gpus", "8", "--amp-bf16",
                  "--dry-run"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[1] == venv_python, proc.stdout  # "CUDA_VISIBLE_DEVICES=... PYTHON -m fairseq_cli..."


def test_train_sh_uses_the_active_venv(tmp_path):
    # an activated environment (VIRTUAL_ENV, as `source .venv/bin/activate` sets it) wins over ./.venv
    proc = _bare(["bash", "scripts/train.sh", "umst-t2-umst-base", "--data", "D", "--gpus", "8", "--dry-run"],
                 VIRTUAL_ENV=os.path.dirname(e2e.BIN))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[1] == os.path.join(e2e.BIN, "python")


@pytest.mark.parametrize("command", [
    ["scripts/train.sh", "umst-t2-umst-base", "--data", "D", "--dry-run"],
    ["scripts/evaluate.sh", "--data", "D", "--checkpoint", "C"],
    ["scripts/prepare-wmt14-en-de.sh", "--raw-dir", "R"],
])
def test_without_an_environment_each_entry_point_says_how_to_get_one(tmp_path, command):
    # a checkout without .venv, nothing active: one line naming the set-up command, exit 2, nothing written
    import shutil
    for d in ("scripts", "configs"):
        shutil.copytree(os.path.join(e2e.ROOT, d), tmp_path / d)
    proc = _bare(["bash", *command], cwd=tmp_path, VIRTUAL_ENV=str(tmp_path / "no-such-venv"))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "bash scripts/setup_env.sh" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "data").exists()


def test_plain_overrides_of_keys_the_row_does_not_set_are_added():
    # umst-t2-umst-base's YAML sets no encoder_layers and no use_old_adam: hydra alone refuses both without "+"
    command, _ = plan("umst-t2-umst-base", "--gpus", "8", "--", "model.encoder_layers=2", "optimizer.use_old_adam=true",
                      "model.dropout=0.2", "+common.compile=true", "optimization.max_update=10")
    assert "++model.encoder_layers=2" in command and "++optimizer.use_old_adam=true" in command
    assert " model.dropout=0.2" in command and "++model.dropout" not in command  # set in the YAML: as given
    assert " +common.compile=true" in command and " optimization.max_update=10" in command



def test_a_misspelt_model_key_stops_before_training(tmp_path):
    # (not under --dry-run, which does not import fairseq to check it: the real start-up does, before fairseq runs)
    proc = subprocess.run(["bash", TRAIN_SH, "umst-t2-umst-base", "--data", str(tmp_path), "--save-dir",
                           str(tmp_path / "save"), "--gpus", "0", "--", "model.encoder_layrs=2"], env=env(), capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "model.encoder_layrs: not a flag of arch umst_base" in proc.stderr, proc.stderr
    assert "hydra_train" not in proc.stderr


def test_cudagraphs_pads_to_eight_length_buckets_unless_told_how_many():
    """--cudagraphs is --compile with CUDA graphs over length buckets: 8 unless --batch-buckets says how many (a
    graph is recorded per batch shape; unbucketed lengths would record one per batch). --batch-buckets alone buckets
    without compiling. Two settings of the buckets, or a bucket count that is not a positive number, stop before
    anything runs, saying why."""
    command, _ = plan("umst-t2-umst-base", "--gpus", "8", "--cudagraphs")
    assert "+common.compile=true" in command and "+common.compile_cudagraphs=true" in command, command
    assert field(command, "++task.num_batch_buckets") == "8", command
    command, _ = plan("umst-t2-umst-base", "--gpus", "8", "--cudagraphs", "--batch-buckets", "3")
    assert field(command, "++task.num_batch_buckets") == "3", command
    command, _ = plan("umst-t2-umst-base", "--gpus", "8", "--batch-buckets", "5")
    assert field(command, "++task.num_batch_buckets") == "5" and "compile" not in command, command
    command, _ = plan("umst-t2-umst-base", "--gpus", "8", "--compile")
    assert "num_batch_buckets" not in command and "compile_cudagraphs" not in command, command
    for args, says in [(["--batch-buckets", "0"], "--batch-buckets 0: expected a number of buckets"),
                       (["--cudagraphs", "--", "task.num_batch_buckets=3"], "both set the buckets; give one"),
                       (["--batch-buckets", "4", "--", "+task.num_batch_buckets=3"], "both set the buckets")]:
        proc = subprocess.run(["bash", TRAIN_SH, "umst-t2-umst-base", "--data", "/d", "--dry-run", *args], env=env(),
                              capture_output=True, text=True)
        assert proc.returncode == 2 and says in proc.stderr, (args, proc.stderr)
    # a hydra override of the buckets alone is the user's, passed on as given
    command, _ = plan("umst-t2-umst-base", "--gpus", "8", "--", "task.num_batch_buckets=3")
    assert "num_batch_buckets=3" in command and "++task.num_batch_buckets=8" not in command, command


@pytest.mark.parametrize("gpus,nodes,uf", [(8, 1, 2), (8, 2, 1), (4, 1, 4)])
def test_max_tokens_keeps_the_tokens_per_update(gpus, nodes, uf):
    """--max-tokens 38400 on nodes x gpus: the planned update has the tokens of the row's own batch, read from its
    YAML (max_tokens x update_freq x distributed_world_size: 9,600 x 8 x 8 = 614,400 for umst-t2-umst-base)."""
    import yaml

    with open(os.path.join(e2e.ROOT, "configs", "umst-t2-umst-base.yaml")) as f:
        row = yaml.safe_load(f)
    row_tokens = (row["dataset"]["max_tokens"] * row["optimization"]["update_freq"][0]
                  * row["distributed_training"]["distributed_world_size"])
    extra = ["--nnodes", str(nodes), "--node-rank", "0", "--master-addr", "n0"] if nodes > 1 else []
    command, _ = plan("umst-t2-umst-base", "--gpus", str(gpus), "--max-tokens", "38400", *extra)
    planned_uf = re.fullmatch(r"\\\[(\d+)\\\]", field(command, "optimization.update_freq"))
    assert field(command, "dataset.max_tokens") == "38400" and planned_uf, command
    assert int(planned_uf.group(1)) == uf
    world = int(field(command, "distributed_training.distributed_world_size"))
    assert world == gpus * nodes, command
    assert int(field(command, "dataset.max_tokens")) * int(planned_uf.group(1)) * world == row_tokens, command


def test_the_batch_per_card_gives_each_rows_tokens_per_update_exactly_and_train_sh_plans_it():
    """umst_tools.batch_table's plan for 1, 8 and 16 cards (at most 38,400 tokens per card at base width, 19,200
    big) multiplies out to the row's tokens per update, and train.sh --max-tokens T on that many GPUs plans exactly
    that update_freq (MSC's 65,536 tokens on one card, 32,768 x 2, once came out 32,768 x 8: train.sh divided the
    config's update_freq by the new batch before the GPU scaling, and 2 x 4,096 / 32,768 rounded up to 1)."""
    from umst_tools import batch_table

    for b in batch_table.rows():
        for cards in batch_table.CARDS:
            per_card = batch_table.card_plan(b["tokens_per_update"], cards, batch_table.CARD_TOKENS[batch_table.width(b)])
            assert per_card is not None, (b["row"], cards)
            tokens, uf = per_card
            assert tokens * uf * cards == b["tokens_per_update"] and tokens <= 38400, (b["row"], cards, per_card)
    for row, cards in (("msc-t4-msc-6l-base", 1), ("umst-t2-umst-big", 8), ("prime-t1-prime-big", 16),
                       ("umst-t3-umst-base", 8)):
        b = batch_table.row_batch(os.path.join(e2e.ROOT, "configs", f"{row}.yaml"))
        tokens, uf = batch_table.card_plan(b["tokens_per_update"], cards, batch_table.CARD_TOKENS[batch_table.width(b)])
        command, err = plan(row, "--gpus", str(cards), "--max-tokens", str(tokens))
        assert field(command, "optimization.update_freq") == f"\\[{uf}\\]", (row, cards, command)
        assert field(command, "dataset.max_tokens") == str(tokens) and "WARNING" not in err, err


def test_hours_of_a_row_from_a_speed_table(tmp_path):
    """A row's hours: updates x (tokens per update x target tokens per step / --max-tokens) / (cards x words/s),
    from the newest speed table's compiled bf16 row of the arch (eager where no compiled row was measured)."""
    from umst_tools import batch_table

    rows = [dict(arch="umst_base", stock=False, precision="bf16", compiled=False, max_tokens=38400,
                 words_per_s=100000.0, target_tokens_per_step=30000.0),
            dict(arch="umst_base", stock=False, precision="bf16", compiled=True, max_tokens=38400,
                 words_per_s=150000.0, target_tokens_per_step=30000.0),
            dict(arch="transformer", stock=True, precision="fp16", compiled=False, max_tokens=38400,
                 words_per_s=999999.0, target_tokens_per_step=30000.0)]
    (tmp_path / "gpu-speed-nvidia-h200-abc.json").write_text(json.dumps(
        dict(card="NVIDIA H200", started="2026-12-01", max_tokens=[38400, 4096], rows=rows)))
    b = batch_table.row_batch(os.path.join(e2e.ROOT, "configs", "umst-t2-umst-base.yaml"))
    (card, record), = batch_table.speed_records(str(tmp_path))
    assert card == "NVIDIA H200"
    expected = 50000 * (614400 * 30000 / 38400) / (8 * 150000.0) / 3600  # the compiled row
    assert abs(batch_table.row_hours(b, record, 8) - expected) < 1e-9
    big = batch_table.row_batch(os.path.join(e2e.ROOT, "configs", "umst-t2-umst-big.yaml"))
    assert batch_table.row_hours(big, record, 8) is None  # umst_big has no row in the table
    table = batch_table.cards_markdown(results_dir=str(tmp_path))
    assert "hours on 8 x NVIDIA H200" in table and f"{expected:,.1f}" in table
    # another shape of a measured arch has no hours: MSC's 36 layers are not the measured msc_base's 6
    rows.append(dict(arch="msc_base", stock=False, precision="bf16", compiled=True, max_tokens=38400,
                     argv=["--arch", "msc_base"], words_per_s=150000.0, target_tokens_per_step=30000.0))
    (tmp_path / "gpu-speed-nvidia-h200-abc.json").write_text(json.dumps(
        dict(card="NVIDIA H200", started="2026-12-01", max_tokens=[38400, 4096], rows=rows)))
    (card, record), = batch_table.speed_records(str(tmp_path))
    six, deep = (batch_table.row_batch(os.path.join(e2e.ROOT, "configs", f"msc-t4-msc-{n}l-base.yaml"))
                 for n in (6, 36))
    assert batch_table.row_hours(six, record, 1) is not None and batch_table.row_hours(deep, record, 1) is None
    # nor a batch per card well under the measured one (8 cards of MSC's 65,536 tokens: 8,192 each)
    line = next(l for l in batch_table.cards_markdown(results_dir=str(tmp_path)).splitlines() if "msc-6l-base" in l)
    assert line.endswith("| not measured at 8,192 tokens per card | `?` |"), line  # a record without its commit


def test_hours_come_from_the_newest_table_that_measured_the_row(tmp_path):
    """A speed table cut short by its deadline (no TranSFormer row) does not hide an older table's row of that arch
    on the same card: each row's hours come from the newest table that measured it, whose commit the last column
    names; an arch both measured takes the newer table's words/s, compiled where one of them has the compiled row
    (a newer table that reached only the eager row does not hide an older compiled one), eager where none has;
    another card's table is not used."""
    from umst_tools import batch_table

    def row(arch, words_per_s, compiled=True):
        return dict(arch=arch, stock=False, precision="bf16", compiled=compiled, max_tokens=38400,
                    words_per_s=words_per_s, target_tokens_per_step=30000.0)

    def write(name, card, started, commit, rows):
        (tmp_path / f"gpu-speed-{name}.json").write_text(json.dumps(
            dict(card=card, started=started, commit=commit, max_tokens=[38400], rows=rows)))

    # the newer table stopped before MSC's compiled row and measured MSMSA eager only
    write("h200-old", "NVIDIA H200", "2026-11-29 22:07:50 UTC", "old1234",
          [row("umst_base", 100000.0), row("transformer_sf_base", 50000.0), row("msc_base", 90000.0, False),
           row("msc_base", 150000.0)])
    write("h200-new", "NVIDIA H200", "2026-12-04 10:26:46 UTC", "new5678",
          [row("umst_base", 200000.0), row("msc_base", 80000.0, False), row("msmsa_base", 70000.0, False)])
    write("a100-older", "NVIDIA A100", "2026-11-01 00:00:00 UTC", "a100aaa", [row("msmsa_base", 1.0)])

    def line(config):
        return next(l for l in batch_table.cards_markdown(results_dir=str(tmp_path)).splitlines()
                    if f"`{config}`" in l)

    def hours(config, words_per_s):
        b = batch_table.row_batch(os.path.join(e2e.ROOT, "configs", f"{config}.yaml"))
        return b["max_update"] * (b["tokens_per_update"] * 30000 / 38400) / words_per_s / 3600

    assert line("umst-t2-umst-base").endswith(f"| {hours('umst-t2-umst-base', 200000.0):,.1f} | "
                                              f"{hours('umst-t2-umst-base', 8 * 200000.0):,.1f} | `new5678` |")
    sf = line("sf-t1-transformer-sf-base")
    assert sf.endswith(f"| {hours('sf-t1-transformer-sf-base', 50000.0):,.1f} | "
                       f"{hours('sf-t1-transformer-sf-base', 8 * 50000.0):,.1f} | `old1234` |"), sf
    msc = line("msc-t4-msc-6l-base")  # the older table's compiled row, not the newer one's eager row
    assert msc.endswith(f"| {hours('msc-t4-msc-6l-base', 150000.0):,.1f} | not measured at 8,192 tokens per card | "
                        "`old1234` |"), msc
    msmsa = line("umst-t2-msmsa-base")  # no table has it compiled on the H200: the eager row
    assert msmsa.endswith(f"| {hours('umst-t2-msmsa-base', 70000.0):,.1f} | "
                          f"{hours('umst-t2-msmsa-base', 8 * 70000.0):,.1f} | `new5678` |"), msmsa
    assert line("umst-t2-msmsa-big").endswith("| not measured | not measured | - |")  # the big width: none measured it


def test_a_row_measured_at_its_recipes_shape_is_that_recipes_and_not_the_archs_defaults(tmp_path):
    """The speed table measures prime_base twice: at its own 12+12 layers of d 384 and at UMST's MUSE shape (6+6,
    d 512: ``umst-t2-muse-base``). Each config takes the words/s of its own shape: the MUSE config the row whose
    command line sets that shape, ``prime-t2-prime-base`` (the arch's defaults) the other."""
    from benchmarks import harness
    from umst_tools import batch_table

    arch, muse = harness.model_overrides("prime_muse")
    muse_argv = ["--arch", arch, *harness.overrides_to_argv(muse)]
    rows = [dict(arch="prime_base", stock=False, precision="bf16", compiled=True, max_tokens=38400,
                 argv=["--arch", "prime_base", "--dropout", "0.4"], words_per_s=100000.0,
                 target_tokens_per_step=30000.0),
            dict(arch="prime_base", stock=False, precision="bf16", compiled=True, max_tokens=38400, argv=muse_argv,
                 words_per_s=200000.0, target_tokens_per_step=30000.0)]
    (tmp_path / "gpu-speed-nvidia-h200-abc.json").write_text(json.dumps(
        dict(card="NVIDIA H200", started="2026-12-01", max_tokens=[38400, 4096], rows=rows)))
    (card, record), = batch_table.speed_records(str(tmp_path))

    def hours(row, words_per_s):
        b = batch_table.row_batch(os.path.join(e2e.ROOT, "configs", f"{row}.yaml"))
        expected = b["max_update"] * (b["tokens_per_update"] * 30000 / 38400) / words_per_s / 3600
        return batch_table.row_hours(b, record, 1), expected

    got, expected = hours("umst-t2-muse-base", 200000.0)
    assert got is not None and abs(got - expected) < 1e-9
    got, expected = hours("prime-t2-prime-base", 100000.0)
    assert got is not None and abs(got - expected) < 1e-9
    assert hours("umst-t2-muse-big", 1.0)[0] is None  # d 1024 was not measured


def test_a_shape_key_left_unset_takes_what_the_arch_derives_from_the_keys_set():
    """fairseq's transformer derives the decoder's width from the encoder's where it is not set: a config that sets
    only ``encoder_embed_dim: 1024`` is the model of a row measured with both widths at 1024, not of one whose
    decoder stayed at 512; a row that sets a key to its default is the default model."""
    from umst_tools import batch_table

    def row(*argv):
        return dict(arch="transformer", argv=["--arch", "transformer", *argv])

    wide = {"encoder_embed_dim": 1024, "encoder_ffn_embed_dim": 4096}
    assert batch_table._same_shape(wide, row("--encoder-embed-dim", "1024", "--decoder-embed-dim", "1024",
                                             "--encoder-ffn-embed-dim", "4096", "--decoder-ffn-embed-dim", "4096"))
    assert not batch_table._same_shape(wide, row("--encoder-embed-dim", "1024", "--decoder-embed-dim", "512",
                                                 "--encoder-ffn-embed-dim", "4096"))
    assert batch_table._same_shape({}, row("--decoder-embed-dim", "512", "--encoder-layers", "6"))
    assert not batch_table._same_shape({}, row("--encoder-layers", "12"))
    assert batch_table._same_shape({"decoder_layers": 6}, row())
