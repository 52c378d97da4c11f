"""The bench's table as a reader sees it: built from result dicts of the bench schema, no row
trained (the figures are made up; what is checked is what the table says about them)."""

import os

import pytest
from rich.console import Console

from fasttrain import report
from fasttrain.errors import UserError


def rendered(result: dict) -> str:
    console = Console(width=250, record=True)
    console.print(report.bench_table(result))
    return " ".join(console.export_text().split())  # wrapping apart


def row(impl: str, epoch_ms: float, reps: int) -> dict:
    return {"impl": impl, "status": "ok", "reason": None, "device": "cpu", "precision": "fp32",
            "report_ms": None, "epoch_ms": epoch_ms, "epoch_ms_repeat_min": epoch_ms,
            "epoch_ms_repeat_max": epoch_ms, "epoch_ms_min": epoch_ms,
            "epoch_ms_max": epoch_ms, "setup_ms": 1.0, "test_accuracy": 0.9, "test_loss": 0.3,
            "repeats": [{}] * reps}


def result(epochs: int = 20, repeats: int = 3, interrupted: bool = False) -> dict:
    return {"env": {}, "rows": [row("numpy-cpu", 80.0, repeats)],
            "config": {"data": "mnist", "epochs": epochs, "batch_size": 128, "lr": 0.1,
                       "repeats": repeats, "interrupted": interrupted}}


def test_the_caption_says_the_latter_half_mean():
    text = rendered(result())
    assert "latter-half epoch mean" in text and "warm-up" not in text
    assert "INTERRUPTED" not in text


def test_one_epoch_is_said_to_include_its_warm_up():
    """One epoch has no latter half: its figure is that epoch, first-call costs and all."""
    text = rendered(result(epochs=1))
    assert "latter-half" not in text
    assert "warm-up included" in text and "--epochs 2" in text


def test_an_interrupted_bench_says_so_in_its_title():
    """The title's repeat count is what was asked, not what ran."""
    text = rendered(result(interrupted=True))
    assert "INTERRUPTED" in text.split("┏")[0]


def test_the_plot_keeps_the_reports_figure_of_a_row_that_cannot_run_here():
    """On a CPU the CUDA rows are unavailable: their bars stay (the report's, grey) and say
    why ours is missing; a row with no figure from either side is left out."""
    res = result()
    res["rows"] += [
        {**row("cuda-baseline", 0.0, 0), "status": "unavailable", "reason": "no CUDA GPU",
         "device": "cuda", "report_ms": 38.0},
        {**row("torch-graphs", 0.0, 0), "status": "unavailable", "reason": "no CUDA GPU",
         "device": "cuda"},
    ]
    bars = {b["impl"]: b for b in report.plot_bars(res)}
    assert list(bars) == ["numpy-cpu", "cuda-baseline"]
    assert bars["numpy-cpu"]["ours"] == 80.0 and bars["numpy-cpu"]["note"] is None
    assert bars["cuda-baseline"]["ours"] is None and bars["cuda-baseline"]["theirs"] == 38.0
    assert bars["cuda-baseline"]["note"] == "unavailable here"


def test_the_plot_is_written_with_a_row_that_cannot_run_here(tmp_path):
    res = result()
    res["rows"].append({**row("cuda-baseline", 0.0, 0), "status": "unavailable",
                        "reason": "no CUDA GPU", "device": "cuda", "report_ms": 38.0})
    report.bench_plot(res, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_folder_that_refuses_new_files_is_refused_before_any_work(tmp_path):
    """os.access says yes to root everywhere, /proc included: the bench then ran to its end
    and lost its result at the write. Only creating a file there tells."""
    with pytest.raises(UserError, match="--json /proc/r.json: not writable"):
        report.check_outputs(("/proc/r.json", "--json"))
    report.check_outputs((tmp_path / "r.json", "--json"))  # a writable folder passes...
    assert list(tmp_path.iterdir()) == []  # ...and is left as it was


def test_an_import_path_in_a_table_is_printed_as_typed(capsys):
    # `fasttrain experiment scaling --model pkg.mod:factory` wrote "pkg.mod🏭 parameters": rich
    # read ":factory:" of "pkg.mod:factory: parameters" as an emoji code.
    table = report.rows_table("t", [("model", lambda r: r["model"])],
                              [{"model": "pkg.mod:factory"}],
                              caption="pkg.mod:factory: parameters counted")
    report.wide_console().print(table)
    out = capsys.readouterr().out
    assert "pkg.mod:factory:" in out.split("┘")[1]  # the caption, after the table
