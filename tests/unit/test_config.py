from pathlib import Path

import pytest

from torchtitan.config import ConfigError, JobConfig, help_text, parse_args


def write(tmp_path, text, name="job.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_defaults_without_arguments():
    cfg = parse_args([])
    assert cfg == JobConfig()


def test_cli_forms_and_coercion():
    cfg = parse_args(
        [
            "--training.steps",
            "7",
            "--optimizer.lr=1e-3",
            "--compile.enable",
            "--training.deterministic=yes",
        ]
    )
    assert cfg.training.steps == 7 and isinstance(cfg.training.steps, int)
    assert cfg.optimizer.lr == 1e-3
    assert cfg.compile.enable is True
    assert cfg.training.deterministic is True


def test_precedence_cli_over_toml_over_default(tmp_path):
    path = write(tmp_path, "[training]\nsteps = 5\nseq_len = 64\n[optimizer]\nlr = 0.01\n")
    cfg = parse_args(["--job.config_file", path, "--training.steps", "9"])
    assert cfg.training.steps == 9  # CLI wins
    assert cfg.training.seq_len == 64  # TOML wins over default
    assert cfg.optimizer.lr == 0.01
    assert cfg.training.local_batch_size == JobConfig().training.local_batch_size


def test_config_file_flag_position_does_not_matter(tmp_path):
    path = write(tmp_path, "[training]\nsteps = 5\n")
    cfg = parse_args(["--training.steps", "3", f"--job.config_file={path}"])
    assert cfg.training.steps == 3


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--training.step", "3"], "did you mean 'training.steps'"),
        (["--trainig.steps", "3"], "did you mean 'training.steps'"),
        (["--training.steps", "abc"], "--training.steps expects int, got 'abc'"),
        (["--training.seq_len", "0"], "seq_len must be positive"),
        (["--compile.enable", "maybe"], "expects bool"),
        (["--training.steps"], "expects int, got True"),
        (["training.steps", "3"], "unexpected argument"),
        (["--optimizer.name", "SGD"], "--optimizer.name must be one of AdamW, Adam"),
        (
            ["--job.config_file", "/nonexistent/x.toml"],
            "config file not found: /nonexistent/x.toml",
        ),
    ],
)
def test_cli_errors_are_one_line(argv, expected):
    with pytest.raises(ConfigError) as info:
        parse_args(argv)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


def test_toml_errors(tmp_path):
    bad_key = write(tmp_path, "[training]\nsteeps = 3\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'training.steeps' .*training.steps"):
        parse_args(["--job.config_file", bad_key])
    bad_type = write(tmp_path, '[training]\nsteps = "many"\n', "t.toml")
    with pytest.raises(ConfigError, match="expects int"):
        parse_args(["--job.config_file", bad_type])
    bad_syntax = write(tmp_path, "[training\nsteps = 3\n", "s.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_args(["--job.config_file", bad_syntax])
    top_level = write(tmp_path, "steps = 3\n", "u.toml")
    with pytest.raises(ConfigError, match="unknown config key 'steps'"):
        parse_args(["--job.config_file", top_level])


def test_toml_int_accepted_for_float_but_not_bool_for_int(tmp_path):
    cfg = parse_args(["--job.config_file", write(tmp_path, "[optimizer]\nlr = 1\n")])
    assert cfg.optimizer.lr == 1.0 and isinstance(cfg.optimizer.lr, float)
    with pytest.raises(ConfigError, match="expects int"):
        parse_args(["--job.config_file", write(tmp_path, "[training]\nsteps = true\n", "b.toml")])


def test_effective_config_round_trips_through_toml(tmp_path):
    cfg = parse_args(["--training.steps", "11", "--job.description", 'say "hi"'])
    path = write(tmp_path, cfg.to_toml())
    assert parse_args(["--job.config_file", path]).training == cfg.training
    assert parse_args(["--job.config_file", path]).job.description == 'say "hi"'


def test_help_lists_every_option_with_doc(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--training.steps (10000)" in out
    assert "optimizer steps to train" in out
    assert out.strip() == help_text().strip()


def test_shipped_configs_parse():
    import glob

    root = Path(__file__).resolve().parents[2]
    files = sorted(glob.glob(str(root / "train_configs" / "*.toml")))
    assert len(files) >= 5
    for path in files:
        parse_args(["--job.config_file", path])
