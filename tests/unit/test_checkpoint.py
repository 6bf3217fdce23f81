"""CheckpointManager in one process: round trips, atomicity, fallback, keep-k, export, async."""

import logging
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.api import CheckpointException

from torchtitan.checkpoint import (  # noqa: E402
    CheckpointError,
    CheckpointManager,
    ModelState,
    OptimizerState,
    SafeFileSystemReader,
    SafeLoadPlanner,
    TrainState,
    read_state_names,
    save_seed_checkpoint,
)
from torchtitan.checkpoint.resume_changes import optimizer_changes  # noqa: E402
from torchtitan.config import (  # noqa: E402
    ASSETS,
    Checkpoint,
    ConfigError,
    LRScheduler,
    Optimizer,
    parse_args,
)
from torchtitan.data import Tokenizer, build_dataloader  # noqa: E402
from torchtitan.experimental.compiled_adamw import CompiledAdamW  # noqa: E402
from torchtitan.models.llama3 import ModelArgs, Transformer  # noqa: E402
from torchtitan.optim import build_lr_scheduler, build_optimizer  # noqa: E402
from torchtitan.parallel.activation_checkpoint import apply_ac  # noqa: E402
from torchtitan.parallel.compile import apply_compile  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

SEQ_LEN = 16
ARGS = ModelArgs(dim=64, n_layers=2, n_heads=4, vocab_size=4096, multiple_of=32, max_seq_len=16)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(ASSETS / "tokenizer.model")


class Job:
    """A tiny training run: model, AdamW, LambdaLR, (optionally) the real data loader."""

    def __init__(
        self,
        seed: int,
        tokenizer: Tokenizer | None = None,
        optimizer: Optimizer | None = None,
        compiled_adamw: bool = False,
    ):
        torch.manual_seed(seed)
        self.model = Transformer(ARGS)
        self.model.init_weights()
        optimizer = optimizer or Optimizer(lr=1e-2)
        # The compiled update is a CUDA switch; the device only gates it, the kernel runs on CPU.
        device = "cuda" if compiled_adamw else "cpu"
        self.optimizer = build_optimizer(self.model.parameters(), optimizer, device, compiled_adamw)
        self.scheduler = build_lr_scheduler(self.optimizer, 100, LRScheduler(warmup_steps=3))
        self.loader = None
        if tokenizer is not None:
            self.loader = build_dataloader(
                "sample", tokenizer, SEQ_LEN, local_batch_size=2, dp_rank=0, dp_world_size=1
            )
        self.data = iter(self.loader) if self.loader is not None else None
        self.train_state = TrainState()
        self.inputs: list[torch.Tensor] = []

    def manager(self, dump_folder: Path, **options) -> CheckpointManager:
        cfg = Checkpoint(**{"enable": True, "interval": 1, **options})
        cfg.validate()
        return CheckpointManager(
            cfg,
            dump_folder,
            model_parts=[self.model],
            optimizers=[self.optimizer],
            lr_schedulers=[self.scheduler],
            dataloader=self.loader,
            train_state=self.train_state,
        )

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.data is not None:
            return next(self.data)
        g = torch.Generator().manual_seed(self.train_state.step)
        window = torch.randint(0, ARGS.vocab_size, (2, SEQ_LEN + 1), generator=g)
        return window[:, :-1], window[:, 1:]

    def train(self, steps: int) -> list[float]:
        losses = []
        for _ in range(steps):
            inputs, labels = self.batch()
            self.inputs.append(inputs)
            loss = F.cross_entropy(self.model(inputs).flatten(0, 1), labels.flatten())
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.train_state.step += 1
            self.train_state.tokens_seen += labels.numel()
            losses.append(loss.item())
        return losses

    def train_and_save(self, manager: CheckpointManager, steps: int) -> None:
        """Train ``steps`` steps, saving a checkpoint after each one."""
        for _ in range(steps):
            self.train(1)
            manager.save(self.train_state.step)

    def params(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


def assert_same_tensors(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=0, msg=key)


def optimizer_tensors(job: Job) -> dict[str, torch.Tensor]:
    state = job.optimizer.state_dict()["state"]
    return {f"{i}.{k}": v.clone() for i, s in state.items() for k, v in s.items()}


def one_line(error: Exception) -> str:
    text = str(error)
    assert text and "\n" not in text, text
    return text


# --------------------------------------------------------------------------- round trips


def test_resume_restores_model_optimizer_lr_data_and_train_state(tmp_path, tokenizer):
    a = Job(0, tokenizer)
    manager = a.manager(tmp_path, interval=3)
    a.train(2)
    assert not manager.save(2)  # not due
    a.train(1)
    assert manager.save(3)
    manager.close()
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == ["step-3"]
    params, moments, lr = a.params(), optimizer_tensors(a), a.scheduler.get_last_lr()
    tokens_seen = a.train_state.tokens_seen
    expected_losses = a.train(2)

    b = Job(1, tokenizer)
    assert b.manager(tmp_path).load() == 3
    assert b.train_state.step == 3 and b.train_state.tokens_seen == tokens_seen
    assert_same_tensors(b.params(), params)
    assert_same_tensors(optimizer_tensors(b), moments)
    assert b.scheduler.get_last_lr() == lr
    assert b.optimizer.param_groups[0]["lr"] == lr[0]
    b.data = iter(b.loader)  # the iterator must be re-created after loading
    assert b.train(2) == expected_losses  # bit-identical continuation
    for x, expected in zip(b.inputs, a.inputs[3:], strict=True):
        assert torch.equal(x, expected)


def since_the_checkpoint(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "since the checkpoint" in r.getMessage()]


def test_resume_keeps_this_runs_optimizer_settings_and_the_checkpoints_moments(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="torchtitan")
    a = Job(0)
    manager = a.manager(tmp_path, interval=2)
    a.train_and_save(manager, 2)
    moments = optimizer_tensors(a)
    assert Job(1).manager(tmp_path).load() == 2
    assert since_the_checkpoint(caplog) == []  # the same settings: nothing to report

    b = Job(1, optimizer=Optimizer(lr=1e-2, weight_decay=0.05, eps=1e-6))
    assert b.manager(tmp_path).load() == 2
    for group in b.optimizer.param_groups:
        assert group["weight_decay"] == 0.05 and group["eps"] == 1e-6
        assert group["betas"] == (0.9, 0.95) and group["foreach"]
        assert group["lr"] == b.scheduler.get_last_lr()[0]
    assert_same_tensors(optimizer_tensors(b), moments)
    assert since_the_checkpoint(caplog) == [
        "optimizer.eps changed 1e-08 -> 1e-06, optimizer.weight_decay changed 0.1 -> 0.05 since "
        "the checkpoint: the optimizer uses the new settings from step 3; its moments (exp_avg, "
        "exp_avg_sq, step) continue from the checkpoint"
    ]


def test_a_checkpoint_resumes_under_the_compiled_optimizer_kernel(tmp_path):
    """Same state layout: a foreach run's checkpoint continues under the compiled update (which
    keeps its own kernel flags) as the foreach run itself continues, to fp32 rounding."""
    a = Job(0)
    a.train_and_save(a.manager(tmp_path, interval=2), 2)
    moments = optimizer_tensors(a)
    expected = a.train(2)
    b = Job(1, optimizer=Optimizer(lr=1e-2), compiled_adamw=True)
    assert b.manager(tmp_path).load() == 2
    assert isinstance(b.optimizer, CompiledAdamW)
    assert b.optimizer.param_groups[0]["capturable"] and not b.optimizer.param_groups[0]["foreach"]
    assert_same_tensors(optimizer_tensors(b), moments)
    assert b.train(2) == pytest.approx(expected, rel=1e-5)


def test_optimizer_changes_name_the_options_and_skip_the_lr_and_kernel_flags():
    saved = {"lr": 1e-3, "initial_lr": 1e-3, "betas": (0.9, 0.95), "fused": False, "eps": 1e-8}
    current = {"lr": 2e-3, "initial_lr": 2e-3, "betas": (0.9, 0.99), "fused": True, "eps": 1e-8}

    def flat(entries: dict) -> dict:  # as flatten_optimizer_state_dict keys them, per parameter
        fqns = ("a.weight", "b.weight")
        return {f"param_groups.{fqn}.{k}": v for fqn in fqns for k, v in entries.items()}

    changes = optimizer_changes(flat(saved), flat(current))
    assert changes == "optimizer.beta2 changed 0.95 -> 0.99"  # once, not once per parameter


def test_fqns_are_clean_under_compile_and_activation_checkpointing():
    plain = Job(0)
    wrapped = Job(0)
    apply_ac(wrapped.model, "full")
    apply_compile(wrapped.model)  # wraps only; nothing compiles without a forward
    raw = set(wrapped.model.state_dict())
    assert any("_orig_mod" in k or "_checkpoint_wrapped_module" in k for k in raw)
    model_keys = set(ModelState([wrapped.model]).state_dict())
    assert model_keys == set(plain.model.state_dict())
    optim_keys = OptimizerState([wrapped.model], [wrapped.optimizer]).state_dict()
    assert all("_orig_mod" not in k and "_checkpoint_wrapped" not in k for k in optim_keys)
    assert "state.layers.0.attention.wq.weight.exp_avg" in optim_keys


def test_async_save_round_trip_and_background_write_is_isolated(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="torchtitan")
    a = Job(0)
    manager = a.manager(tmp_path, async_mode="async")
    a.train(1)
    manager.save(1)
    step1 = (a.params(), optimizer_tensors(a))
    a.train(1)  # updates parameters and moments in place while step 1 may still be written
    manager.save(2)  # finishes step 1 first
    assert (tmp_path / "checkpoint" / "step-1" / ".metadata").is_file()
    step2 = (a.params(), optimizer_tensors(a))
    manager.close()
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == ["step-1", "step-2"]
    assert "writing to" in caplog.text and "blocked" in caplog.text

    for step, expected in ((1, step1), (2, step2)):
        b = Job(1)
        assert b.manager(tmp_path, load_step=step).load() == step
        assert_same_tensors(b.params(), expected[0])
        assert_same_tensors(optimizer_tensors(b), expected[1])


def test_pinned_memory_mode_falls_back_without_cuda(tmp_path, caplog):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: pinned staging is used")
    a = Job(0)
    manager = a.manager(tmp_path, async_mode="async_with_pinned_mem")
    assert manager.async_mode == "async"
    assert "using async_mode=async" in caplog.text
    a.train(1)
    manager.save(1)
    manager.close()
    assert (tmp_path / "checkpoint" / "step-1" / ".metadata").is_file()


# --------------------------------------------------------------------------- atomicity, fallback


def test_incomplete_folders_are_never_loaded_and_only_ours_are_cleaned(tmp_path, caplog):
    a = Job(0)
    manager = a.manager(tmp_path)
    a.train(2)
    manager.save(2)
    expected = a.params()
    folder = tmp_path / "checkpoint"
    shutil.copytree(folder / "step-2", folder / "step-7.tmp")  # complete, but never renamed
    shutil.copytree(folder / "step-2", folder / "step-9")
    (folder / "step-9" / ".metadata").unlink()  # a crash before DCP wrote the metadata
    (folder / "notes").mkdir()

    b = Job(1)
    bm = b.manager(tmp_path)
    assert bm.load() == 2
    assert_same_tensors(b.params(), expected)
    assert "ignoring incomplete checkpoint folders" in caplog.text
    assert "step-7.tmp, step-9" in caplog.text

    b.train(1)
    bm.save(3)
    assert not (folder / "step-7.tmp").exists()  # our own leftover: removed
    assert (folder / "step-9").is_dir() and (folder / "notes").is_dir()  # not ours: kept
    assert sorted(p.name for p in folder.iterdir()) == ["notes", "step-2", "step-3", "step-9"]


def test_step_folder_that_is_not_a_checkpoint_is_moved_aside_never_overwritten(tmp_path, caplog):
    a = Job(0)
    (tmp_path / "checkpoint" / "step-1").mkdir(parents=True)
    (tmp_path / "checkpoint" / "step-1" / "mine.txt").write_text("keep me")
    assert a.manager(tmp_path).save(1)
    assert "(not a complete checkpoint): moved it aside to step-1.stale-" in caplog.text
    (aside,) = (tmp_path / "checkpoint").glob("step-1.stale-*")
    assert (aside / "mine.txt").read_text() == "keep me"
    assert (tmp_path / "checkpoint" / "step-1" / ".metadata").is_file()


def test_corrupted_latest_falls_back_to_the_previous_step(tmp_path, caplog):
    a = Job(0)
    manager = a.manager(tmp_path, interval=2)
    a.train(2)
    manager.save(2)
    expected, expected_moments = a.params(), optimizer_tensors(a)
    a.train(2)
    manager.save(4)
    manager.close()
    shard = next((tmp_path / "checkpoint" / "step-4").glob("*.distcp"))
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)

    b = Job(1)
    assert b.manager(tmp_path).load() == 2
    assert "checkpoint step-4 could not be loaded" in caplog.text
    assert "falling back to step-2" in caplog.text
    assert_same_tensors(b.params(), expected)
    assert_same_tensors(optimizer_tensors(b), expected_moments)

    with pytest.raises(CheckpointError, match="checkpoint step-4 could not be loaded") as error:
        Job(1).manager(tmp_path, load_step=4).load()
    one_line(error.value)


def test_resuming_from_an_earlier_step_moves_the_later_ones_aside_at_the_first_save(
    tmp_path, caplog
):
    a = Job(0)
    manager = a.manager(tmp_path)
    a.train_and_save(manager, 2)
    a_step2 = a.params()
    a.train_and_save(manager, 1)
    folder = tmp_path / "checkpoint"
    b = Job(1)
    bm = b.manager(tmp_path, load_step=1)
    assert bm.load() == 1
    assert sorted(p.name for p in folder.iterdir()) == ["step-1", "step-2", "step-3"]  # not yet
    b.model.output.weight.data.add_(1.0)  # a different branch of training
    b.train(1)
    bm.save(2)
    (warning,) = [r.getMessage() for r in caplog.records if "load_step" in r.getMessage()]
    assert warning.startswith(
        "resumed from step-1 (--checkpoint.load_step) while later steps existed: moved step-2, "
        "step-3 aside to step-2.stale-"
    )
    c = Job(2)
    assert c.manager(tmp_path).load() == 2  # the resumed branch's step, not the old step-3
    assert_same_tensors(c.params(), b.params())
    names = sorted(p.name for p in folder.iterdir())
    assert names[:2] == ["step-1", "step-2"] and len(names) == 4
    assert names[2].startswith("step-2.stale-") and names[3].startswith("step-3.stale-")
    assert names[3] in warning
    d = Job(3)  # the earlier branch's step-2, preserved aside, still loads
    assert d.manager(tmp_path, enable=False, initial_load_path=str(folder / names[2])).load() == 0
    assert_same_tensors(d.params(), a_step2)


# --------------------------------------------------------------------------- retention, export


def test_keep_latest_k_deletes_older_steps_but_keeps_the_seed(tmp_path):
    a = Job(0)
    save_seed_checkpoint(a.model, tmp_path / "checkpoint" / "step-0")
    manager = a.manager(tmp_path, keep_latest_k=2)
    a.train_and_save(manager, 4)
    manager.close()  # waits for the background deletions
    names = sorted(p.name for p in (tmp_path / "checkpoint").iterdir())
    assert names == ["step-0", "step-3", "step-4"]


def test_last_save_model_only_exports_weights_in_export_dtype(tmp_path, caplog):
    a = Job(0)
    manager = a.manager(tmp_path, interval=100, last_save_model_only=True, export_dtype="bfloat16")
    a.train(2)
    assert manager.save(2, last_step=True)
    path = tmp_path / "checkpoint" / "step-2"
    assert read_state_names(path) == {"model"}
    metadata = SafeFileSystemReader(str(path)).read_metadata().state_dict_metadata
    assert {m.properties.dtype for m in metadata.values()} == {torch.bfloat16}
    assert set(metadata) == {f"model.{k}" for k in a.model.state_dict()}

    b = Job(1)
    assert b.manager(tmp_path).load() == 2  # weights only; the rest starts fresh
    assert "holds model weights only" in caplog.text
    expected = {k: v.to(torch.bfloat16).float() for k, v in a.params().items()}
    assert_same_tensors(b.params(), expected)
    assert b.optimizer.state_dict()["state"] == {}


def test_seed_checkpoint_is_a_model_only_step_zero(tmp_path):
    a = Job(0)
    save_seed_checkpoint(a.model, tmp_path / "checkpoint" / "step-0")
    with pytest.raises(ConfigError, match="already exists"):
        save_seed_checkpoint(a.model, tmp_path / "checkpoint" / "step-0")
    b = Job(1)
    assert b.manager(tmp_path).load() == 0
    assert_same_tensors(b.params(), a.params())


def test_exclude_from_loading(tmp_path, tokenizer):
    a = Job(0, tokenizer)
    manager = a.manager(tmp_path)
    a.train(3)
    manager.save(3)
    lr = a.scheduler.get_last_lr()

    b = Job(1, tokenizer)
    bm = b.manager(tmp_path, exclude_from_loading=["optimizer", "dataloader"])
    assert bm.load() == 3
    assert_same_tensors(b.params(), a.params())
    assert b.optimizer.state_dict()["state"] == {}  # not restored
    assert b.scheduler.get_last_lr() == lr and b.optimizer.param_groups[0]["lr"] == lr[0]
    assert torch.equal(next(iter(b.loader))[0], a.inputs[0])  # the data starts over

    c = Job(2)
    assert c.manager(tmp_path, exclude_from_loading=["train_state"]).load() == 0


def test_initial_load_path(tmp_path):
    a = Job(0)
    seed = save_seed_checkpoint(a.model, tmp_path / "seed")
    b = Job(1)
    assert b.manager(tmp_path / "run", enable=False, initial_load_path=str(seed)).load() == 0
    assert_same_tensors(b.params(), a.params())

    full = a.manager(tmp_path / "other")
    a.train(2)
    full.save(2)
    c = Job(2)
    cm = c.manager(
        tmp_path / "run",
        initial_load_path=str(tmp_path / "other" / "checkpoint" / "step-2"),
        initial_load_model_only=False,
    )
    assert cm.load() == 2
    assert_same_tensors(optimizer_tensors(c), optimizer_tensors(a))

    # A checkpoint in the run's own folder wins over initial_load_path.
    d = Job(3)
    d.train(1)
    d.manager(tmp_path / "run").save(1)
    e = Job(4)
    em = e.manager(tmp_path / "run", initial_load_path=str(seed))
    assert em.load() == 1
    assert_same_tensors(e.params(), d.params())


# --------------------------------------------------------------------------- safety, errors

CALLS: list[str] = []


def _record(text: str) -> None:
    CALLS.append(text)


class Planted:
    def __reduce__(self):
        return (_record, ("ran",))


def test_nothing_is_unpickled_beyond_weights_only(tmp_path, caplog):
    CALLS.clear()
    path = tmp_path / "planted"
    dcp.save({"obj": {"x": Planted()}}, checkpoint_id=str(path))
    with pytest.raises(CheckpointException, match="Unsupported global"):
        dcp.load(
            {"obj": {"x": None}},
            storage_reader=SafeFileSystemReader(str(path)),
            planner=SafeLoadPlanner(),
        )
    assert CALLS == []

    a = Job(0)
    manager = a.manager(tmp_path)
    a.train_and_save(manager, 2)
    (tmp_path / "checkpoint" / "step-2" / ".metadata").write_bytes(pickle.dumps(Planted()))
    assert Job(1).manager(tmp_path).load() == 1
    assert "not a DCP metadata type" in caplog.text
    assert CALLS == []


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--checkpoint.async_mode=thread"], "async_mode must be one of"),
        (["--checkpoint.export_dtype=fp8"], "export_dtype must be one of"),
        (["--checkpoint.interval=0"], "interval must be positive"),
        (["--checkpoint.keep_latest_k=-1"], "keep_latest_k must be >= 0"),
        (["--checkpoint.enable", "--checkpoint.load_step=-2"], "load_step must be"),
        (["--checkpoint.load_step=3"], "load_step needs --checkpoint.enable"),
        (["--checkpoint.exclude_from_loading=optimizer,model"], "exclude_from_loading must be"),
    ],
)
def test_config_errors_are_one_line(argv, expected):
    with pytest.raises(ConfigError, match=expected) as error:
        parse_args(argv)
    one_line(error.value)


def test_config_fields_parse():
    cfg = parse_args(
        [
            "--checkpoint.enable",
            "--checkpoint.exclude_from_loading=dataloader,lr_scheduler",
            "--checkpoint.async_mode=async_with_pinned_mem",
        ]
    ).checkpoint
    assert cfg.enable and cfg.exclude_from_loading == ["dataloader", "lr_scheduler"]


def test_load_errors_are_one_line(tmp_path):
    a = Job(0)
    manager = a.manager(tmp_path)
    a.train(2)
    manager.save(2)
    with pytest.raises(CheckpointError, match=r"no complete checkpoint step-5 .*steps: 2\)") as e:
        Job(1).manager(tmp_path, load_step=5).load()
    one_line(e.value)
    with pytest.raises(ConfigError, match="initial_load_path /nope does not exist") as e:
        Job(1).manager(tmp_path / "x", enable=False, initial_load_path="/nope").load()
    one_line(e.value)
    for shard in (tmp_path / "checkpoint" / "step-2").glob("*.distcp"):
        shard.write_bytes(b"")
    with pytest.raises(CheckpointError, match="could not be loaded") as e:
        Job(1).manager(tmp_path).load()
    one_line(e.value)
