"""Qwen3 and MoE options in the job config: what a flavor, an override or a layout the family
cannot run is answered with before any work (preflight, one line)."""

import pytest

from torchtitan.config import parse_args
from torchtitan.models import model_args_from_config
from torchtitan.preflight import main as preflight

QWEN3 = ["--model.name", "qwen3"]
MOE = [*QWEN3, "--model.flavor", "debugmodel_moe"]


def one_line_error(capsys, monkeypatch, argv, world_size=1) -> str:
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    code = preflight(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    "argv, world_size, expected",
    [
        ([*MOE, "--model.moe_top_k", "9"], 1, "top_k 9 is larger than num_experts 8"),
        ([*QWEN3, "--model.moe_aux_loss_coeff", "0.01"], 1, "debugmodel is dense"),
        (["--model.moe_top_k", "2"], 1, "llama3 has none"),
        ([*MOE, "--model.moe_aux_loss_coeff", "-1"], 1, "moe_aux_loss_coeff must be >= 0"),
        ([*MOE, "--parallelism.expert_parallel_degree", "3"], 3, "must divide the 8 experts"),
        ([*QWEN3, "--parallelism.expert_parallel_degree", "2"], 2, "needs a MoE flavor"),
        (["--parallelism.expert_parallel_degree", "2"], 2, "needs a MoE flavor"),
        (
            [*MOE, "--parallelism.expert_parallel_degree", "4"],
            2,
            "must be >= 1 and divide dp_shard x cp x tp = 2",
        ),
        (
            [
                *QWEN3,
                "--model.flavor",
                "debugmodel_tied",
                "--parallelism.pipeline_parallel_degree",
                "2",
            ],
            2,
            "ties its embedding table",
        ),
        ([*QWEN3, "--model.ffn_dim_multiplier", "1.3"], 1, "is a Llama 3 option"),
        ([*QWEN3, "--model.flavor", "30B"], 1, "did you mean '32B'"),
        (
            [*QWEN3, "--checkpoint.initial_load_path", "/x", "--checkpoint.initial_load_in_hf"],
            1,
            "--checkpoint.initial_load_path /x: no config.json in /x",
        ),
    ],
)
def test_bad_qwen3_and_moe_input_is_one_line(capsys, monkeypatch, argv, world_size, expected):
    assert expected in one_line_error(capsys, monkeypatch, argv, world_size)


def test_moe_options_reach_the_routing():
    cfg = parse_args(
        [
            *MOE,
            "--model.moe_top_k=3",
            "--model.moe_balance_bias=false",
            "--model.moe_aux_loss_coeff=0.01",
        ]
    )
    moe = model_args_from_config(cfg.model, 64).moe
    assert (moe.top_k, moe.balance_bias, moe.aux_loss_coeff) == (3, False, 0.01)
    assert model_args_from_config(parse_args(MOE).model, 64).moe.top_k == 2  # the flavor's
