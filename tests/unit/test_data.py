import itertools
import json
import logging
import random
import time
import types
from pathlib import Path

import pyarrow
import pyarrow.parquet
import pytest
import torch

from torchtitan.data import (
    DataError,
    DatasetSource,
    TextDataset,
    TextLoader,
    Tokenizer,
    build_dataloader,
    resolve_source,
)
from torchtitan.data.loader import describe_dataset, resolve_workers
from torchtitan.data.sources import SAMPLE_CORPUS
from torchtitan.data.splits import SAMPLE_VALIDATION_DOCUMENTS

ASSETS = Path(__file__).resolve().parents[2] / "torchtitan" / "assets"
SEQ_LEN = 16


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(ASSETS / "tokenizer.model")


def make_documents(count: int) -> list[str]:
    """Distinct documents of varied length, so distinct windows have distinct contents."""
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi".split()
    rng = random.Random(0)
    return [
        f"doc {d}: " + " ".join(rng.choice(words) for _ in range(rng.randint(2, 40)))
        for d in range(count)
    ]


def write_jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: t, "id": i}) + "\n" for i, t in enumerate(texts)))
    return path


@pytest.fixture
def corpus_path(tmp_path) -> Path:
    return write_jsonl(tmp_path / "docs.jsonl", make_documents(40))


def token_stream(tokenizer: Tokenizer, texts: list[str]) -> list[int]:
    return [t for text in texts for t in tokenizer.encode(text, bos=True, eos=True)]


def take(loader_or_dataset, count: int) -> list:
    return list(itertools.islice(iter(loader_or_dataset), count))


def windows(samples) -> list[list[int]]:
    return [torch.cat([x, y[-1:]]).tolist() for x, y in samples]


def test_packing_matches_concatenated_documents(tokenizer, corpus_path):
    texts = make_documents(40)
    stream = token_stream(tokenizer, texts)
    num_windows = len(stream) // (SEQ_LEN + 1)
    dataset = TextDataset(str(corpus_path), tokenizer, SEQ_LEN, infinite=False)
    samples = list(dataset)
    assert len(samples) == num_windows
    for index, (inputs, labels) in enumerate(samples):
        expected = stream[index * (SEQ_LEN + 1) : (index + 1) * (SEQ_LEN + 1)]
        assert inputs.dtype == labels.dtype == torch.long
        assert inputs.shape == labels.shape == (SEQ_LEN,)
        assert inputs.tolist() == expected[:-1]
        assert labels.tolist() == expected[1:]
    assert stream[0] == tokenizer.bos_id
    assert samples[0][0][0].item() == tokenizer.bos_id


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_dp_split_partitions_global_windows(tokenizer, corpus_path, world_size):
    per_rank = 5
    single = windows(take(TextDataset(str(corpus_path), tokenizer, SEQ_LEN), per_rank * world_size))
    by_rank = [
        windows(take(TextDataset(str(corpus_path), tokenizer, SEQ_LEN, rank, world_size), per_rank))
        for rank in range(world_size)
    ]
    for rank, rank_windows in enumerate(by_rank):
        assert rank_windows == single[rank::world_size]
    union = [w for rank_windows in by_rank for w in rank_windows]
    assert sorted(union) == sorted(single)
    assert len({tuple(w) for w in union}) == len(union)


def loader_batches(spec, tokenizer, count, state=None, world=(0, 1), batch=2, **kwargs):
    loader = build_dataloader(spec, tokenizer, SEQ_LEN, batch, world[0], world[1], **kwargs)
    if state is not None:
        loader.load_state_dict(state)
    iterator = iter(loader)
    batches = [next(iterator) for _ in range(count)]
    return batches, loader.state_dict()


def assert_resumes_exactly(spec, tokenizer, before: int, after: int, **kwargs):
    reference, _ = loader_batches(spec, tokenizer, before + after, **kwargs)
    _, state = loader_batches(spec, tokenizer, before, **kwargs)
    resumed, _ = loader_batches(spec, tokenizer, after, state=state, **kwargs)
    for (x, y), (rx, ry) in zip(reference[before:], resumed, strict=True):
        assert x.shape == (kwargs.get("batch", 2), SEQ_LEN)
        assert torch.equal(x, rx) and torch.equal(y, ry)


def assert_same_batches(expected, actual) -> None:
    for (x, y), (ax, ay) in zip(expected, actual, strict=True):
        assert torch.equal(x, ax) and torch.equal(y, ay)


def global_order(rank_batches) -> list[list[int]]:
    """One step's windows of all ranks in stream order: sample i of rank r is window i*dp + r."""
    per_rank = [windows(zip(*batch)) for batch in rank_batches]
    return [w for samples in zip(*per_rank) for w in samples]


def test_resume_jsonl_exact(tokenizer, corpus_path):
    assert_resumes_exactly(str(corpus_path), tokenizer, before=3, after=4)


def test_resume_across_epoch_boundary(tokenizer, tmp_path, caplog):
    path = write_jsonl(tmp_path / "tiny.jsonl", make_documents(6))
    epoch_tokens = len(token_stream(Tokenizer(ASSETS / "tokenizer.model"), make_documents(6)))
    batches_per_epoch = epoch_tokens // (2 * (SEQ_LEN + 1))
    with caplog.at_level(logging.WARNING, logger="torchtitan.data.text"):
        assert_resumes_exactly(str(path), tokenizer, before=batches_per_epoch - 1, after=4)
        assert_resumes_exactly(str(path), tokenizer, before=batches_per_epoch + 2, after=3)
    assert f"dataset {path} re-looping (epoch 1)" in caplog.messages


def test_resume_txt_source(tokenizer, tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("\n\n".join(make_documents(30)) + "\n")
    assert_resumes_exactly(str(path), tokenizer, before=2, after=3)


def test_resume_parquet_folder(tokenizer, tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    texts = make_documents(40)
    for shard in range(2):
        table = pyarrow.table({"content": texts[shard * 20 : (shard + 1) * 20]})
        pyarrow.parquet.write_table(table, folder / f"part-{shard}.parquet")
    assert_resumes_exactly(str(folder), tokenizer, before=4, after=3, text_field="content")


def test_streaming_source_matches_indexed_and_resumes_across_epochs(tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "tiny.jsonl", make_documents(6))
    source = DatasetSource("stream", builder="json", data_files=(str(path),), streaming=True)
    reference = take(TextDataset(source, tokenizer, SEQ_LEN), 60)
    assert windows(reference) == windows(take(TextDataset(str(path), tokenizer, SEQ_LEN), 60))
    for before in (5, 30):  # one epoch is 25 windows
        first = TextDataset(source, tokenizer, SEQ_LEN)
        take(first, before)
        resumed = TextDataset(source, tokenizer, SEQ_LEN)
        resumed.load_state_dict(first.state_dict())
        assert windows(take(resumed, 60 - before)) == windows(reference[before:])
    assert first.state_dict()["epoch"] >= 1


def test_resume_with_other_dp_world_size(tokenizer, corpus_path):
    spec = str(corpus_path)
    single, _ = loader_batches(spec, tokenizer, 5, batch=4)
    single_windows = [w for x, y in single for w in windows(zip(x, y))]
    _, state = loader_batches(spec, tokenizer, 3, world=(1, 2), batch=2)  # 12 global windows
    by_rank = [
        loader_batches(spec, tokenizer, 2, state, (rank, 4), batch=1)[0] for rank in range(4)
    ]
    for step in range(2):
        step_windows = [windows(zip(*by_rank[rank][step]))[0] for rank in range(4)]
        assert step_windows == single_windows[12 + 4 * step : 16 + 4 * step]


def test_worker_batches_equal_in_process_batches(tokenizer, corpus_path):
    for world_size in (1, 3):
        for rank in range(world_size):
            world = (rank, world_size)
            in_process, _ = loader_batches(str(corpus_path), tokenizer, 6, world=world)
            in_worker, _ = loader_batches(
                str(corpus_path), tokenizer, 6, world=world, num_workers=1
            )
            assert_same_batches(in_process, in_worker)


def test_worker_state_is_last_batch_not_prefetch(tokenizer, corpus_path):
    loader = build_dataloader(str(corpus_path), tokenizer, SEQ_LEN, 2, 1, 2, num_workers=1)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    time.sleep(0.5)  # the worker has read ahead by now
    _, in_process_state = loader_batches(str(corpus_path), tokenizer, 3, world=(1, 2))
    assert loader.state_dict() == in_process_state
    assert loader.windows == 3 * 2 * 2


@pytest.mark.parametrize("save_workers,load_workers", [(1, 1), (1, 0), (0, 1)])
def test_resume_with_workers_exact(tokenizer, corpus_path, save_workers, load_workers):
    spec = str(corpus_path)
    reference, _ = loader_batches(spec, tokenizer, 7, world=(1, 2))
    _, state = loader_batches(spec, tokenizer, 4, world=(1, 2), num_workers=save_workers)
    resumed, _ = loader_batches(spec, tokenizer, 3, state, (1, 2), num_workers=load_workers)
    assert_same_batches(reference[4:], resumed)


@pytest.mark.parametrize("new_world_size", [1, 4])
def test_resume_with_workers_under_other_layout(tokenizer, corpus_path, new_world_size):
    spec = str(corpus_path)
    single, _ = loader_batches(spec, tokenizer, 5, batch=4)
    single_windows = [w for x, y in single for w in windows(zip(x, y))]
    _, state = loader_batches(spec, tokenizer, 3, world=(1, 2), batch=2, num_workers=1)
    batch = 4 // new_world_size
    by_rank = [
        loader_batches(spec, tokenizer, 2, state, (rank, new_world_size), batch, num_workers=1)[0]
        for rank in range(new_world_size)
    ]
    for step in range(2):
        step_windows = global_order([by_rank[rank][step] for rank in range(new_world_size)])
        assert step_windows == single_windows[12 + 4 * step : 16 + 4 * step]


def test_streaming_source_with_worker_resumes_across_epochs(tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "tiny.jsonl", make_documents(6))
    source = DatasetSource("stream", builder="json", data_files=(str(path),), streaming=True)

    def loader(workers: int) -> TextLoader:
        return TextLoader(TextDataset(source, tokenizer, SEQ_LEN), 2, workers, pin_memory=False)

    reference = take(loader(0), 30)  # one epoch is 25 windows: 12.5 batches
    assert_same_batches(reference, take(loader(1), 30))
    for before, save_workers, load_workers in ((4, 1, 0), (14, 0, 1), (14, 1, 1)):
        first = loader(save_workers)
        take(first, before)
        resumed = loader(load_workers)
        resumed.load_state_dict(first.state_dict())
        assert_same_batches(reference[before:], take(resumed, 30 - before))
    assert first.state_dict()["epoch"] == 1


def test_loads_stateful_dataloader_checkpoint_state(tokenizer, corpus_path):
    """Checkpoints written before TextLoader hold torchdata's StatefulDataLoader state."""
    StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader

    old = StatefulDataLoader(
        TextDataset(str(corpus_path), tokenizer, SEQ_LEN),
        batch_size=2,
        num_workers=0,
        collate_fn=lambda samples: tuple(map(torch.stack, zip(*samples))),
        drop_last=True,
    )
    old_batches = iter(old)
    for _ in range(3):
        next(old_batches)
    expected = next(old_batches)
    old_state = old.state_dict()  # after 4 batches
    assert "dataset_state" in old_state
    for workers in (0, 1):
        loader = build_dataloader(
            str(corpus_path), tokenizer, SEQ_LEN, 2, 0, 1, num_workers=workers
        )
        loader.load_state_dict(old_state)
        assert loader.state_dict() == old_state["dataset_state"]
    reference, _ = loader_batches(str(corpus_path), tokenizer, 5)
    assert torch.equal(reference[3][0], expected[0])
    resumed, _ = loader_batches(str(corpus_path), tokenizer, 1, old_state, num_workers=1)
    assert torch.equal(resumed[0][0], reference[4][0])


def test_data_workers_option(tokenizer):
    assert resolve_workers(-1) == (1 if torch.cuda.is_available() else 0)
    assert resolve_workers(0) == 0 and resolve_workers(1) == 1
    with pytest.raises(DataError, match="--training.data_workers 2: use -1"):
        build_dataloader("sample", tokenizer, SEQ_LEN, 2, 0, 1, num_workers=2)


def test_finite_dataset_stops(tokenizer, corpus_path):
    dataset = TextDataset(str(corpus_path), tokenizer, SEQ_LEN, 1, 3, infinite=False)
    stream = token_stream(tokenizer, make_documents(40))
    assert len(list(dataset)) == len(stream) // (3 * (SEQ_LEN + 1))


def test_sample_source_is_fast(tokenizer):
    # CPU time, not wall time: other tests share the CI cores (data_workers 0: all in-process).
    start = time.process_time()
    loader = build_dataloader("sample", tokenizer, 2048, 4, 0, 1)
    iterator = iter(loader)
    inputs, labels = next(iterator)
    first_batch_seconds = time.process_time() - start
    assert inputs.shape == labels.shape == (4, 2048)
    start = time.process_time()
    tokens = sum(next(iterator)[0].numel() for _ in range(40))
    assert first_batch_seconds < 5
    assert tokens / (time.process_time() - start) > 200_000


def test_resolve_named_sources():
    assert resolve_source("sample").data_files == (str(SAMPLE_CORPUS),)
    c4 = resolve_source("c4")
    assert (c4.hub_id, c4.hub_config, c4.split, c4.streaming) == ("allenai/c4", "en", "train", True)
    hub = resolve_source("hf:HuggingFaceFW/fineweb-edu:sample-10BT", text_field="body")
    assert (hub.hub_id, hub.hub_config, hub.text_field) == (
        "HuggingFaceFW/fineweb-edu",
        "sample-10BT",
        "body",
    )
    assert resolve_source("hf:org/name").hub_config is None


def test_resolve_local_sources(tmp_path):
    write_jsonl(tmp_path / "b.jsonl", ["x"])
    write_jsonl(tmp_path / "a.json", ["y"])
    (tmp_path / "README.md").write_text("ignored")
    source = resolve_source(str(tmp_path))
    assert source.builder == "json"
    assert source.data_files == (str(tmp_path / "a.json"), str(tmp_path / "b.jsonl"))
    assert resolve_source(str(tmp_path / "b.jsonl")).streaming is False


def error_message(spec: str, **kwargs) -> str:
    with pytest.raises(DataError) as error:
        resolve_source(spec, **kwargs)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_resolve_source_errors(tmp_path):
    assert (
        error_message(str(tmp_path / "nope.jsonl"))
        == f"dataset path not found: {tmp_path}/nope.jsonl"
    )
    assert "write hf:org/name" in error_message("org/name")
    assert "unknown dataset 'bogus'" in error_message("bogus")
    assert "bad hub dataset spec" in error_message("hf:")
    (tmp_path / "empty.jsonl").touch()
    assert error_message(str(tmp_path / "empty.jsonl")).startswith("dataset file is empty")
    (tmp_path / "data.csv").write_text("text\nhello\n")
    assert "unsupported dataset file extension '.csv'" in error_message(str(tmp_path / "data.csv"))
    (tmp_path / "folder").mkdir()
    assert "dataset folder has no" in error_message(str(tmp_path / "folder"))


def test_mixed_folder_error(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", ["x"])
    (tmp_path / "b.txt").write_text("y\n")
    assert "mixes file kinds (json, text)" in error_message(str(tmp_path))


def test_missing_text_field_errors(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", ["x"], field="body")
    assert error_message(str(path)) == (
        f"text field 'text' not found in {path}; available columns: body, id"
    )
    table_path = tmp_path / "docs.parquet"
    pyarrow.parquet.write_table(pyarrow.table({"content": ["x"]}), table_path)
    assert "available columns: content" in error_message(str(table_path))
    (tmp_path / "notes.txt").write_text("hello\n")
    assert "available columns: text" in error_message(str(tmp_path / "notes.txt"), text_field="x")


def test_dataset_without_documents_errors(tokenizer, tmp_path):
    path = tmp_path / "blank.jsonl"
    path.write_text("\n\n")
    with pytest.raises(DataError, match="empty|no documents|could not load"):
        TextDataset(str(path), tokenizer, SEQ_LEN)


def test_relooping_logs_epochs(tokenizer, tmp_path, caplog):
    path = write_jsonl(tmp_path / "one.jsonl", ["just one short document"])
    dataset = TextDataset(str(path), tokenizer, SEQ_LEN)
    with caplog.at_level(logging.WARNING, logger="torchtitan.data.text"):
        take(dataset, 3)
    assert f"dataset {path} re-looping (epoch 1)" in caplog.messages
    assert dataset.state_dict()["epoch"] >= 2


def test_a_bad_line_past_the_first_is_named_when_loading(tokenizer, tmp_path):
    """Preflight checks the first record only; the loader's error still names file and line
    (not HF's "DatasetGenerationError: An error occurred while generating the dataset")."""
    path = write_jsonl(tmp_path / "docs.jsonl", ["one", "two"])
    with path.open("a") as f:
        f.write('{"text": "three"\n{"text": "four"}\n')
    resolve_source(str(path))  # the first record is fine
    with pytest.raises(DataError) as error:
        TextDataset(str(path), tokenizer, SEQ_LEN)
    assert str(error.value) == (  # the file named once
        f"dataset file {path}, line 3: not valid JSON: Expecting ',' delimiter (column 17)"
    )


def test_relative_paths_in_errors_are_shown_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert error_message("data/nope.jsonl") == (
        f"dataset path not found: {tmp_path}/data/nope.jsonl (from 'data/nope.jsonl')"
    )
    (tmp_path / "empty.jsonl").touch()
    assert error_message("empty.jsonl") == (
        f"dataset file is empty: {tmp_path}/empty.jsonl (from 'empty.jsonl')"
    )


# --------------------------------------------------------------------------- splits


def sample_texts(spec: str) -> list[str]:
    dataset = TextDataset(spec, Tokenizer(ASSETS / "tokenizer.model"), SEQ_LEN)
    return [text for _, text in dataset.documents.read(dataset.documents.start_cursor)]


def test_sample_holds_out_its_last_documents_for_validation():
    corpus = [json.loads(line)["text"] for line in SAMPLE_CORPUS.read_text().splitlines()]
    train, validation = sample_texts("sample"), sample_texts("sample@validation")
    assert len(validation) == SAMPLE_VALIDATION_DOCUMENTS
    assert train == corpus[:-SAMPLE_VALIDATION_DOCUMENTS] == sample_texts("sample@train")
    assert validation == corpus[-SAMPLE_VALIDATION_DOCUMENTS:]
    assert not set(train) & set(validation)


def test_training_on_sample_never_reaches_validation_documents(tokenizer):
    """One epoch of the training stream is exactly the training documents, in order."""
    documents = [tokenizer.encode(t, bos=True, eos=True) for t in sample_texts("sample")]
    expected = [t for doc in documents for t in doc]
    dataset = TextDataset("sample", tokenizer, seq_len=4095, infinite=False)
    stream = [t for inputs, labels in dataset for t in [*inputs.tolist(), labels[-1].item()]]
    assert len(expected) - 4096 < len(stream) <= len(expected)
    assert stream == expected[: len(stream)]


@pytest.mark.parametrize(
    "spec, hub_id, config, split",
    [
        ("c4@validation", "allenai/c4", "en", "validation"),
        ("hf:org/name@test", "org/name", None, "test"),
        ("hf:org/name:cfg@validation", "org/name", "cfg", "validation"),
    ],
)
def test_hub_splits(spec, hub_id, config, split):
    source = resolve_source(spec)
    assert (source.hub_id, source.hub_config, source.split, source.name) == (
        hub_id,
        config,
        split,
        spec,
    )


def test_a_local_path_keeps_its_at_sign(tmp_path):
    path = tmp_path / "data@v2.jsonl"
    write_jsonl(path, ["x"])
    source = resolve_source(str(path))
    assert source.data_files == (str(path),) and source.rows is None


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("sample@test", "the bundled sample has the splits train and validation"),
        ("c4@", "names no split; write c4@SPLIT"),
    ],
)
def test_bad_splits(spec, expected):
    assert expected in error_message(spec)


def test_dataset_sizes_for_the_startup_log(tokenizer, tmp_path):
    loader = build_dataloader("sample@validation", tokenizer, SEQ_LEN, 2, 0, 1)
    assert loader.describe().startswith(
        f"sample@validation: {SAMPLE_VALIDATION_DOCUMENTS} documents, 0."
    )
    write_jsonl(tmp_path / "a.jsonl", ["abc", "de"])
    local = build_dataloader(str(tmp_path / "a.jsonl"), tokenizer, 2, 1, 0, 1)
    assert local.describe().endswith("2 documents, 0.0 MB of text")
    streamed = types.SimpleNamespace(
        source=DatasetSource("c4", hub_id="allenai/c4", streaming=True), documents=None
    )
    assert describe_dataset(streamed).endswith("size unknown")


# ---------------------------------------------------------------- document positions


def expected_positions(tokenizer, texts, join: int, seq_len: int, dp: int, rank: int):
    """Each window's input positions from the token stream: 0 at a window start and at every
    BOS that begins a group of ``join`` documents, +1 otherwise."""
    starts = []
    for d, text in enumerate(texts):
        length = len(tokenizer.encode(text, bos=True, eos=True))
        starts.append(d % join == 0)
        starts.extend([False] * (length - 1))
    window = seq_len + 1
    result = []
    for w in range(len(starts) // window):
        if w % dp != rank:
            continue
        flags = starts[w * window : (w + 1) * window - 1]
        positions, p = [], 0
        for i, start in enumerate(flags):
            p = 0 if i == 0 or start else p + 1
            positions.append(p)
        result.append(positions)
    return result


@pytest.mark.parametrize("join, dp, rank", [(1, 1, 0), (3, 2, 1)])
def test_positions_restart_at_documents_and_windows(tokenizer, corpus_path, join, dp, rank):
    texts = make_documents(40)
    dataset = TextDataset(str(corpus_path), tokenizer, SEQ_LEN, rank, dp, False, join)
    samples = list(dataset.positioned_samples())
    expected = expected_positions(tokenizer, texts, join, SEQ_LEN, dp, rank)
    assert [s[2].tolist() for s in samples] == expected[: len(samples)]
    if join == 1:
        # A document's last token (EOS) is trained to predict the next document's BOS.
        for inputs, labels, positions, _ in samples:
            ends = (positions[1:] == 0).nonzero().flatten()
            assert (inputs[ends] == tokenizer.eos_id).all()
            assert (labels[ends] == tokenizer.bos_id).all()


def test_joined_documents_keep_the_tokens(tokenizer, corpus_path):
    single = list(TextDataset(str(corpus_path), tokenizer, SEQ_LEN, infinite=False))
    joined = list(
        TextDataset(str(corpus_path), tokenizer, SEQ_LEN, infinite=False, join_documents=4)
    )
    assert all(torch.equal(a[0], b[0]) for a, b in zip(single, joined, strict=True))


def test_positions_resume_within_a_joined_group(tokenizer, corpus_path):
    dataset = TextDataset(str(corpus_path), tokenizer, SEQ_LEN, join_documents=3)
    samples = take(dataset.positioned_samples(), 12)
    resumed = TextDataset(str(corpus_path), tokenizer, SEQ_LEN, join_documents=3)
    resumed.load_state_dict(samples[4][3])
    again = take(resumed.positioned_samples(), 7)
    assert [s[2].tolist() for s in again] == [s[2].tolist() for s in samples[5:]]


def test_loader_hands_out_positions_when_asked(tokenizer, corpus_path):
    loader = build_dataloader(str(corpus_path), tokenizer, SEQ_LEN, 2, 0, 1, with_positions=True)
    batch = next(iter(loader))
    assert batch.positions.shape == batch.inputs.shape and batch.positions.dtype == torch.int32
    assert (batch.positions[:, 0] == 0).all()
