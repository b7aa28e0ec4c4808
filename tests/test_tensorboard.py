"""tilewise.utils.tensorboard.SummaryWriter: event files that TensorBoard reads. The files are checked with
tensorboard's own reader where it is installed, and always with a protobuf decoder written here from the
wire-format spec and the field numbers of tensorflow's event/summary/tensor protos; CRC32C against the
published check values; histograms against torch's own bucketing code (run from torch's source)."""

from __future__ import annotations

import ast
import glob
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.utils.tensorboard import SummaryWriter
from tilewise.utils.tensorboard._records import crc32c, masked_crc32c, varint

# ---------------------------------------------------------------------------- a reader from the spec


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def decode(data: bytes) -> dict[int, list]:
    """field number -> values (ints, raw 8/4-byte chunks, or bytes for length-delimited fields)."""
    fields: dict[int, list] = {}
    pos = 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        elif wire == 2:
            length, pos = read_varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        else:
            raise AssertionError(f"wire type {wire}")
        fields.setdefault(field, []).append(value)
    assert pos == len(data)
    return fields


def double(chunk: bytes) -> float:
    return struct.unpack("<d", chunk)[0]


def read_records(path: str) -> list[bytes]:
    data = Path(path).read_bytes()
    records, pos = [], 0
    while pos < len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[pos + 8:pos + 12])[0] == masked_crc32c(header)
        payload = data[pos + 12:pos + 12 + length]
        assert struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])[0] == masked_crc32c(payload)
        records.append(payload)
        pos += 16 + length
    return records


def events(log_dir) -> list[dict]:
    """Each event as {'wall_time', 'step', 'file_version' | 'values' | 'session_log'}."""
    (path,) = glob.glob(os.path.join(str(log_dir), "events.out.tfevents.*"))
    out = []
    for record in read_records(path):
        fields = decode(record)
        event = {"wall_time": double(fields[1][0]), "step": fields.get(2, [0])[0]}
        if 3 in fields:
            event["file_version"] = fields[3][0].decode()
        if 5 in fields:
            event["values"] = [decode(v) for v in decode(fields[5][0])[1]]
        if 7 in fields:
            event["session_log"] = decode(fields[7][0])
        out.append(event)
    return out


def test_crc32c_check_values():
    """The check value of CRC-32C and the vectors of RFC 3720 (iSCSI), appendix B.4."""
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E
    assert crc32c(bytes(range(31, -1, -1))) == 0x113FDB5C


def test_varint_encoding():
    assert varint(1) == b"\x01" and varint(300) == b"\xac\x02" and varint(-1) == b"\xff" * 9 + b"\x01"


# ---------------------------------------------------------------------------- the writer


def test_scalars_text_and_the_file_version(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        assert writer.get_logdir() == tmp_path
        for step in range(3):
            writer.add_scalar("loss/train", 1.0 / (step + 1), step)
        writer.add_scalar("tensor", tw.tensor([[2.5]]), 7, walltime=123.5)
        writer.add_scalar("zero", 0.0, 8)
        writer.add_scalar("new", np.float64(0.25), 9, new_style=True)
        writer.add_text("notes", "héllo", 10)
    got = events(tmp_path)
    assert got[0]["file_version"] == "brain.Event:2" and got[0]["step"] == 0
    scalars = [(e["step"], e["values"][0]) for e in got[1:6]]
    for (step, value), expected in zip(scalars, [(0, 1.0), (1, 0.5), (2, 1 / 3), (7, 2.5), (8, 0.0)]):
        assert step == expected[0]
        assert value[1] == [b"loss/train"] if step < 3 else True
        assert struct.unpack("<f", value[2][0])[0] == np.float32(expected[1])
    assert got[4]["wall_time"] == 123.5
    new = got[6]["values"][0]
    tensor, metadata = decode(new[8][0]), decode(new[9][0])
    assert tensor[1] == [1] and struct.unpack("<f", tensor[5][0])[0] == 0.25
    assert decode(metadata[1][0])[1] == [b"scalars"]
    text = got[7]["values"][0]
    assert text[1] == [b"notes/text_summary"] and decode(decode(text[9][0])[1][0])[1] == [b"text"]
    text_tensor = decode(text[8][0])
    assert text_tensor[1] == [7] and text_tensor[8] == ["héllo".encode()]
    assert decode(decode(text_tensor[2][0])[2][0])[1] == [1]


def test_scalar_must_be_one_value(tmp_path):
    with SummaryWriter(tmp_path) as writer, pytest.raises(AssertionError, match="one element"):
        writer.add_scalar("bad", tw.ones(2), 0)


def _torch_make_histogram():
    """torch's make_histogram, taken from its source (its module needs tensorboard to import)."""
    source = Path(torch.__file__).parent / "utils" / "tensorboard" / "summary.py"
    tree = ast.parse(source.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "make_histogram")
    namespace = {"np": np, "HistogramProto": lambda **fields: fields}
    exec(compile(ast.Module([node], []), str(source), "exec"), namespace)
    return namespace["make_histogram"]


@pytest.mark.parametrize("bins,max_bins", [("tensorflow", None), ("auto", None), (10, None), (50, 7)])
def test_histograms_bucket_as_torch(tmp_path, bins, max_bins):
    values = np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 3 + 1
    with SummaryWriter(tmp_path) as writer:
        writer.add_histogram("w", tw.tensor(values), 5, bins=bins, max_bins=max_bins)
        default_bins = writer.default_bins
    reference = _torch_make_histogram()(values.astype(float), default_bins if bins == "tensorflow" else bins,
                                        max_bins)
    (event,) = [e for e in events(tmp_path) if "values" in e]
    assert event["step"] == 5
    histo = decode(event["values"][0][5][0])
    for field, name in enumerate(("min", "max", "num", "sum", "sum_squares"), start=1):
        assert double(histo[field][0]) == pytest.approx(float(reference[name]), rel=1e-12), name
    limits = np.frombuffer(histo[6][0], "<f8")
    counts = np.frombuffer(histo[7][0], "<f8")
    np.testing.assert_array_equal(limits, reference["bucket_limit"])
    np.testing.assert_array_equal(counts, reference["bucket"])


def test_empty_histogram_is_refused(tmp_path):
    with SummaryWriter(tmp_path) as writer, pytest.raises(ValueError, match="no element"):
        writer.add_histogram("w", tw.zeros(0), 0)


def test_add_scalars_writes_one_run_per_series(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        writer.add_scalars("run/loss", {"train": 1.0, "val": 2.0}, 3)
    for tag, value in (("train", 1.0), ("val", 2.0)):
        got = events(tmp_path / f"run_loss_{tag}")
        (scalar,) = [e for e in got if "values" in e]
        assert scalar["step"] == 3 and scalar["values"][0][1] == [b"run/loss"]
        assert struct.unpack("<f", scalar["values"][0][2][0])[0] == value


def test_hparams_write_the_three_plugin_summaries_and_the_metrics(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        writer.add_hparams({"lr": 0.1, "name": "adam", "skip": None}, {"hparam/acc": 0.75}, run_name="r1")
    got = [e for e in events(tmp_path / "r1") if "values" in e]
    tags = [e["values"][0][1][0] for e in got]
    assert tags == [b"_hparams_/experiment", b"_hparams_/session_start_info", b"_hparams_/session_end_info",
                    b"hparam/acc"]
    plugin = decode(decode(got[0]["values"][0][9][0])[1][0])
    assert plugin[1] == [b"hparams"]
    experiment = decode(decode(plugin[2][0])[2][0])
    infos = [decode(i) for i in experiment[4]]
    assert [(i[1][0], i[4][0]) for i in infos] == [(b"lr", 3), (b"name", 1)]
    assert decode(decode(experiment[5][0])[1][0])[2] == [b"hparam/acc"]
    start = decode(decode(decode(decode(got[1]["values"][0][9][0])[1][0])[2][0])[3][0])
    entries = {decode(e)[1][0]: decode(decode(e)[2][0]) for e in start[1]}
    assert double(entries[b"lr"][2][0]) == 0.1 and entries[b"name"][3] == [b"adam"]
    end = decode(decode(decode(decode(got[2]["values"][0][9][0])[1][0])[2][0])[4][0])
    assert end[1] == [1]
    with pytest.raises(TypeError, match="should be dictionary"):
        SummaryWriter(tmp_path / "x").add_hparams([("lr", 1)], {})


def test_default_log_dir_purge_step_and_reopening_after_close(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    writer = SummaryWriter(comment="_exp", purge_step=4)
    log_dir = writer.get_logdir()
    assert log_dir.startswith("runs" + os.sep) and log_dir.endswith("_exp")
    writer.add_scalar("a", 1.0, 5)
    writer.flush()
    got = events(log_dir)
    assert got[1]["step"] == 4 and got[1]["file_version"] == "brain.Event:2"
    assert got[2]["step"] == 4 and got[2]["session_log"][1] == [1]
    writer.close()
    writer.close()  # a second close is ignored
    writer.add_scalar("b", 2.0, 6)  # writing again opens a new file, as torch does
    writer.close()
    assert len(glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))) == 2


def test_events_wait_for_max_queue_or_flush(tmp_path):
    writer = SummaryWriter(tmp_path, max_queue=3)
    (path,) = glob.glob(str(tmp_path / "events.*"))
    writer.add_scalar("a", 1.0, 0)
    assert len(read_records(path)) == 1, "pending until the queue fills"
    writer.add_scalar("a", 1.0, 1)
    writer.add_scalar("a", 1.0, 2)
    assert len(read_records(path)) == 4
    writer.add_scalar("a", 1.0, 3)
    writer.flush()
    assert len(read_records(path)) == 5
    writer.close()


def test_tensorboard_reads_the_files_when_installed(tmp_path):
    """TensorBoard's own reader and protos, where tensorboard is installed: every record, every field."""
    loader = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader")
    from tensorboard.plugins.hparams import plugin_data_pb2

    values = np.random.default_rng(0).standard_normal(100)
    with SummaryWriter(tmp_path, purge_step=2) as writer:
        writer.add_scalar("loss", 0.5, 3, walltime=10.0)
        writer.add_scalar("new", 0.25, 4, new_style=True, double_precision=True)
        writer.add_histogram("w", values, 5)
        writer.add_text("note", "hello", 6)
        writer.add_hparams({"lr": 0.1, "opt": "adam"}, {"acc": 0.9}, run_name="hp")
    (path,) = glob.glob(str(tmp_path / "events.*"))
    read = list(loader.EventFileLoader(path).Load())
    assert read[0].file_version == "brain.Event:2" and read[1].step == 2 and read[2].session_log.status == 1
    scalar, new, histo, text = read[3:7]
    assert scalar.wall_time == 10.0 and scalar.step == 3 and scalar.summary.value[0].simple_value == 0.5
    assert new.summary.value[0].tensor.double_val == [0.25] and new.summary.value[0].metadata.plugin_data.plugin_name \
        == "scalars"
    reference = _torch_make_histogram()(values, _default_bins(), None)
    h = histo.summary.value[0].histo
    assert h.num == 100 and list(h.bucket_limit) == reference["bucket_limit"] and list(h.bucket) == reference["bucket"]
    assert text.summary.value[0].tag == "note/text_summary" and text.summary.value[0].tensor.string_val == [b"hello"]
    (hp_path,) = glob.glob(str(tmp_path / "hp" / "events.*"))
    hp = [e for e in loader.EventFileLoader(hp_path).Load() if e.HasField("summary")]
    start = plugin_data_pb2.HParamsPluginData.FromString(hp[1].summary.value[0].metadata.plugin_data.content)
    assert start.session_start_info.hparams["lr"].number_value == 0.1
    assert start.session_start_info.hparams["opt"].string_value == "adam"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(hp[0].summary.value[0].metadata.plugin_data.content)
    assert [i.name for i in experiment.experiment.hparam_infos] == ["lr", "opt"]
    assert experiment.experiment.metric_infos[0].name.tag == "acc"
    assert hp[3].summary.value[0].simple_value == pytest.approx(0.9)


def _default_bins():
    from tilewise.utils.tensorboard.writer import _default_bins as bins

    return bins()
