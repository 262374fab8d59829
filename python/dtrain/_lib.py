"""Loading libdtrain and declaring the C functions the package calls (include/dtrain.h).

ctypes releases the GIL for every call through a CDLL, so a Python data thread runs beside
training. Nothing here mirrors a C struct: options go by flag name, arrays as pointers.
"""
import ctypes
import ctypes.util
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


class DtrainError(RuntimeError):
    """A libdtrain call failed; str() is dtrain's message, .code its DT_E* code."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class Stopped(DtrainError):
    """Training stopped early (dt_options_stop, Ctrl-C or a callback): .code DT_EINTR. Uncaught in the
    main thread, it ends the script as a stop ends `dtrain train`: one line `dtrain: <message>` on
    stderr (none more after fit's Ctrl-C line) and exit status 130 (.exit_status), after atexit's
    handlers and with the buffers flushed (the package's sys.excepthook)."""

    exit_status = 130

    def __init__(self, code, message):
        super().__init__(code, message)
        self.reported = False  # fit said it already (its Ctrl-C line)


DT_EINTR = -9


def _candidates():
    env = os.environ.get("DTRAIN_LIBRARY")
    if env:
        return [env]  # named: nothing else is tried, so a wrong path is not hidden
    out = []
    # A source checkout: python/dtrain/ beside build/ (or build-asan/ for the sanitizer build).
    root = os.path.dirname(os.path.dirname(_HERE))
    for build in ("build", "build-asan"):
        out.append(os.path.join(root, build, "libdtrain.so"))
    # Where `make install` put the package: _install.py names the library folder.
    try:
        from . import _install  # written by cmake --install
        out.append(os.path.join(_install.LIBDIR, "libdtrain.so"))
    except ImportError:
        pass
    found = ctypes.util.find_library("dtrain")
    if found:
        out.append(found)
    return out


def _load():
    # libgomp reads its wait policy once, as it loads (with libdtrain, below): passive, as the dtrain
    # command sets it, so its threads sleep when they wait instead of spinning against other work
    # (docs/memory-layout.md, "Sharing cores"). A policy the user set is kept.
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "passive"
    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError("dtrain: libdtrain.so not found; build it (make) or install it (make install), or set "
                      "DTRAIN_LIBRARY to its path. Tried: " + "; ".join(tried or ["nothing"]))


lib, path = _load()


class Error(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("msg", ctypes.c_char * 1024)]


class TrainResult(ctypes.Structure):
    """dt_train_result: the one struct the package reads; its layout is the public header's."""
    _fields_ = [("steps", ctypes.c_int64), ("final_loss", ctypes.c_double),
                ("validation_accuracy", ctypes.c_double), ("test_accuracy", ctypes.c_double),
                ("test_loss", ctypes.c_double), ("test_examples", ctypes.c_int64),
                ("seconds", ctypes.c_double), ("examples_per_sec", ctypes.c_double),
                ("bad_images", ctypes.c_int64), ("start_step", ctypes.c_int64),
                ("test_auc", ctypes.c_double), ("test_logloss", ctypes.c_double)]


P = ctypes.c_void_p
I, I64, SZ, F, D = ctypes.c_int, ctypes.c_int64, ctypes.c_size_t, ctypes.c_float, ctypes.c_double
S = ctypes.c_char_p
E = ctypes.POINTER(Error)
STEP_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, P, ctypes.c_int64, ctypes.c_double, ctypes.c_double)
LOG_LINE = ctypes.CFUNCTYPE(None, P, ctypes.c_char_p)
BATCH_SOURCE = ctypes.CFUNCTYPE(ctypes.c_int, P, ctypes.c_int, ctypes.POINTER(P), ctypes.POINTER(I),
                                ctypes.POINTER(P), ctypes.POINTER(I))

_SIGNATURES = {
    "dt_version": (S, []),
    "dt_options_new": (I, [ctypes.POINTER(P), E]),
    "dt_options_free": (None, [P]),
    "dt_options_set": (I, [P, S, S, E]),
    "dt_options_get": (I, [P, S, ctypes.c_char_p, SZ, E]),
    "dt_options_set_arrays": (I, [P, I, P, I, P, I64, I, I, I, E]),
    "dt_clicks_new": (I, [ctypes.POINTER(P), I64, P, I, P, I, P, P, P, I64, E]),
    "dt_clicks_free": (None, [P]),
    "dt_options_set_clicks": (I, [P, P, E]),
    "dt_options_set_batches": (None, [P, BATCH_SOURCE, P]),
    "dt_options_set_callback": (None, [P, STEP_CALLBACK, P, I64]),
    "dt_options_set_params_out": (None, [P, P, SZ]),
    "dt_options_stop": (None, [P]),
    "dt_options_set_log": (None, [P, LOG_LINE, P]),
    "dt_options_train": (I, [P, P, ctypes.POINTER(TrainResult), E]),
    "dt_model_new": (I, [ctypes.POINTER(P), P, E]),
    "dt_model_free": (None, [P]),
    "dt_model_input_shape": (None, [P, ctypes.POINTER(I), ctypes.POINTER(I), ctypes.POINTER(I)]),
    "dt_model_num_classes": (I, [P]),
    "dt_model_max_batch": (I, [P]),
    "dt_model_global_step": (I64, [P]),
    "dt_model_param_count": (SZ, [P]),
    "dt_model_get_params": (I, [P, P, SZ, E]),
    "dt_model_set_params": (I, [P, P, SZ, E]),
    "dt_model_train_step": (I, [P, P, I, P, I, ctypes.POINTER(F), ctypes.POINTER(I), E]),
    "dt_model_predict": (I, [P, P, I, I64, P, E]),
    "dt_model_evaluate": (I, [P, P, I, P, I64, ctypes.POINTER(D), ctypes.POINTER(D), E]),
    "dt_model_click_shape": (I, [P, ctypes.POINTER(I), ctypes.POINTER(I)]),
    "dt_model_train_step_clicks": (I, [P, P, ctypes.POINTER(F), ctypes.POINTER(I), E]),
    "dt_model_predict_clicks": (I, [P, P, P, P, E]),
    "dt_model_evaluate_clicks": (I, [P, P, ctypes.POINTER(D), ctypes.POINTER(D), ctypes.POINTER(D),
                                     ctypes.POINTER(D), E]),
    "dt_model_distribute": (I, [P, ctypes.POINTER(I), E]),
    "dt_model_finish": (I, [P, E]),
    "dt_model_save": (I, [P, S, I, E]),
    "dt_model_restore": (I, [P, S, E]),
}
for _name, (_res, _args) in _SIGNATURES.items():
    _f = getattr(lib, _name)
    _f.restype, _f.argtypes = _res, _args


def call(fn, *args):
    """fn(*args, &err); raises DtrainError (Stopped for DT_EINTR) with dtrain's message."""
    err = Error()
    rc = fn(*args, ctypes.byref(err))
    if rc < 0:
        msg = err.msg.decode("utf-8", "replace") or "error %d" % rc
        raise (Stopped if rc == DT_EINTR else DtrainError)(rc, msg)
    return rc
