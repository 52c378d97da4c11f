"""Never lose or mix a run: the run directory (rundir.py), metrics.jsonl (metrics_log.py), and
resume settings (resume.py), driven through `fasttrain train` in-process and the modules' own
functions. Runs are tiny (logreg on synthetic data, a few steps)."""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fasttrain.engine import metrics_log, rundir
from fasttrain.engine.checkpoint import complete
from fasttrain.errors import UserError
from tests.conftest import assert_one_line_error, run_cli

BASE = ["train", "--model", "logreg", "--data", "synthetic", "--batch-size", "16",
        "--log-every", "2", "--checkpoint-every", "4", "--device", "cpu", "--no-progress",
        "--seed", "1"]


def train(capsys, out, *extra):
    return run_cli(capsys, *BASE, "--out", str(out), *extra)


def snapshot(out: Path) -> dict[str, bytes]:
    """Every file of a run, by relative path (to show that nothing on disk changed)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != rundir.LOCK}


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 8-step run (checkpoints at 4 and 8), trained once for the module."""
    from fasttrain.cli import main

    out = tmp_path_factory.mktemp("finished") / "run"
    assert main([*BASE, "--out", str(out), "--max-steps", "8"]) == 0
    return out


@pytest.fixture
def run8(finished, tmp_path):
    """A copy of the finished run for one test to change."""
    import shutil

    return Path(shutil.copytree(finished, tmp_path / "run"))


def assert_error_after_start(code, err, *words):
    """A failure found once training runs: the start line, then one error line, exit 2."""
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err, err
    assert len(lines) == 2 and lines[0].startswith("training "), err
    assert_one_line_error(code, lines[1], *words)


# -- reuse, types, lock ---------------------------------------------------------------------------


def test_an_out_holding_a_run_is_refused_without_resume(capsys, run8):
    before = snapshot(run8)
    code, _, err = train(capsys, run8, "--max-steps", "8", "--lr", "0.5")
    assert_one_line_error(code, err, str(run8), "--resume auto", "new --out")
    assert snapshot(run8) == before


def test_an_out_holding_a_run_tells_a_python_caller_its_keyword(tmp_path):
    from fasttrain.errors import UserError

    (tmp_path / "config.toml").write_text("")  # a run's file: the folder holds a run
    with pytest.raises(UserError, match=r"resume='auto' from Python"):
        rundir.claim(tmp_path, resume=False)


@pytest.mark.parametrize("make, words", [
    (lambda out: out.write_text("x"), ["is a file"]),
    (lambda out: (out.mkdir(), (out / "checkpoints").write_text("x")), ["checkpoints"]),
    (lambda out: (out.mkdir(), (out / "metrics.jsonl").mkdir()), ["metrics.jsonl", "folder"]),
    (lambda out: (out.mkdir(), (out / "weights.safetensors").mkdir()), ["weights.safetensors"]),
], ids=["out-is-a-file", "checkpoints-is-a-file", "metrics-is-a-folder", "weights-is-a-folder"])
def test_an_entry_of_the_wrong_type_is_one_line(capsys, tmp_path, make, words):
    out = tmp_path / "run"
    make(out)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, _, err = train(capsys, out, "--max-steps", "2")
    assert_one_line_error(code, err, *words)
    assert sorted(p.name for p in tmp_path.rglob("*") if p.name != rundir.LOCK) == before


def test_a_second_process_is_refused_and_a_killed_one_leaves_no_lock(capsys, tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from fasttrain.engine import rundir; "
         "rundir.claim(sys.argv[1], resume=False); print('held', flush=True); time.sleep(120)",
         str(out)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline().strip() == "held"
        code, _, err = train(capsys, out, "--max-steps", "2")
        assert_one_line_error(code, err, "in use", f"pid {holder.pid}")
    finally:
        holder.kill()  # SIGKILL: no chance to clean up
        holder.wait()
    code, _, err = train(capsys, out, "--max-steps", "2")  # the kernel dropped the lock
    assert code == 0, err


def test_stale_temp_files_are_removed_on_the_next_start(capsys, run8):
    stale = [run8 / "checkpoints" / ".step-00000009.pt.k1.tmp", run8 / ".config.toml.k2.tmp"]
    for p in stale:
        p.write_bytes(b"PK\x03 cut short")
    (run8 / "checkpoints" / ".step-00000010.tmp").mkdir()  # a sharded write's folder
    code, _, err = train(capsys, run8, "--max-steps", "10", "--resume", "auto")
    assert code == 0, err
    assert not [p for p in run8.rglob("*") if p.name.endswith(".tmp")]


def test_every_file_of_a_run_gets_the_same_ordinary_permissions(run8):
    umask = os.umask(0o022)
    os.umask(umask)
    modes = {str(p.relative_to(run8)): p.stat().st_mode & 0o777 for p in run8.rglob("*")
             if p.is_file()}
    assert "checkpoints/step-00000008.pt" in modes and "weights.safetensors" in modes
    assert set(modes.values()) == {0o666 & ~umask}, modes


def test_a_full_disk_is_one_line_and_keeps_every_complete_checkpoint(capsys, tmp_path,
                                                                     monkeypatch):
    from fasttrain.engine import checkpoint

    real_save = torch.save

    def save(state, f, *a, **k):
        if isinstance(state, dict) and state.get("step") == 8:
            f.write(b"PK\x03\x04 half")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(state, f, *a, **k)

    monkeypatch.setattr(checkpoint.torch, "save", save)
    out = tmp_path / "run"
    code, _, err = train(capsys, out, "--max-steps", "12")
    assert_error_after_start(code, err, "disk is full", "step-00000008.pt")
    assert [s for s, _ in complete(out / "checkpoints")] == [4]
    assert not list((out / "checkpoints").glob(".*"))  # no half-written file left behind
    monkeypatch.setattr(checkpoint.torch, "save", real_save)
    code, printed, err = train(capsys, out, "--max-steps", "12", "--resume", "auto")
    assert code == 0 and "step 4)" in printed, err


# -- metrics.jsonl --------------------------------------------------------------------------------


def test_metrics_hold_each_step_once_after_a_resume(capsys, run8):
    # As if killed after logging steps 6 and 8 but before checkpoint 8 was complete:
    (run8 / "checkpoints" / "step-00000008.pt").unlink()
    code, _, err = train(capsys, run8, "--max-steps", "8", "--resume", "auto")
    assert code == 0, err
    train_steps = [r["step"] for r in records(run8) if r["kind"] == "train"]
    assert train_steps == [2, 4, 6, 8]
    evals = [r["step"] for r in records(run8) if r["kind"] == "eval"]
    assert evals == sorted(set(evals))


def test_a_resume_with_no_checkpoint_yet_starts_the_metrics_afresh(capsys, run8):
    import shutil

    shutil.rmtree(run8 / "checkpoints")  # as if killed before its first checkpoint
    (run8 / "weights.safetensors").unlink()  # (written at the end only)
    code, _, err = train(capsys, run8, "--max-steps", "8", "--resume", "auto")
    assert code == 0, err
    assert [r["step"] for r in records(run8) if r["kind"] == "train"] == [2, 4, 6, 8]


def test_a_finished_run_without_checkpoints_is_not_started_over(capsys, run8):
    import shutil

    shutil.rmtree(run8 / "checkpoints")  # deleted to save space: weights and metrics remain
    before = (run8 / "metrics.jsonl").read_text()
    code, _, err = train(capsys, run8, "--max-steps", "8", "--resume", "auto")
    assert code == 2 and "no readable checkpoint" in err
    assert (run8 / "metrics.jsonl").read_text() == before


def test_a_torn_last_line_is_repaired(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "train", "step": 2, "loss": 1.0}\n{"kind": "train", "st')
    assert metrics_log.prepare(path) == 1
    assert path.read_text() == '{"kind": "train", "step": 2, "loss": 1.0}\n'


def test_truncate_keeps_what_the_checkpoint_saw(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"kind": "train", "step": 2}, {"kind": "train", "step": 4},
             {"kind": "eval", "step": 4}, {"kind": "train", "step": 6}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert metrics_log.truncate(path, 2, step=4) == 2  # the eval at 4 came after the checkpoint
    assert metrics_log.truncate(path, None, step=2) == 1  # an older checkpoint: by step


@pytest.mark.parametrize("text", ["garbage\n", '{"kind": "train", "step": 2}\n[1, 2]\n',
                                  "\x00\xff\n" * 3, '{"a": 1}\n'])
def test_a_foreign_metrics_file_is_refused_before_training(capsys, run8, text):
    (run8 / "metrics.jsonl").write_text(text)
    before = snapshot(run8)
    code, _, err = train(capsys, run8, "--max-steps", "10", "--resume", "auto")
    assert_one_line_error(code, err, "metrics.jsonl", "not a fasttrain metrics record")
    assert snapshot(run8) == before


# -- what may change on resume --------------------------------------------------------------------


def test_a_changed_lr_and_length_are_applied_and_recorded(capsys, run8):
    code, printed, err = train(capsys, run8, "--max-steps", "12", "--resume", "auto", "--lr",
                               "0.25", "--grad-clip", "1.0")
    assert code == 0, err
    assert "changed: lr 0.001 → 0.25" in printed, printed
    assert "lr = 0.25" in (run8 / "config.toml").read_text()
    assert "grad_clip = 1.0" in (run8 / "config.toml").read_text()
    lrs = {r["step"]: r["lr"] for r in records(run8) if r["kind"] == "train"}
    assert lrs[8] == pytest.approx(1e-3) and lrs[10] == lrs[12] == pytest.approx(0.25)
    state = torch.load(run8 / "checkpoints" / "step-00000012.pt", weights_only=True)
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.25)


def test_a_setting_that_makes_another_run_is_refused(capsys, run8):
    before = snapshot(run8)
    code, _, err = train(capsys, run8, "--max-steps", "10", "--resume", "auto",
                         "--weight-decay", "0.1")
    assert_one_line_error(code, err, "weight_decay", "new --out")
    assert snapshot(run8) == before


# -- crafted checkpoints --------------------------------------------------------------------------


@pytest.mark.parametrize("damage", [
    lambda s: s.pop("step"),
    lambda s: s.update(step="8"),
    lambda s: s.update(epoch=-1),
    lambda s: s.pop("model"),
    lambda s: s["rng"].pop("torch_cpu"),
    lambda s: s.update(scheduler=[1, 2]),
    lambda s: s["config"].pop("seed"),
], ids=["no-step", "step-a-string", "negative-epoch", "no-model", "no-rng", "bad-scheduler",
        "no-seed"])
def test_a_crafted_checkpoint_is_one_line(capsys, run8, damage):
    path = run8 / "checkpoints" / "step-00000008.pt"
    state = torch.load(path, weights_only=True)
    damage(state)
    torch.save(state, path)
    before = snapshot(run8)
    code, _, err = train(capsys, run8, "--max-steps", "10", "--resume", str(path))
    assert_one_line_error(code, err, str(path))
    assert snapshot(run8) == before


def test_validate_state_names_the_field(run8):
    from fasttrain.engine.resume import validate_state

    state = torch.load(run8 / "checkpoints" / "step-00000008.pt", weights_only=True)
    validate_state(state, "x")
    state["loss_sum"] = 3.0
    with pytest.raises(UserError, match="loss_sum is float"):
        validate_state(state, "x")


def test_resume_takes_the_runs_own_config_and_flags_override_it(capsys, run8):
    """`--out DIR --resume auto --max-steps 10`, no other flag: what makes the run that run
    comes from its config.toml (logreg on synthetic data at batch 16), not the defaults (cnn on
    mnist at 128); its layout does not (a run trained under torchrun resumes in one process)."""
    from fasttrain.cli import main

    config = run8 / "config.toml"
    config.write_text(config.read_text().replace('parallel = "none"', 'parallel = "ddp"'))
    code = main(["train", "--out", str(run8), "--resume", "auto", "--max-steps", "10",
                 "--no-progress", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 0, err
    saved = (run8 / "config.toml").read_text()
    assert 'model = "logreg"' in saved and "batch_size = 16" in saved
    assert "max_steps = 10" in saved and 'parallel = "none"' in saved
    assert [r["step"] for r in records(run8) if r["kind"] == "train"] == [2, 4, 6, 8, 10]
