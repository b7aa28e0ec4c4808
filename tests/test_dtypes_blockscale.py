"""float8_e8m0fnu and float4_e2m1fn_x2 against torch: casts, fills, printing, views, DLPack and safetensors."""

import ml_dtypes
import numpy as np
import pytest

import tilewise as tw

torch = pytest.importorskip("torch")

E8M0_SOURCES = [3.0, 0.1, 1e-40, -1.0, -0.5, float("inf"), float("-inf"), float("nan"), 2**127 * 1.9, 2.0**-127,
                2.0**-128, 1.5, 1.4142, 0.75, 0.0, -0.0, 2.5e38, 1e-45, 6.0, 1024.0, 1000.0]


def _bytes(t) -> list:
    return (t.view(torch.uint8) if isinstance(t, torch.Tensor) else t.view(tw.uint8)).tolist()


@pytest.mark.parametrize("source", ["float32", "float64", "bfloat16", "float16"])
def test_e8m0_cast_rounds_like_torch(source):
    values = E8M0_SOURCES + list(np.random.default_rng(0).standard_normal(200) * 10.0 ** np.arange(-20, 20, 0.2))
    if source in ("float16", "bfloat16"):
        values = [v for v in values if abs(v) < 6e4 or not np.isfinite(v)]
    ours = tw.tensor(values, dtype=tw.float64).to(getattr(tw, source)).to(tw.float8_e8m0fnu)
    theirs = torch.tensor(values, dtype=torch.float64).to(getattr(torch, source)).to(torch.float8_e8m0fnu)
    assert _bytes(ours) == _bytes(theirs)


def test_e8m0_from_integers_and_bool_like_torch():
    for values, tdt, odt in (([0, 1, 2, 3, 5, 1 << 40], torch.int64, tw.int64), ([True, False], torch.bool, tw.bool)):
        assert _bytes(tw.tensor(values, dtype=odt).to(tw.float8_e8m0fnu)) == \
            _bytes(torch.tensor(values, dtype=tdt).to(torch.float8_e8m0fnu))


@pytest.mark.parametrize("target", ["float32", "bfloat16", "float16", "float64", "int32", "float8_e4m3fn", "bool"])
def test_e8m0_to_other_dtypes_like_torch(target):
    codes = list(range(0, 256, 3)) + [255, 254, 127, 0]
    ours = tw.tensor(codes, dtype=tw.uint8).view(tw.float8_e8m0fnu).to(getattr(tw, target))
    theirs = torch.tensor(codes, dtype=torch.uint8).view(torch.float8_e8m0fnu).to(getattr(torch, target))
    if target == "int32":  # NaN and values past int32: platform-defined in both; compare the in-range ones
        keep = [i for i, c in enumerate(codes) if c <= 127 + 30]
        assert [ours.tolist()[i] for i in keep] == [theirs.tolist()[i] for i in keep]
    else:
        np.testing.assert_array_equal(ours.float().numpy(), theirs.float().numpy())


def test_e8m0_fills_and_finfo_like_torch():
    assert _bytes(tw.full((2,), 3.0, dtype=tw.float8_e8m0fnu)) == _bytes(
        torch.full((2,), 3.0, dtype=torch.float8_e8m0fnu))
    assert _bytes(tw.zeros(2, dtype=tw.float8_e8m0fnu)) == [0, 0]
    assert _bytes(tw.ones(2, dtype=tw.float8_e8m0fnu)) == _bytes(torch.ones(2, dtype=torch.float8_e8m0fnu))
    assert _bytes(tw.tensor([1.0, 2.0], dtype=tw.float8_e8m0fnu)) == [127, 128]
    ours, theirs = tw.finfo(tw.float8_e8m0fnu), torch.finfo(torch.float8_e8m0fnu)
    for field in ("bits", "eps", "max", "min", "tiny", "resolution"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert tw.ones(2, dtype=tw.float8_e8m0fnu)[0].item() == 1.0
    assert tw.ones(2, dtype=tw.float8_e8m0fnu).tolist() == [1.0, 1.0]


def test_storage_only_dtypes_refuse_arithmetic_like_torch():
    e = tw.ones(3, dtype=tw.float8_e8m0fnu)
    f = tw.zeros(3, dtype=tw.float4_e2m1fn_x2)
    for fn in (lambda t: t.abs(), lambda t: t + t, lambda t: t * 2, lambda t: t.sum(), lambda t: t.max(),
               lambda t: t.sort()):
        for t in (e, f):
            with pytest.raises(NotImplementedError, match=t.dtype.name):
                fn(t)
    with pytest.raises(TypeError, match="Promotion for Float8 Types"):
        tw.promote_types(tw.float8_e8m0fnu, tw.float32)
    assert (e == e).tolist() == [True] * 3 and (f != f).tolist() == [False] * 3


def test_fp4_creation_casts_and_views_like_torch():
    raw = [[0x21, 0xF7, 0x00], [0x10, 0x3C, 0xFF]]
    ours = tw.tensor(raw, dtype=tw.uint8).view(tw.float4_e2m1fn_x2)
    theirs = torch.tensor(raw, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    assert ours.shape == theirs.shape and ours.element_size() == theirs.element_size() == 1
    assert _bytes(ours) == _bytes(theirs)
    assert ours.view(tw.int8).tolist() == theirs.view(torch.int8).tolist()
    assert ours[:, :2].contiguous().view(tw.int16).tolist() == theirs[:, :2].contiguous().view(torch.int16).tolist()
    assert _bytes(ours.clone()) == _bytes(tw.cat([ours])) == _bytes(theirs.clone())
    assert _bytes(ours[:, 1:]) == _bytes(theirs[:, 1:])
    assert _bytes(ours.t().contiguous()) == _bytes(theirs.t().contiguous())
    assert _bytes(tw.zeros(2, dtype=tw.float4_e2m1fn_x2)) == _bytes(torch.zeros(2, dtype=torch.float4_e2m1fn_x2))
    assert repr(ours) == repr(theirs).replace("torch.", "tilewise.")
    assert tw.float4_e2m1fn_x2.is_floating_point == torch.float4_e2m1fn_x2.is_floating_point
    for cast in (lambda t: t.float(), lambda t: t.to(tw.uint8), lambda t: tw.ones(2).to(tw.float4_e2m1fn_x2)):
        with pytest.raises(NotImplementedError, match="float4_e2m1fn_x2"):
            cast(ours)
    with pytest.raises(NotImplementedError):
        theirs.float()
    with pytest.raises(NotImplementedError, match="only be filled with zeros"):
        tw.ones(2, dtype=tw.float4_e2m1fn_x2)
    with pytest.raises(NotImplementedError):
        torch.ones(2, dtype=torch.float4_e2m1fn_x2)
    with pytest.raises(TypeError, match="finfo"):
        tw.finfo(tw.float4_e2m1fn_x2)


@pytest.mark.parametrize("values", [[0.5, 1, 2, 4, 2.0**-127, 2.0**100, float("nan")], [0.5, 1, 2, 4], [1.0],
                                    [3.0, 2.0**60], [2.0**-127, 2.0**-100, 1.0], [1, 2, float("nan")]])
def test_e8m0_printing_like_torch(values):
    assert repr(tw.tensor(values).to(tw.float8_e8m0fnu)) == \
        repr(torch.tensor(values).to(torch.float8_e8m0fnu)).replace("torch.", "tilewise.")


def test_view_dtype_like_torch():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ours, theirs = tw.tensor(x), torch.tensor(x)
    for name in ("int32", "uint8", "int16", "bfloat16", "float64", "float8_e8m0fnu", "float4_e2m1fn_x2"):
        if name == "float64":
            a, b = ours.view(tw.float64), theirs.view(torch.float64)
        else:
            a, b = ours.view(getattr(tw, name)), theirs.view(getattr(torch, name))
        assert tuple(a.shape) == tuple(b.shape), name
        assert a.stride() == b.stride(), name
        assert a.view(tw.uint8).tolist() == b.view(torch.uint8).tolist(), name
    assert ours[:, 1].view(tw.uint8).shape == tuple(theirs[:, 1].view(torch.uint8).shape)
    for bad in (lambda m, t: t.transpose(0, 2).view(m.uint8), lambda m, t: t[..., :3].view(m.float64),
                lambda m, t: t[0, 0, 0].view(m.uint8)):
        with pytest.raises(RuntimeError):
            bad(torch, theirs)
        with pytest.raises(RuntimeError, match="view.dtype"):
            bad(tw, ours)


@pytest.mark.parametrize("name", ["float8_e8m0fnu", "float4_e2m1fn_x2"])
def test_dlpack_round_trips_with_torch(name):
    raw = np.arange(12, dtype=np.uint8).reshape(3, 4) * 17
    theirs = torch.tensor(raw).view(getattr(torch, name))
    ours = tw.from_dlpack(theirs)
    assert ours.dtype is getattr(tw, name) and _bytes(ours) == raw.tolist()
    back = torch.from_dlpack(ours)
    assert back.dtype == getattr(torch, name) and _bytes(back) == raw.tolist()


def test_safetensors_round_trips_with_the_safetensors_library(tmp_path):
    safe_open = pytest.importorskip("safetensors").safe_open
    from safetensors.torch import save_file

    fp4 = torch.tensor([[0x21, 0xF7], [3, 4], [5, 6]], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    e8 = torch.tensor([1.0, 2.0, 0.25], dtype=torch.float8_e8m0fnu)
    save_file({"fp4": fp4, "e8": e8}, tmp_path / "t.safetensors")
    header = (tmp_path / "t.safetensors").read_bytes()[8:200]
    assert b'"F4"' in header and b'"F8_E8M0"' in header and b'"shape":[3,4]' in header  # F4 counts nibbles
    loaded = tw.load(tmp_path / "t.safetensors")
    assert loaded["fp4"].dtype is tw.float4_e2m1fn_x2 and loaded["fp4"].shape == (3, 2)
    assert _bytes(loaded["fp4"]) == _bytes(fp4) and _bytes(loaded["e8"]) == _bytes(e8)
    tw.save(loaded, tmp_path / "ours.safetensors")
    with safe_open(str(tmp_path / "ours.safetensors"), "pt") as f:
        assert _bytes(f.get_tensor("fp4")) == _bytes(fp4) and f.get_tensor("fp4").dtype == torch.float4_e2m1fn_x2
        assert _bytes(f.get_tensor("e8")) == _bytes(e8) and f.get_tensor("e8").dtype == torch.float8_e8m0fnu


def test_describe_shows_the_bit_fields():
    assert tw.dtypes.describe(1.75, tw.float8_e4m3fn) == (
        "float8_e4m3fn 0x3e = 0|0111|110: sign + exponent 7 (bias 7) mantissa 6/8 -> +(1 + 6/8) × 2^0 = 1.75")
    assert tw.dtypes.describe(3.0, tw.float8_e8m0fnu).startswith("float8_e8m0fnu 0x81 = 10000001: exponent 129")
    assert "= -0.5" in tw.dtypes.describe(-0.3, tw.float4_e2m1fn_x2)
    assert "0x7e" in tw.dtypes.describe(1e6, tw.float8_e4m3fn)  # saturates at 448, as the cast does
    assert "special = inf" in tw.dtypes.describe(float("inf"), tw.float8_e5m2)
    assert "0x3dcccccd" in tw.dtypes.describe(0.1, tw.float32)
    with pytest.raises(TypeError, match="not a floating-point format"):
        tw.dtypes.describe(1, tw.int32)


def test_e2m1_codes_match_ml_dtypes():
    """encode_e2m1 (round to nearest even, saturating) against ml_dtypes' float4_e2m1fn on every midpoint."""
    grid = np.concatenate([np.linspace(-7, 7, 2801, dtype=np.float32), [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]])
    grid = np.concatenate([grid, -grid])
    expected = np.clip(grid, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    np.testing.assert_array_equal(tw.dtypes.decode_e2m1(tw.dtypes.encode_e2m1(grid)), expected)


@pytest.mark.cuda
def test_cuda_e8m0_casts_and_fp4_copies_match_the_cpu():
    values = E8M0_SOURCES + list(np.random.default_rng(5).standard_normal(500) * 10.0 ** np.arange(-25, 25, 0.1))
    x = tw.tensor(values, dtype=tw.float32)
    on_gpu = x.cuda().to(tw.float8_e8m0fnu)
    assert _bytes(on_gpu.cpu()) == _bytes(x.to(tw.float8_e8m0fnu))
    np.testing.assert_array_equal(on_gpu.float().cpu().numpy(), on_gpu.cpu().float().numpy())
    packed = tw.tensor([[0x21, 0xF7, 0x00, 0x3C]] * 3, dtype=tw.uint8).view(tw.float4_e2m1fn_x2)
    strided = packed.cuda().t().contiguous().t()
    assert _bytes(strided.contiguous().cpu()) == _bytes(packed)
    with pytest.raises(NotImplementedError, match="float4_e2m1fn_x2"):
        packed.cuda().float()


def test_torch_checkpoints_round_trip(tmp_path):
    fp4 = torch.tensor([[0x21, 0xF7], [3, 4]], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    e8 = torch.tensor([1.0, 2.0, 0.25], dtype=torch.float8_e8m0fnu)
    torch.save({"fp4": fp4, "e8": e8}, tmp_path / "theirs.pt")
    ours = tw.load(tmp_path / "theirs.pt")
    assert ours["fp4"].dtype is tw.float4_e2m1fn_x2 and _bytes(ours["fp4"]) == _bytes(fp4)
    assert ours["e8"].dtype is tw.float8_e8m0fnu and _bytes(ours["e8"]) == _bytes(e8)
    tw.save(ours, tmp_path / "ours.pt")
    back = torch.load(tmp_path / "ours.pt")
    assert back["fp4"].dtype == torch.float4_e2m1fn_x2 and _bytes(back["fp4"]) == _bytes(fp4)
    assert back["e8"].dtype == torch.float8_e8m0fnu and _bytes(back["e8"]) == _bytes(e8)
