"""A Python iterator of batches as fit's data (docs/python.md, "An iterator of batches"): a C batch
source that calls back into Python for each batch."""
import threading

import numpy as np
import pytest

import dtrain

QUIET = dict(threads=1, logdir="", summary_dir="", steps_to_validate=1000)


def _batches(x, y, b, steps):
    for i in range(steps):
        j = (i * b) % (len(x) - b)
        yield x[j:j + b], y[j:j + b]


def test_iterator_equals_train_step_loop(fashion, tiny_model):
    """fit over an iterator trains bit for bit as train_step over the same batches (each a step of
    dtrain train), uint8 and float32 batches alike, and tests on test=."""
    x, y, tx, ty, _ = fashion
    flags = dict(batch_size=16, seed=4, learning_rate=0.01, **QUIET)
    loop = dtrain.Model(tiny_model, **flags)
    for bx, by in _batches(x, y, 16, 25):
        loop.train_step(bx, by)
    for xs in (x, (x / np.float32(255)).astype(np.float32)):
        m = dtrain.Model(tiny_model, **flags)
        res = m.fit(_batches(xs, y, 16, 25), test=(tx, ty), train_steps=25)
        assert res["steps"] == 25 and res["test_examples"] == 256
        assert m.get_params().tobytes() == loop.get_params().tobytes()


def test_iterator_errors(fashion, tiny_model):
    """An iterator that ends early, a bad batch, or one that raises: fit raises that, naming it."""
    x, y, tx, ty, _ = fashion
    m = dtrain.Model(tiny_model, batch_size=16, **QUIET)
    with pytest.raises(ValueError, match="ended after 3 batches"):
        m.fit(_batches(x, y, 16, 3), test=(tx, ty), train_steps=10)
    with pytest.raises(ValueError, match="more than batch_size 16"):
        m.fit(_batches(x, y, 32, 3), test=(tx, ty), train_steps=10)
    with pytest.raises(ValueError, match="batch y\\[0\\] is 10"):
        m.fit(iter([(x[:16], np.full(16, 10))]), test=(tx, ty), train_steps=10)

    def boom():
        yield x[:16], y[:16]
        raise KeyError("pipeline broke")
    with pytest.raises(KeyError, match="pipeline broke"):
        m.fit(boom(), test=(tx, ty), train_steps=10)
    with pytest.raises(ValueError, match="needs test="):
        m.fit(_batches(x, y, 16, 3), train_steps=10)
    with pytest.raises(dtrain.DtrainError, match="train_steps"):
        m.fit(_batches(x, y, 16, 3), test=(tx, ty))


def test_iterator_from_a_pipeline_thread(fashion, tiny_model):
    """A producer thread feeding a queue trains while C runs (the GIL released between batches)."""
    import queue
    x, y, tx, ty, _ = fashion
    q = queue.Queue(maxsize=4)

    def produce():
        for b in _batches(x, y, 16, 30):
            q.put(b)
    threading.Thread(target=produce, daemon=True).start()
    m = dtrain.Model(tiny_model, batch_size=16, **QUIET)
    res = m.fit(iter(q.get, None), test=(tx, ty), train_steps=30)
    assert res["steps"] == 30
