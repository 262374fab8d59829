"""dtrain from Python: `dtrain train`'s options, numpy arrays in and out (docs/python.md).

    import dtrain
    m = dtrain.Model("models/fashion.model", batch_size=64, seed=1)
    loss, acc = m.train_step(x, y)           # one step on a numpy batch
    run = m.fit(x, y, test=(xt, yt), epochs=1) # `dtrain train` on arrays (alone or a cluster task)
    logits = m.predict(xt)

Options are `dtrain train`'s flags by name (dtrain.flags() lists them), checked by its own table.
Arrays are float32 NHWC (used as they are) or uint8 (scaled by 1/255 as dtrain scales pixels);
labels integers. Bad arrays raise ValueError naming the argument before any C call; a C error
raises DtrainError with dtrain's message. The GIL is released while C works.
"""
import atexit
import ctypes
import logging
import os
import signal
import sys
import threading

import numpy as np

from . import _lib
from ._lib import DtrainError, Stopped
from .checkpoint import load_checkpoint, read_safetensors

__all__ = ["Model", "Options", "Clicks", "DtrainError", "Stopped", "load_checkpoint", "read_safetensors", "parse_args",
           "version", "train"]


def _exit_stopped():
    """The end of a script that Stopped ended: every other atexit handler, the buffers, then the CLI's
    status. Python exits 1 after an uncaught exception whatever its hook does, so this handler, the
    first to run (the last registered), runs the others itself and leaves with os._exit."""
    atexit.unregister(_exit_stopped)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(Stopped.exit_status)


def _excepthook(kind, value, tb, previous=sys.excepthook):
    if isinstance(value, Stopped):  # one line, as `dtrain train` ends on a stop, and its status
        if not value.reported:
            print("dtrain: %s" % value, file=sys.stderr, flush=True)
        atexit.register(_exit_stopped)
        return
    previous(kind, value, tb)


sys.excepthook = _excepthook


def version():
    return _lib.lib.dt_version().decode()


def _text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


class Options:
    """`dtrain train`'s flags (names without dashes, underscores), starting at its defaults."""

    def __init__(self, **flags):
        h = ctypes.c_void_p()
        _lib.call(_lib.lib.dt_options_new, ctypes.byref(h))
        self._h = h
        self._keep = []  # arrays and the callback the C side points to while it runs
        self.set(**flags)

    def set(self, **flags):
        for name, value in flags.items():
            if value is None:
                continue
            _lib.call(_lib.lib.dt_options_set, self._h, name.encode(), _text(value).encode())
        return self

    def get(self, name):
        buf = ctypes.create_string_buffer(4096)
        _lib.call(_lib.lib.dt_options_get, self._h, name.encode(), buf, len(buf))
        return buf.value.decode()

    def stop(self):
        """Stops a fit running on these options (from another thread or a signal handler)."""
        _lib.lib.dt_options_stop(self._h)

    def __del__(self):
        h = getattr(self, "_h", None)
        if h:
            _lib.lib.dt_options_free(h)
            self._h = None


def parse_args(argv=None):
    """Takes `dtrain train`'s flags (--name=value or --name value; the cluster's --ps_hosts,
    --worker_hosts, --job_name, --task_index, --issync... as `dtrain launch` passes them) out of argv
    (default sys.argv[1:]); returns (flags dict, the other arguments in order)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    probe, flags, rest, i = Options(), {}, [], 0
    while i < len(argv):
        a = argv[i]
        name = a[2:].split("=", 1)[0] if a.startswith("--") and len(a) > 2 else None
        current = None
        if name:
            try:
                current = probe.get(name)
            except DtrainError:
                pass
        if current is None:
            rest.append(a)
        elif "=" in a:
            flags[name] = a.split("=", 1)[1]
        elif current in ("true", "false") and (i + 1 >= len(argv) or argv[i + 1] not in ("0", "1", "true", "false")):
            flags[name] = "true"  # a bare boolean flag, as the CLI reads it
        elif i + 1 < len(argv):
            flags[name] = argv[i + 1]
            i += 1
        else:
            raise ValueError("--%s needs a value" % name)
        i += 1
    return flags, rest


def _check_images(x, name, shape):
    """x as the C side takes it: a C-contiguous float32 or uint8 array [n, h, w, c] ([n, h, w] when
    c is 1), finite. Returns (array, dtype code, n). Never copies."""
    if not isinstance(x, np.ndarray):
        raise ValueError("%s must be a numpy array, got %s" % (name, type(x).__name__))
    if x.dtype == np.float32:
        code = 0
    elif x.dtype == np.uint8:
        code = 1
    else:
        raise ValueError("%s must be float32 (NHWC, used as is) or uint8 (scaled by 1/255), got %s" % (name, x.dtype))
    h, w, c = shape
    if not (x.shape[1:] == (h, w, c) or (c == 1 and x.shape[1:] == (h, w))) or x.ndim < 3:
        raise ValueError("%s must have shape (n, %d, %d, %d), got %s" % (name, h, w, c, x.shape))
    if x.shape[0] < 1:
        raise ValueError("%s holds no examples" % name)
    if not x.flags["C_CONTIGUOUS"]:
        raise ValueError("%s must be C-contiguous (np.ascontiguousarray(%s) makes a copy that is)" % (name, name))
    if code == 0:  # NaN or infinity: chunked, so a memmap larger than memory is scanned, not loaded
        flat = x.reshape(-1)
        step = 1 << 24
        for i in range(0, flat.size, step):
            if not np.isfinite(flat[i:i + step]).all():
                bad = i + int(np.flatnonzero(~np.isfinite(flat[i:i + step]))[0])
                raise ValueError("%s holds %r at flat index %d" % (name, float(flat[bad]), bad))
    return x, code, x.shape[0]


def _check_labels(y, name, n, classes):
    if not isinstance(y, np.ndarray):
        y = np.asarray(y)
    if y.dtype.kind not in "iu":
        raise ValueError("%s must be integers, got %s" % (name, y.dtype))
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError("%s must have shape (%d,) to match x, got %s" % (name, n, y.shape))
    if n and (y.min() < 0 or y.max() >= classes):
        bad = int(np.flatnonzero((y < 0) | (y >= classes))[0])
        raise ValueError("%s[%d] is %d, out of range 0..%d (the model's classes)" % (name, bad, int(y[bad]), classes - 1))
    # int32 as C reads them; a copy only when the caller's are another integer type
    return np.ascontiguousarray(y, dtype=np.int32)


def _ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


_CHUNK = 1 << 22  # checks scan big arrays in chunks: a memmap larger than memory is read, not loaded


def _chunks(a):
    for i in range(0, a.shape[0], _CHUNK):
        yield i, a[i:i + _CHUNK]


def _array(a, name, dtypes, ndim):
    if not isinstance(a, np.ndarray):
        raise ValueError("%s must be a numpy array, got %s" % (name, type(a).__name__))
    if a.dtype not in dtypes:
        raise ValueError("%s must be %s, got %s" % (name, " or ".join(str(np.dtype(d)) for d in dtypes), a.dtype))
    if a.ndim != ndim:
        raise ValueError("%s must have %d dimension%s, got shape %s" % (name, ndim, "s"[:ndim > 1], a.shape))
    if not a.flags["C_CONTIGUOUS"]:
        raise ValueError("%s must be C-contiguous (np.ascontiguousarray(%s) makes a copy that is)" % (name, name))
    return a


def _finite(a, name):
    flat = a.reshape(-1)
    for i, c in _chunks(flat):
        ok = np.isfinite(c)
        if not ok.all():
            bad = i + int(np.flatnonzero(~ok)[0])
            raise ValueError("%s holds %r at flat index %d" % (name, float(flat[bad]), bad))


class Clicks:
    """A click log as numpy arrays, for a click-log model (input dense=N fields=M): row i is a click
    log's line i + 1, so training, validation and test rows and the workers' shards are those of the
    same lines in a file (docs/ctr-data.md). Arrays in memory or numpy.memmap, read in place.

    labels   [n] 0/1 (integers, bool or float; handed to C as float32: a copy of n floats)
    ids      [n, fields] one id per field, or [nnz] with offsets (unsigned or non-negative int64
             used in place; other integer types copied to uint64)
    offsets  [n * fields + 1] int64, non-decreasing: row i field f's ids are
             ids[offsets[i*fields + f]:offsets[i*fields + f + 1]] (several: a multi-valued field;
             none: missing); needs fields=
    dense    [n, num_dense] float32, as the model takes them (no log(1 + x) here), or None
    values   [nnz] float32 weights of the ids (None: 1)
    """

    def __init__(self, labels, ids, offsets=None, dense=None, values=None, fields=None):
        labels = np.asarray(labels) if not isinstance(labels, np.ndarray) else labels
        if labels.ndim != 1 or labels.dtype.kind not in "biuf":
            raise ValueError("labels must be a vector of 0/1 numbers, got %s %s" % (labels.dtype, labels.shape))
        n = labels.shape[0]
        if n < 1:
            raise ValueError("labels holds no examples")
        for i, c in _chunks(labels):
            bad = (c != 0) & (c != 1)
            if bad.any():
                k = i + int(np.flatnonzero(bad)[0])
                raise ValueError("labels[%d] is %r, not 0 or 1" % (k, labels[k].item()))
        self.labels = np.ascontiguousarray(labels, dtype=np.float32)
        ids = _array(ids, "ids", (np.uint64, np.int64, np.int32, np.uint32), 1 if offsets is not None else 2)
        if ids.dtype.kind == "i":
            for i, c in _chunks(ids.reshape(-1)):
                if (c < 0).any():
                    k = i + int(np.flatnonzero(c < 0)[0])
                    raise ValueError("ids holds %d at flat index %d: ids are unsigned" % (int(c[k - i]), k))
        self.ids = ids.view(np.uint64) if ids.dtype == np.int64 else np.ascontiguousarray(ids, dtype=np.uint64)
        if offsets is None:
            if ids.shape[0] != n:
                raise ValueError("ids must have shape (%d, fields) to match labels, got %s" % (n, ids.shape))
            self.fields, self.offsets = ids.shape[1], None
            if fields is not None and fields != self.fields:
                raise ValueError("fields=%d but ids has %d columns" % (fields, self.fields))
        else:
            if fields is None:
                raise ValueError("offsets need fields= (the number of fields per row)")
            self.fields = int(fields)
            off = _array(offsets, "offsets", (np.int64,), 1)
            if off.shape[0] != n * self.fields + 1:
                raise ValueError("offsets must have n * fields + 1 = %d entries, got %d" % (n * self.fields + 1, off.shape[0]))
            if off[0] < 0 or off[-1] > ids.shape[0]:
                raise ValueError("offsets run from %d to %d, outside the %d ids" % (off[0], off[-1], ids.shape[0]))
            for i, c in _chunks(off[:-1]):
                d = off[i + 1:i + 1 + c.shape[0]] - c
                if (d < 0).any():
                    k = i + int(np.flatnonzero(d < 0)[0])
                    raise ValueError("offsets decrease at %d (%d then %d)" % (k, off[k], off[k + 1]))
            self.offsets = off
        if self.fields < 1:
            raise ValueError("ids must hold at least one field")
        if dense is None:
            self.dense = None
        else:
            self.dense = _array(dense, "dense", (np.float32,), 2)
            if self.dense.shape[0] != n:
                raise ValueError("dense must have %d rows to match labels, got %d" % (n, self.dense.shape[0]))
            _finite(self.dense, "dense")
        if values is not None:
            values = _array(values, "values", (np.float32,), 1)
            if values.shape[0] != self.ids.size:
                raise ValueError("values must have one per id (%d), got %d" % (self.ids.size, values.shape[0]))
            _finite(values, "values")
        self.values = values
        self.n = n
        self.num_dense = 0 if self.dense is None else self.dense.shape[1]
        self._handle()

    def _handle(self):
        null = ctypes.c_void_p()
        h = ctypes.c_void_p()
        _lib.call(_lib.lib.dt_clicks_new, ctypes.byref(h), self.n, _ptr(self.labels), self.num_dense,
                  _ptr(self.dense) if self.dense is not None else null, self.fields,
                  _ptr(self.offsets) if self.offsets is not None else null, _ptr(self.ids),
                  _ptr(self.values) if self.values is not None else null, self.ids.size)
        self._h = h  # the C handle points into the arrays above, which this object keeps

    def __del__(self):
        h = getattr(self, "_h", None)
        if h:
            _lib.lib.dt_clicks_free(h)
            self._h = None

    def __len__(self):
        return self.n

    def __getitem__(self, rows):
        """Rows start:stop (a slice, step 1) as a Clicks over the same arrays: labels, dense and the
        offsets (or one-per-field ids) are views of these; ids and values are shared whole (the
        offsets index them). Row i of the slice is row start + i here."""
        if not isinstance(rows, slice):
            raise TypeError("Clicks takes a slice of rows (clicks[i:j]), got %s" % type(rows).__name__)
        start, stop, step = rows.indices(self.n)
        if step != 1:
            raise ValueError("Clicks slices rows with step 1, got %d" % step)
        if stop <= start:
            raise ValueError("clicks[%d:%d] holds no rows" % (start, stop))
        # Checked already as parts of these arrays: not scanned again (a step's slice costs no pass
        # over a memmap's ids or values).
        F, v = self.fields, object.__new__(Clicks)
        v.labels, v.fields, v.values, v.n, v.num_dense = self.labels[start:stop], F, self.values, stop - start, self.num_dense
        v.dense = None if self.dense is None else self.dense[start:stop]
        if self.offsets is None:
            v.ids, v.offsets = self.ids[start:stop], None
        else:
            v.ids, v.offsets = self.ids, self.offsets[start * F:stop * F + 1]
        v._handle()
        return v

    def _set(self, opts):
        """Hands the arrays to opts (pointers: they must live while opts trains)."""
        _lib.call(_lib.lib.dt_options_set_clicks, opts._h, self._h)


class Model:
    """A model file with `dtrain train`'s options: trained step by step on this machine
    (train_step, evaluate, predict, save, restore), or by fit, which is `dtrain train` on arrays:
    alone, or this task's role in a cluster (the flags, or TF_CONFIG)."""

    def __init__(self, model, log=True, **flags):
        self._running = None  # the Options of a fit under way (stop() reaches it)
        self.flags = dict(flags, model=model)
        self.options = Options(**self.flags)
        # What the model's own C calls log (a cluster worker's waits and faults): as fit's log=.
        self._log = _log_sink(log)
        _lib.lib.dt_options_set_log(self.options._h, self._log, None)
        h = ctypes.c_void_p()
        _lib.call(_lib.lib.dt_model_new, ctypes.byref(h), self.options._h)
        self._h = h
        a, b, c = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        _lib.lib.dt_model_input_shape(h, ctypes.byref(a), ctypes.byref(b), ctypes.byref(c))
        self.input_shape = (a.value, b.value, c.value)
        # A click-log model: (dense features, fields); it steps on dtrain.Clicks, and input_shape is None.
        self.click_shape = None
        if _lib.lib.dt_model_click_shape(h, ctypes.byref(a), ctypes.byref(b)):
            self.click_shape, self.input_shape = (a.value, b.value), None
        self.num_classes = _lib.lib.dt_model_num_classes(h)
        self.max_batch = _lib.lib.dt_model_max_batch(h)
        self.param_count = _lib.lib.dt_model_param_count(h)

    def __del__(self):
        h = getattr(self, "_h", None)
        if h:
            _lib.lib.dt_model_free(h)
            self._h = None

    @property
    def global_step(self):
        return _lib.lib.dt_model_global_step(self._h)

    def get_params(self):
        """The flat parameters (float32 [param_count]), a copy."""
        out = np.empty(self.param_count, np.float32)
        _lib.call(_lib.lib.dt_model_get_params, self._h, _ptr(out), out.size)
        return out

    def set_params(self, params):
        p = np.asarray(params)
        if p.dtype != np.float32 or p.ndim != 1 or p.size != self.param_count or not p.flags["C_CONTIGUOUS"]:
            raise ValueError("params must be a contiguous float32 vector of %d, got %s %s" % (self.param_count, p.dtype, p.shape))
        if not np.isfinite(p).all():
            raise ValueError("params holds NaN or infinity")
        _lib.call(_lib.lib.dt_model_set_params, self._h, _ptr(p), p.size)

    def _clicks(self, x, y=None):
        """x as a click-log model takes it: a dtrain.Clicks (labels inside), of the model's shape."""
        if not isinstance(x, Clicks):
            raise ValueError("x must be a dtrain.Clicks for a click-log model (%d dense features, %d fields), got %s"
                             % (self.click_shape + (type(x).__name__,)))
        if y is not None:
            raise ValueError("y must be None: a dtrain.Clicks holds its labels")
        if (x.num_dense, x.fields) != self.click_shape:
            raise ValueError("x has %d dense features and %d fields, the model takes %d and %d"
                             % ((x.num_dense, x.fields) + self.click_shape))
        return x

    def _takes_clicks(self, x):
        """True for a click-log model; a dtrain.Clicks given to an image model is a ValueError."""
        if self.click_shape is None and isinstance(x, Clicks):
            raise ValueError("x is a dtrain.Clicks, but the model is an image model")
        return self.click_shape is not None

    def train_step(self, x, y=None):
        """One step of `dtrain train` on this batch (n <= batch_size); returns (loss, accuracy).
        A click-log model: x a dtrain.Clicks of n rows (its labels; y None), as a batch of a click
        log's lines."""
        if self._takes_clicks(x):
            x = self._clicks(x, y)
            if x.n > self.max_batch:
                raise ValueError("x holds %d rows, more than batch_size %d (the model's max batch)" % (x.n, self.max_batch))
            loss, correct = ctypes.c_float(), ctypes.c_int()
            _lib.call(_lib.lib.dt_model_train_step_clicks, self._h, x._h, ctypes.byref(loss), ctypes.byref(correct))
            return float(loss.value), correct.value / x.n
        if y is None:
            raise ValueError("y: labels are needed")
        x, code, n = _check_images(x, "x", self.input_shape)
        if n > self.max_batch:
            raise ValueError("x holds %d examples, more than batch_size %d (the model's max batch)" % (n, self.max_batch))
        y = _check_labels(y, "y", n, self.num_classes)
        loss, correct = ctypes.c_float(), ctypes.c_int()
        _lib.call(_lib.lib.dt_model_train_step, self._h, _ptr(x), code, _ptr(y), n, ctypes.byref(loss),
                  ctypes.byref(correct))
        return float(loss.value), correct.value / n

    def predict(self, x, probabilities=False):
        """Logits [n, classes] (softmax probabilities if asked), evaluation mode. A click-log model:
        x a dtrain.Clicks, logits [n] (probabilities: the sigmoid's, as `dtrain predict` writes them)."""
        if self._takes_clicks(x):
            x = self._clicks(x)
            out = np.empty(x.n, np.float32)
            null = ctypes.c_void_p()
            _lib.call(_lib.lib.dt_model_predict_clicks, self._h, x._h, null if probabilities else _ptr(out),
                      _ptr(out) if probabilities else null)
            return out
        x, code, n = _check_images(x, "x", self.input_shape)
        out = np.empty((n, self.num_classes), np.float32)
        _lib.call(_lib.lib.dt_model_predict, self._h, _ptr(x), code, n, _ptr(out))
        if probabilities:
            out = np.exp(out - out.max(axis=1, keepdims=True))
            out /= out.sum(axis=1, keepdims=True)
        return out

    def evaluate(self, x, y=None):
        """(mean loss, accuracy) over labelled examples, evaluation mode. A click-log model: x a
        dtrain.Clicks; a dict of loss, accuracy (at 0.5), auc and logloss, as dtrain train's test."""
        if self._takes_clicks(x):
            x = self._clicks(x, y)
            f = [ctypes.c_double() for _ in range(4)]
            _lib.call(_lib.lib.dt_model_evaluate_clicks, self._h, x._h, *[ctypes.byref(v) for v in f])
            return dict(zip(("loss", "accuracy", "auc", "logloss"), (v.value for v in f)))
        if y is None:
            raise ValueError("y: labels are needed")
        x, code, n = _check_images(x, "x", self.input_shape)
        y = _check_labels(y, "y", n, self.num_classes)
        loss, acc = ctypes.c_double(), ctypes.c_double()
        _lib.call(_lib.lib.dt_model_evaluate, self._h, _ptr(x), code, _ptr(y), n, ctypes.byref(loss), ctypes.byref(acc))
        return loss.value, acc.value

    def distribute(self):
        """This task of the cluster the flags (or TF_CONFIG, or a cluster manager) give, for train_step:
        a worker joins it as `dtrain train`'s workers do (issync, replicas_to_aggregate,
        total_num_replicas, staleness, compression, chunk_kb, overlap, auth...) and each train_step
        is then one of that worker's steps (its gradient to the ps tasks, their parameters back; its
        batches are its own shard); call finish() after the last. A ps task serves here until the
        chief finishes. Returns "alone" (no cluster: nothing changes), "chief", "worker" or "ps"."""
        role = ctypes.c_int()
        _lib.call(_lib.lib.dt_model_distribute, self._h, ctypes.byref(role))
        role = ("alone", "chief", "ps", "worker")[role.value]
        if role == "ps":
            self.fit()  # a ps holds its share of the variables until the chief ends training
        return role

    def finish(self):
        """A cluster worker's end (its last exchange settled, the ps tasks told; the chief waits for the
        other workers and shuts the ps tasks down). The model then holds the final parameters."""
        _lib.call(_lib.lib.dt_model_finish, self._h)

    def save(self, logdir, max_to_keep=5):
        """A checkpoint in logdir as `dtrain train` saves one (dtrain eval/predict/export read it)."""
        _lib.call(_lib.lib.dt_model_save, self._h, os.fsencode(logdir), max_to_keep)

    def restore(self, logdir):
        """The newest good checkpoint of logdir; False when there is none."""
        return _lib.call(_lib.lib.dt_model_restore, self._h, os.fsencode(logdir)) == 1

    def fit(self, x=None, y=None, test=None, callback=None, every=100, log=True, **flags):
        """`dtrain train` with this model's flags and these (data=PATH, or the arrays x, y, or x an
        iterator of (x, y) batches with train_steps; test=(x, y) for validation and test, else the
        training arrays). This process's role follows the cluster
        flags or TF_CONFIG: a ps serves until the chief ends training. callback(step, loss, accuracy)
        every `every` steps (return True to stop). log: where `dtrain train`'s log lines go (True:
        sys.stdout as it is then, so a notebook shows them; a file-like object; a logging.Logger, at
        INFO; a function of the line; False: nowhere). Starts as `dtrain train` does: from --logdir's newest
        checkpoint, else from the seed. Returns a dict of the run's figures; on the chief (or alone)
        the model then holds the trained parameters."""
        if self.click_shape is not None or isinstance(x, Clicks):
            raise ValueError("fit trains image models; a click-log model's whole run is dtrain.train(model, clicks=...)")
        opts = Options(**dict(self.flags, **flags))
        keep, errors = [], []
        if x is not None and not isinstance(x, np.ndarray) and y is None and hasattr(x, "__iter__"):
            keep.append(self._source(opts, iter(x), errors))
            if test is None:
                raise ValueError("a batch iterator needs test=(x, y) for validation and test")
            x = None
        elif x is not None and y is None:
            raise ValueError("x without y: give labels, or an iterator of (x, y) batches as x")
        if x is not None:
            x, code, n = _check_images(x, "x", self.input_shape)
            y = _check_labels(y, "y", n, self.num_classes)
            keep += [x, y]
            h, w, c = self.input_shape
            _lib.call(_lib.lib.dt_options_set_arrays, opts._h, 0, _ptr(x), code, _ptr(y), n, h, w, c)
        if test is not None:
            tx, tcode, tn = _check_images(test[0], "test x", self.input_shape)
            ty = _check_labels(test[1], "test y", tn, self.num_classes)
            keep += [tx, ty]
            h, w, c = self.input_shape
            _lib.call(_lib.lib.dt_options_set_arrays, opts._h, 1, _ptr(tx), tcode, _ptr(ty), tn, h, w, c)
        params = np.full(self.param_count, np.nan, np.float32)
        _lib.lib.dt_options_set_params_out(opts._h, _ptr(params), params.size)
        self._running = opts
        try:
            res = _run(opts, keep, callback, every, errors, log)
        finally:
            self._running = None
        if not np.isnan(params[0]):  # the chief or a single process: the trained model
            self.set_params(params)
        return res

    def _source(self, opts, it, errors):
        """The C batch source over a Python iterator of (x, y) batches: each batch checked as
        train_step checks one, float32 handed over in place (uint8 scaled by C), held until the next."""
        held, count = [], [0]

        def source(_user, most, px, pcode, plabels, pn):
            try:
                try:
                    bx, by = next(it)
                except StopIteration:
                    raise ValueError("the batch iterator ended after %d batches, before train_steps" % count[0]) from None
                bx, code, n = _check_images(bx, "batch x", self.input_shape)
                if n > most:
                    raise ValueError("batch x holds %d examples, more than batch_size %d" % (n, most))
                by = _check_labels(by, "batch y", n, self.num_classes)
                held[:] = [bx, by]  # alive until the next call: C reads them in the step
                px[0], pcode[0], plabels[0], pn[0] = bx.ctypes.data, code, by.ctypes.data, n
                count[0] += 1
                return 0
            except BaseException as e:  # raised again by fit: it cannot cross C
                errors.append(e)
                return 1
        cb = _lib.BATCH_SOURCE(source)
        _lib.lib.dt_options_set_batches(opts._h, cb, None)
        return cb

    def stop(self):
        """Stops a fit running in another thread."""
        opts = self._running
        if opts is not None:
            opts.stop()


def _log_writer(log):
    """fit's log= as a function of one line (its newline included)."""
    if log is False or log is None:
        return lambda line: None
    if log is True:
        def write(line):
            sys.stdout.write(line)  # the sys.stdout of each line's time: a notebook's, a redirect's
            sys.stdout.flush()
        return write
    if isinstance(log, logging.Logger):
        return lambda line: log.info("%s", line.rstrip("\n"))
    if hasattr(log, "write"):
        def write_to(line):
            log.write(line)
            if hasattr(log, "flush"):
                log.flush()
        return write_to
    if callable(log):
        return log
    raise ValueError("log must be True (sys.stdout), False, a file-like object, a logging.Logger or a function, got %r"
                     % (log,))


def _log_sink(log):
    """The C log function over _log_writer(log); an exception in it is printed by ctypes and C goes on
    (a log line is not worth a run)."""
    write = _log_writer(log)
    return _lib.LOG_LINE(lambda _user, line: write(line.decode("utf-8", "replace")))


def _run(opts, keep, callback, every, errors=None, log=True):
    """dt_options_train on opts with the step callback, its log lines to log (_log_writer); keep: what
    C points to meanwhile; errors: exceptions a batch source met (raised instead of the C error they
    caused)."""
    errors = [] if errors is None else errors
    sink = _log_sink(log)
    keep.append(sink)
    _lib.lib.dt_options_set_log(opts._h, sink, None)
    if callback is not None:
        def trampoline(_user, step, loss, acc):
            try:
                return 1 if callback(int(step), float(loss), float(acc)) else 0
            except BaseException as e:  # raised again after the C call: it cannot cross C
                errors.append(e)
                return 1
        cb = _lib.STEP_CALLBACK(trampoline)
        keep.append(cb)
        _lib.lib.dt_options_set_callback(opts._h, cb, None, int(every))
    result = _lib.TrainResult()
    outcome = []

    def run():
        try:
            _lib.call(_lib.lib.dt_options_train, opts._h, None, ctypes.byref(result))
        except BaseException as e:
            outcome.append(e)
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C stops training as it stops the CLI: Python runs a signal handler only in the
        # main thread between bytecodes, never inside a C call, so C trains in a thread while
        # this one waits and turns SIGINT into dt_options_stop.
        interrupted = []

        def on_sigint(*_):
            interrupted.append(1)
            opts.stop()
        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            t = threading.Thread(target=run, name="dtrain fit")
            t.start()
            while t.is_alive():
                t.join(0.1)
        finally:
            signal.signal(signal.SIGINT, previous)
        if interrupted and outcome and isinstance(outcome[0], Stopped):  # said as the CLI says it
            print("dtrain: Ctrl-C: %s" % outcome[0], file=sys.stderr, flush=True)
            outcome[0].reported = True
    else:
        run()
    if outcome:
        if errors:  # the callback or the batch source raised: its exception
            raise errors[0]
        raise outcome[0]
    return {f: getattr(result, f) for f, _ in result._fields_}


def train(model, x=None, y=None, clicks=None, **flags):
    """`dtrain train` as a function: Model(model, **flags).fit(x, y, ...) for an image model; for a
    click-log model, clicks=Clicks(...) (or data=PATH of a click log). Returns fit's figures; a
    click-log model's trained state is in --logdir's checkpoint (load_checkpoint)."""
    fit_keys = ("test", "callback", "every", "log")
    fit_args = {k: flags.pop(k) for k in fit_keys if k in flags}
    if clicks is None and x is not None:
        return Model(model, **flags).fit(x, y, **fit_args)
    if x is not None or "test" in fit_args:
        raise ValueError("a click-log model takes clicks=dtrain.Clicks(...), not x, y or test")
    if clicks is not None and not isinstance(clicks, Clicks):
        raise ValueError("clicks must be a dtrain.Clicks, got %s" % type(clicks).__name__)
    opts = Options(model=model, **flags)
    if clicks is not None:
        clicks._set(opts)
    return _run(opts, [clicks], fit_args.get("callback"), fit_args.get("every", 100), log=fit_args.get("log", True))
