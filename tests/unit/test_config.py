from pathlib import Path

import pytest

from torchtitan.config import (
    ActivationCheckpoint,
    ConfigError,
    DecayType,
    JobConfig,
    PipelineSchedule,
    choices,
    help_text,
    parse_args,
    suggest,
)


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
        (["--compile.tune_kernels"], "--compile.tune_kernels needs --compile.enable"),
        (["--training.steps"], "--training.steps needs a value"),
        (["--training.steps", "--compile.enable"], "--training.steps needs a value"),
        (["training.steps", "3"], "unexpected argument"),
        (["--optimizer.name", "SGD"], "--optimizer.name must be one of AdamW, Adam; got 'SGD'"),
        (
            ["--lr_scheduler.decay_type", "cosin"],
            "--lr_scheduler.decay_type must be one of linear, cosine, none; got 'cosin'; "
            "did you mean 'cosine'?",
        ),
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
    with pytest.raises(ConfigError) as info:
        parse_args(["--job.config_file", bad_type])
    assert str(info.value) == f"--training.steps expects int, got 'many' (in {bad_type})"
    bad_choice = write(tmp_path, '[optimizer]\nname = "SGD"\n', "c.toml")
    with pytest.raises(ConfigError, match=r"must be one of AdamW, Adam; got 'SGD' \(in .*c.toml\)"):
        parse_args(["--job.config_file", bad_choice])
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


def test_bare_flag_sets_a_bool_to_true():
    cfg = parse_args(["--compile.enable", "--training.deterministic"])
    assert cfg.compile.enable is True and cfg.training.deterministic is True


def test_unknown_pipeline_schedule_rejected_without_pipeline_parallelism():
    with pytest.raises(ConfigError) as info:
        parse_args(["--parallelism.pipeline_parallel_schedule", "Interleaved1f1b"])
    message = str(info.value)
    assert message.startswith("--parallelism.pipeline_parallel_schedule must be one of GPipe, 1F1B")
    assert message.endswith("got 'Interleaved1f1b'; did you mean 'Interleaved1F1B'?")
    assert parse_args([]).parallelism.pipeline_parallel_degree == 1
    for schedule in choices(PipelineSchedule):
        args = ["--parallelism.pipeline_parallel_schedule", schedule]
        assert parse_args(args).parallelism.pipeline_parallel_schedule == schedule


def test_list_of_choices_is_checked_per_item():
    cfg = parse_args(["--checkpoint.exclude_from_loading", "optimizer,dataloader"])
    assert cfg.checkpoint.exclude_from_loading == ["optimizer", "dataloader"]
    with pytest.raises(ConfigError, match="exclude_from_loading must be one of .*; got 'model'"):
        parse_args(["--checkpoint.exclude_from_loading", "optimizer,model"])


def test_validate_checks_choices_set_in_python():
    cfg = JobConfig()
    cfg.lr_scheduler.decay_type = "cosin"
    with pytest.raises(ConfigError, match="--lr_scheduler.decay_type must be one of linear, cos"):
        cfg.validate()
    cfg = JobConfig()
    cfg.checkpoint.exclude_from_loading = ["train_state", "model"]
    with pytest.raises(ConfigError, match="exclude_from_loading must be one of .*; got 'model'"):
        cfg.validate()
    cfg = JobConfig()
    cfg.parallelism.pipeline_parallel_schedule = "GPipeline"
    with pytest.raises(ConfigError, match="did you mean 'GPipe'"):
        cfg.validate()


def test_section_validate_runs_its_own_checks():
    ActivationCheckpoint(mode="selective", selective_ac_option="2").validate()
    with pytest.raises(ConfigError, match="selective_ac_option must be 'op' or a positive"):
        ActivationCheckpoint(mode="selective", selective_ac_option="0").validate()
    with pytest.raises(ConfigError, match="--activation_checkpoint.mode must be one of none"):
        ActivationCheckpoint(mode="partial").validate()


def test_choices_and_suggest():
    assert choices(DecayType) == ("linear", "cosine", "none")
    with pytest.raises(TypeError):
        choices(str)
    assert suggest("cosin", choices(DecayType)) == "; did you mean 'cosine'?"
    assert suggest("8b", ["debugmodel", "1B", "8B"]) == "; did you mean '8B'?"  # any case
    assert suggest("zzzz", choices(DecayType)) == ""


def test_help_prints_the_allowed_values():
    text = help_text()
    assert '--lr_scheduler.decay_type ("linear")' in text
    assert "(one of: linear, cosine, none)" in text
    assert "(any of: optimizer, lr_scheduler, dataloader, train_state)" in text


def test_help_shows_the_values_the_toml_and_command_line_set(tmp_path, capsys):
    path = tmp_path / "job.toml"
    path.write_text('[training]\nsteps = 7\nseq_len = 128\n[job]\ndescription = "hi"\n')
    with pytest.raises(SystemExit):
        parse_args(["--job.config_file", str(path), "--training.seq_len", "64", "--help"])
    out = capsys.readouterr().out
    assert f"--training.steps 7 (default 10000, from {path})" in out
    assert "--training.seq_len 64 (default 2048, from command line)" in out
    assert f'--job.description "hi" (default "", from {path})' in out
    assert "--training.seed (0)" in out and out.count("usage:") == 1


def test_help_with_a_broken_toml_still_helps(tmp_path, capsys):
    path = tmp_path / "job.toml"
    path.write_text("[training]\nstepz = 7\n")
    with pytest.raises(SystemExit):
        parse_args(["--job.config_file", str(path), "--help"])
    out = capsys.readouterr().out.strip()
    assert "--training.steps (10000)" in out
    assert out.splitlines()[-1].startswith("note: showing defaults only: unknown config key")


def test_missing_config_file_names_the_path_looked_at(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        parse_args(["--job.config_file", "train_configs/debug_model.toml"])
    bundled = Path(__file__).resolve().parents[2] / "train_configs" / "debug_model.toml"
    assert str(e.value) == (
        f"config file not found: {tmp_path}/train_configs/debug_model.toml (from "
        f"'train_configs/debug_model.toml'); the bundled one is {bundled}"
    )


def test_model_shape_overrides():
    from torchtitan.models.llama3 import model_args_from_config

    cfg = parse_args(
        [
            "--model.vocab_size=5000",
            "--model.dim=128",
            "--model.n_layers=3",
            "--model.n_heads=8",
            "--model.n_kv_heads=2",
            "--model.ffn_dim_multiplier=1.5",
            "--model.rope_theta=10000",
            "--training.seq_len=96",
        ]
    )
    args = model_args_from_config(cfg.model, cfg.training.seq_len)
    assert (args.vocab_size, args.dim, args.n_layers, args.n_heads, args.n_kv_heads) == (
        5000,
        128,
        3,
        8,
        2,
    )
    assert (args.ffn_dim_multiplier, args.rope_theta, args.max_seq_len) == (1.5, 10000.0, 96)
    flavor = model_args_from_config(parse_args([]).model, 2048)
    assert (flavor.dim, flavor.vocab_size, flavor.n_layers) == (256, 4096, 6)  # 0 = the flavor's


def test_bad_model_shape_names_the_overrides():
    from torchtitan.models.llama3 import model_args_from_config

    with pytest.raises(
        ValueError, match=r"must be divisible.*\(flavor debugmodel with n_heads=7\)"
    ):
        model_args_from_config(parse_args(["--model.n_heads=7"]).model, 2048)
