import argparse
import dataclasses

import pytest

from fasttrain.engine.config import TrainConfig
from fasttrain.engine.configfile import add_arguments, from_args, load_toml, to_toml
from fasttrain.errors import UserError
from fasttrain.models import MODEL_KINDS


def parse(*argv):
    p = argparse.ArgumentParser()
    add_arguments(p)
    return from_args(p.parse_args(list(argv)))


def test_every_field_has_a_flag_and_a_documented_default():
    p = argparse.ArgumentParser()
    add_arguments(p)
    flags = {a.dest for a in p._actions}
    for f in dataclasses.fields(TrainConfig):
        assert f.name in flags
        assert f.metadata["help"], f.name


def test_flags_override_the_toml_file(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('model = "mlp"\nlr = 0.05\ncompile = true\nbatch_size = 32\n')
    cfg = parse("--config", str(toml), "--lr", "0.2", "--no-compile")
    assert (cfg.model, cfg.lr, cfg.compile, cfg.batch_size) == ("mlp", 0.2, False, 32)


def test_resolved_config_round_trips_through_toml(tmp_path):
    cfg = parse("--model", "gpt", "--data", "synthetic-text", "--precision", "bf16",
                "--out", str(tmp_path))
    path = tmp_path / "config.toml"
    path.write_text(to_toml(cfg))
    assert TrainConfig(**load_toml(path)) == cfg


@pytest.mark.parametrize("text, words", [
    ("nonsense = 1\n", ["unknown key"]),
    ("lr = 'fast'\n", ["lr", "float"]),
    ("compile = 1\n", ["compile", "bool"]),
    ("lr = = 3\n", ["not valid TOML"]),
])
def test_bad_toml_is_a_user_error(tmp_path, text, words):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UserError) as e:
        load_toml(path)
    assert all(w in str(e.value) for w in words)


@pytest.mark.parametrize("kw, fix", [
    (dict(batch_size=100, accum_steps=3), "multiple"),
    (dict(model="mlp", channels_last=True), "--model cnn/resnet"),
    (dict(workers=2, data_on_device="on"), "--data-on-device off"),
    (dict(cuda_graphs=True, data_on_device="off"), "--data-on-device on"),
    (dict(cuda_graphs=True, precision="fp16"), "bf16"),
    (dict(resume="auto"), "--out"),
    (dict(model="gpt", data="mnist"), "tinyshakespeare"),
    (dict(model="cnn", data="tinyshakespeare"), "--model gpt"),
    (dict(lr=float("nan")), "finite"),
    (dict(epochs=0), "≥ 1"),
    (dict(precision="fp8"), "choose one of"),
])
def test_incompatible_or_bad_settings_name_the_fix(kw, fix):
    with pytest.raises(UserError) as e:
        TrainConfig(**kw).validate(MODEL_KINDS)
    assert fix in str(e.value)


def test_each_flag_states_its_default_once():
    """`--data-dir` said '(default: $FASTTRAIN_DATA, then ~/.cache/fasttrain) (default: None)':
    two defaults, the second one false."""
    p = argparse.ArgumentParser()
    add_arguments(p)
    for action in p._actions:
        if action.help and action.dest in {f.name for f in dataclasses.fields(TrainConfig)}:
            assert action.help.count("(default") == 1, action.help
    data_dir = next(a for a in p._actions if a.dest == "data_dir")
    assert "$FASTTRAIN_DATA" in data_dir.help and "None" not in data_dir.help


def test_resuming_a_run_built_in_python_from_the_command_line_names_the_way(tmp_path):
    # fasttrain.build(model=net, data=(x, y), out=DIR) records its objects as "python:..."; the
    # README's `fasttrain train --out DIR --resume auto --epochs 40` on that run failed with
    # "cannot import python (No module named 'python')".
    (tmp_path / "config.toml").write_text('model = "python:Sequential"\ndata = "python:data"\n'
                                          'loss = "python:mse_loss"\n')
    with pytest.raises(UserError) as e:
        parse("--out", str(tmp_path), "--resume", "auto", "--epochs", "40")
    text = str(e.value)
    assert "built in Python" in text and "resume='auto'" in text and "model=python:" in text
