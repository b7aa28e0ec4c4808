"""``SummaryWriter``: torch's TensorBoard writer (scalars, histograms, text, hyperparameters), with no
dependency beyond numpy: the event files are framed and encoded by ``_records`` (see [Note: event files]).

[Note: summary writer] The API, the directory layout and the summaries follow ``torch.utils.tensorboard``:
``log_dir`` defaults to ``runs/<Mon DD_HH-MM-SS>_<host><comment>``; each writer opens one file
``events.out.tfevents.<time>.<host>.<pid>.<n><suffix>`` that starts with a ``file_version`` event;
``add_scalars`` writes each series to a writer of its own in ``<log_dir>/<main_tag>_<tag>``, and
``add_hparams`` a run in ``<log_dir>/<run_name>``; histograms use torch's bucket limits and its trimming
of empty edges. Unlike torch there is no background thread: events wait in memory until ``max_queue`` of
them are pending, ``flush_secs`` have passed since the last write, or ``flush``/``close`` is called, and are
then appended to the file. An event file is a log that TensorBoard reads while it grows, so it is appended
to, not replaced atomically like a checkpoint; a record cut short by a crash is dropped by the reader.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from datetime import datetime
from typing import Any

import numpy as np

from tilewise.tensor import Tensor
from tilewise.utils.tensorboard import _records as rec

_file_numbers = itertools.count()
_HPARAMS_PLUGIN, _HPARAMS_VERSION = "hparams", 0
_EXPERIMENT_TAG = "_hparams_/experiment"
_SESSION_START_TAG = "_hparams_/session_start_info"
_SESSION_END_TAG = "_hparams_/session_end_info"
_DATA_TYPE_STRING, _DATA_TYPE_FLOAT64 = 1, 3
_STATUS_SUCCESS = 1


class FileWriter:
    """Appends events to one new event file in ``log_dir``."""

    def __init__(self, log_dir: str | os.PathLike, max_queue: int = 10, flush_secs: float = 120,
                 filename_suffix: str = ""):
        self.log_dir = str(log_dir)
        os.makedirs(self.log_dir, exist_ok=True)
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}."
                f"{next(_file_numbers)}{filename_suffix}")
        self.path = os.path.join(self.log_dir, name)
        self.max_queue, self.flush_secs = max_queue, flush_secs
        self._pending: list[bytes] = []
        self._last_flush = time.time()
        self._file = open(self.path, "ab")  # noqa: SIM115 — held open for the writer's life, closed by close()
        self.add_event(rec.event(time.time(), file_version="brain.Event:2"))
        self.flush()

    def get_logdir(self) -> str:
        return self.log_dir

    def add_event(self, event: bytes) -> None:
        if self._file is None:
            raise RuntimeError(f"SummaryWriter: the event file {self.path} is closed")
        self._pending.append(rec.tfrecord(event))
        if len(self._pending) >= self.max_queue or time.time() - self._last_flush >= self.flush_secs:
            self.flush()

    def add_summary(self, summary: bytes, global_step=None, walltime: float | None = None) -> None:
        wall_time = time.time() if walltime is None else float(walltime)
        step = 0 if global_step is None else int(global_step)
        self.add_event(rec.event(wall_time, step, summary=summary))

    def flush(self) -> None:
        if self._file is None:
            return
        if self._pending:
            self._file.write(b"".join(self._pending))
            self._pending.clear()
        self._file.flush()
        self._last_flush = time.time()

    def close(self) -> None:
        if self._file is not None:
            self.flush()
            self._file.close()
            self._file = None


class SummaryWriter:
    """Writes TensorBoard event files under ``log_dir``, as ``torch.utils.tensorboard.SummaryWriter``.

    >>> import tempfile, tilewise as tw
    >>> from tilewise.utils.tensorboard import SummaryWriter
    >>> with SummaryWriter(tempfile.mkdtemp()) as writer:
    ...     for step in range(3):
    ...         writer.add_scalar("loss", 1.0 / (step + 1), step)
    ...     writer.add_histogram("weights", tw.randn(100), 2)
    """

    def __init__(self, log_dir: str | os.PathLike | None = None, comment: str = "", purge_step: int | None = None,
                 max_queue: int = 10, flush_secs: float = 120, filename_suffix: str = ""):
        if not log_dir:
            current_time = datetime.now().strftime("%b%d_%H-%M-%S")
            log_dir = os.path.join("runs", current_time + "_" + socket.gethostname() + comment)
        self.log_dir = log_dir
        self.purge_step = purge_step
        self.max_queue, self.flush_secs, self.filename_suffix = max_queue, flush_secs, filename_suffix
        self.file_writer: FileWriter | None = None
        self.all_writers: dict[str, FileWriter] | None = None
        self._get_file_writer()
        self.default_bins = _default_bins()

    def _get_file_writer(self) -> FileWriter:
        """The writer of ``log_dir``, made again after ``close`` (as torch does)."""
        if self.all_writers is None or self.file_writer is None:
            self.file_writer = FileWriter(self.log_dir, self.max_queue, self.flush_secs, self.filename_suffix)
            self.all_writers = {self.file_writer.get_logdir(): self.file_writer}
            if self.purge_step is not None:  # TensorBoard hides this run's events after purge_step
                now = time.time()
                self.file_writer.add_event(rec.event(now, self.purge_step, file_version="brain.Event:2"))
                self.file_writer.add_event(rec.event(now, self.purge_step,
                                                     session_log=rec.session_log(rec.SESSION_START)))
                self.purge_step = None
        return self.file_writer

    def get_logdir(self) -> str:
        return self.log_dir

    def add_scalar(self, tag: str, scalar_value, global_step=None, walltime: float | None = None,
                   new_style: bool = False, double_precision: bool = False) -> None:
        self._get_file_writer().add_summary(_scalar(tag, scalar_value, new_style, double_precision), global_step,
                                            walltime)

    def add_scalars(self, main_tag: str, tag_scalar_dict: dict[str, Any], global_step=None,
                    walltime: float | None = None) -> None:
        walltime = time.time() if walltime is None else walltime
        base = self._get_file_writer().get_logdir()
        for tag, scalar_value in tag_scalar_dict.items():
            run = base + "/" + main_tag.replace("/", "_") + "_" + tag
            writer = self.all_writers.get(run)
            if writer is None:
                writer = self.all_writers[run] = FileWriter(run, self.max_queue, self.flush_secs, self.filename_suffix)
            writer.add_summary(_scalar(main_tag, scalar_value), global_step, walltime)

    def add_histogram(self, tag: str, values, global_step=None, bins="tensorflow", walltime: float | None = None,
                      max_bins: int | None = None) -> None:
        if isinstance(bins, str) and bins == "tensorflow":
            bins = self.default_bins
        histogram = make_histogram(_as_numpy(values).astype(float), bins, max_bins)
        self._get_file_writer().add_summary(rec.summary(rec.summary_value(tag, histo=histogram)), global_step,
                                            walltime)

    def add_histogram_raw(self, tag: str, min, max, num, sum, sum_squares, bucket_limits, bucket_counts,  # noqa: A002
                          global_step=None, walltime: float | None = None) -> None:
        if len(bucket_limits) != len(bucket_counts):
            raise ValueError("len(bucket_limits) != len(bucket_counts), see the document.")
        histogram = rec.histogram_proto(min, max, num, sum, sum_squares, list(bucket_limits), list(bucket_counts))
        self._get_file_writer().add_summary(rec.summary(rec.summary_value(tag, histo=histogram)), global_step,
                                            walltime)

    def add_text(self, tag: str, text_string: str, global_step=None, walltime: float | None = None) -> None:
        tensor = rec.tensor_proto(rec.DT_STRING, dims=(1,), string_val=[text_string.encode("utf_8")])
        value = rec.summary_value(tag + "/text_summary", tensor=tensor, metadata=rec.summary_metadata("text"))
        self._get_file_writer().add_summary(rec.summary(value), global_step, walltime)

    def add_hparams(self, hparam_dict: dict, metric_dict: dict, hparam_domain_discrete: dict | None = None,
                    run_name: str | None = None, global_step=None) -> None:
        if type(hparam_dict) is not dict or type(metric_dict) is not dict:
            raise TypeError("hparam_dict and metric_dict should be dictionary.")
        experiment, session_start, session_end = _hparams(hparam_dict, metric_dict, hparam_domain_discrete)
        run_name = run_name or str(time.time())
        with SummaryWriter(log_dir=os.path.join(self._get_file_writer().get_logdir(), run_name)) as run:
            for summary in (experiment, session_start, session_end):
                run.file_writer.add_summary(summary, global_step)
            for tag, value in metric_dict.items():
                run.add_scalar(tag, value, global_step)

    def flush(self) -> None:
        for writer in (self.all_writers or {}).values():
            writer.flush()

    def close(self) -> None:
        for writer in (self.all_writers or {}).values():
            writer.close()
        self.file_writer = self.all_writers = None

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        self.close()


def _default_bins() -> list[float]:
    """TensorBoard's bucket limits: ±1e-12 growing by 10% up to 1e20, and 0."""
    v, buckets = 1e-12, []
    while v < 1e20:
        buckets.append(v)
        v *= 1.1
    return [-b for b in reversed(buckets)] + [0] + buckets


def _as_numpy(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if np.isscalar(x):
        return np.array([x])
    if isinstance(x, Tensor):
        return x.detach().cpu().float().numpy() if x.dtype.name == "bfloat16" else x.detach().cpu().numpy()
    raise NotImplementedError(f"Got {type(x)}, but numpy array or tilewise tensor are expected.")


def _scalar(tag: str, value, new_style: bool = False, double_precision: bool = False) -> bytes:
    array = _as_numpy(value).squeeze()
    if array.ndim != 0:
        raise AssertionError(f"Tensor should contain one element (0 dimensions). Was given size: {array.size} and "
                             f"{array.ndim} dimensions.")
    scalar = float(array)
    if not new_style:
        return rec.summary(rec.summary_value(tag, simple_value=scalar))
    if double_precision:
        tensor = rec.tensor_proto(rec.DT_DOUBLE, double_val=[scalar])
    else:
        tensor = rec.tensor_proto(rec.DT_FLOAT, float_val=[scalar])
    return rec.summary(rec.summary_value(tag, tensor=tensor, metadata=rec.summary_metadata("scalars")))


def make_histogram(values: np.ndarray, bins, max_bins: int | None = None) -> bytes:
    """A ``HistogramProto`` of ``values``, with torch's bucketing: ``np.histogram``, optional subsampling to
    ``max_bins``, and only the span from the first to the last non-empty bucket (plus one empty bucket on the
    left, because TensorBoard draws each bucket from the previous limit)."""
    if values.size == 0:
        raise ValueError("The input has no element.")
    values = values.reshape(-1)
    counts, limits = np.histogram(values, bins=bins)
    if max_bins is not None and len(counts) > max_bins:
        counts, limits = _subsampled(counts, limits, len(counts) // max_bins)
    cumulative = np.cumsum(np.greater(counts, 0))
    start, end = np.searchsorted(cumulative, [0, cumulative[-1] - 1], side="right")
    start, end = int(start), int(end) + 1
    counts = counts[start - 1:end] if start > 0 else np.concatenate([[0], counts[:end]])
    limits = limits[start:end + 1]
    if counts.size == 0 or limits.size == 0:
        raise ValueError("The histogram is empty, please file a bug report.")
    return rec.histogram_proto(float(values.min()), float(values.max()), float(len(values)), float(values.sum()),
                               float(values.dot(values)), limits.tolist(), counts.tolist())


def _subsampled(counts: np.ndarray, limits: np.ndarray, every: int) -> tuple[np.ndarray, np.ndarray]:
    if len(counts) % every:
        counts = np.pad(counts, [[0, every - len(counts) % every]], mode="constant", constant_values=0)
    counts = counts.reshape(-1, every).sum(axis=-1)
    merged = np.empty((counts.size + 1,), limits.dtype)
    merged[:-1] = limits[:-1:every]
    merged[-1] = limits[-1]
    return counts, merged


# ---------------------------------------------------------------------------- hyperparameters

def _hparams(hparam_dict: dict, metric_dict: dict, domains: dict | None) -> tuple[bytes, bytes, bytes]:
    """The experiment, session-start and session-end summaries of TensorBoard's hparams plugin (messages of
    ``tensorboard/plugins/hparams/api.proto`` and ``plugin_data.proto``)."""
    domains = domains or {}
    if not isinstance(domains, dict):
        raise TypeError("parameter: hparam_domain_discrete should be a dictionary, nothing logged.")
    for k, v in domains.items():
        if k not in hparam_dict or not isinstance(v, list) or not all(isinstance(d, type(hparam_dict[k])) for d in v):
            raise TypeError(f"parameter: hparam_domain_discrete[{k}] should be a list of same type as "
                            f"hparam_dict[{k}].")
    infos, values = [], []
    for k, v in hparam_dict.items():
        if v is None:
            continue
        if isinstance(v, (int, float)):  # bool included, as torch checks int first: True is the number 1
            kind, value, domain = _DATA_TYPE_FLOAT64, _number_value(v), [_number_value(d) for d in domains.get(k, [])]
        elif isinstance(v, str):
            kind, value, domain = _DATA_TYPE_STRING, _string_value(v), [_string_value(d) for d in domains.get(k, [])]
        elif isinstance(v, Tensor):
            kind, value, domain = _DATA_TYPE_FLOAT64, _number_value(_as_numpy(v).reshape(-1)[0]), []
        else:
            raise ValueError("value should be one of int, float, str, bool, or torch.Tensor")
        values.append(rec.message_field(1, rec.bytes_field(1, k) + rec.message_field(2, value)))
        info = rec.bytes_field(1, k) + rec.int_field(4, kind)
        if k in domains:
            info += rec.message_field(5, b"".join(rec.message_field(1, d) for d in domain))
        infos.append(info)
    metrics = [rec.message_field(1, rec.bytes_field(2, k)) for k in metric_dict]
    experiment = b"".join(rec.message_field(4, i) for i in infos) + b"".join(rec.message_field(5, m) for m in metrics)
    return (_hparams_summary(_EXPERIMENT_TAG, 2, experiment), _hparams_summary(_SESSION_START_TAG, 3, b"".join(values)),
            _hparams_summary(_SESSION_END_TAG, 4, rec.int_field(1, _STATUS_SUCCESS)))


def _number_value(v) -> bytes:
    return rec.double_field(2, float(v), always=True)


def _string_value(v: str) -> bytes:
    return rec.bytes_field(3, v, always=True)


def _hparams_summary(tag: str, field: int, body: bytes) -> bytes:
    content = rec.int_field(1, _HPARAMS_VERSION) + rec.message_field(field, body)
    return rec.summary(rec.summary_value(tag, metadata=rec.summary_metadata(_HPARAMS_PLUGIN, content)))


__all__ = ["FileWriter", "SummaryWriter"]
