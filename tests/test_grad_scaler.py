"""tilewise.amp.GradScaler against torch.amp.GradScaler on the CPU (torch supports device="cpu"): the same scale
sequence, skipped steps and parameter values over training runs with injected inf/NaN gradients, with every
optimizer; its state dicts, pickling, errors and deprecated aliases; on CUDA, its compiled check-and-unscale."""

import pickle
import warnings

import numpy as np
import pytest
import torch

import tilewise as tw

STEPS = 10
BAD_STEPS = {2: np.inf, 5: np.nan, 6: -np.inf}  # step -> the value injected into one gradient element

OPTIMIZERS = {
    "SGD": lambda lib, ps: lib.optim.SGD(ps, lr=0.1),
    "SGD-momentum": lambda lib, ps: lib.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "Adam": lambda lib, ps: lib.optim.Adam(ps, lr=0.01),
    "AdamW-amsgrad": lambda lib, ps: lib.optim.AdamW(ps, lr=0.01, amsgrad=True),
    "Adam-foreach": lambda lib, ps: lib.optim.Adam(ps, lr=0.01, foreach=True),
    "AdamW-fused": lambda lib, ps: lib.optim.AdamW(ps, lr=0.01, fused=True),  # torch's unscales in its fused step
    "SGD-compiled-step": lambda lib, ps: _compiled_step(lib, lib.optim.SGD(ps, lr=0.1, momentum=0.9,
                                                                            weight_decay=0.01)),
    "Adam-compiled-step": lambda lib, ps: _compiled_step(lib, lib.optim.Adam(ps, lr=0.01)),
    "RMSprop": lambda lib, ps: lib.optim.RMSprop(ps, lr=0.01, momentum=0.5),
    "Adagrad": lambda lib, ps: lib.optim.Adagrad(ps, lr=0.1),
    "Adadelta": lambda lib, ps: lib.optim.Adadelta(ps),
    "Adamax": lambda lib, ps: lib.optim.Adamax(ps, lr=0.01),
    "NAdam": lambda lib, ps: lib.optim.NAdam(ps, lr=0.01),
    "RAdam": lambda lib, ps: lib.optim.RAdam(ps, lr=0.01),
}


def _compiled_step(lib, opt):
    """``opt`` whose ``step`` is replaced by its compiled form (``torch.compile`` on torch's side)."""
    if lib is tw:
        opt.step = tw.compile(opt.step)
    return opt


def _arrays(dtype=np.float32):
    rng = np.random.default_rng(1)
    params = [rng.standard_normal((3, 4)).astype(dtype), rng.standard_normal(4).astype(dtype)]
    grads = [[rng.standard_normal(p.shape).astype(dtype) for p in params] for _ in range(STEPS)]
    return params, grads


def _lib_tensor(lib, a, dtype=None):
    t = lib.tensor(a)
    return t if dtype is None else t.to(getattr(lib, dtype))


def _train(lib, make_opt, *, dtype="float32", unscale_first=False, growth_interval=3, init_scale=2.0**8):
    """Run STEPS steps with gradients ``g * scale`` set directly (no model), inf/NaN in BAD_STEPS; return the
    scales after each update, which steps ran, and the parameters after each step."""
    params0, grads = _arrays()
    params = [lib.nn.Parameter(_lib_tensor(lib, p, dtype)) for p in params0]
    opt = make_opt(lib, params)
    ran = []
    opt.register_step_post_hook(lambda *a: ran.append(len(scales)))
    scaler = lib.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    scales, values = [], []
    for step in range(STEPS):
        scaler.scale(lib.ones(()))  # creates the scale on the first step, as scaling the loss does
        scale = scaler.get_scale()
        for p, g in zip(params, grads[step]):
            g = g * np.float32(scale)
            if step in BAD_STEPS and p.ndim == 2:
                g[1, 2] = BAD_STEPS[step]
            p.grad = _lib_tensor(lib, g, dtype)
        if unscale_first:
            scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        values.append([p.detach().float().numpy().copy() for p in params])
    return scales, ran, values, scaler.state_dict()


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_training_matches_torch(name):
    ours = _train(tw, OPTIMIZERS[name])
    theirs = _train(torch, OPTIMIZERS[name])
    assert ours[0] == theirs[0], "scale sequence"
    # a fused torch optimizer is stepped every time (it skips inside), and a replayed compiled step runs no hooks:
    # their parameters, not their hooks, show which steps ran
    if "fused" not in name and "compiled" not in name:
        assert ours[1] == theirs[1] and len(ours[1]) == STEPS - len(BAD_STEPS), "steps taken"
    for step, (a, b) in enumerate(zip(ours[2], theirs[2])):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7, err_msg=f"{name}: parameters after step {step}")
    assert ours[3] == theirs[3]


def test_explicit_unscale_then_clip_matches_torch():
    def make(lib, ps):
        return lib.optim.SGD(ps, lr=0.1, momentum=0.9)

    ours, theirs = _train(tw, make, unscale_first=True), _train(torch, make, unscale_first=True)
    assert ours[0] == theirs[0] and ours[1] == theirs[1]
    for a, b in zip(ours[2], theirs[2]):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_unscale_rounding_matches_torch(dtype):
    """Unscaled gradients are bit-identical to torch's (half precision unscales in float32 and rounds once)."""
    rng = np.random.default_rng(3)
    g = (rng.standard_normal((5, 7)) * 1e3).astype(np.float32)
    results = []
    for lib in (tw, torch):
        p = lib.nn.Parameter(_lib_tensor(lib, np.zeros((5, 7), np.float32), dtype))
        p.grad = _lib_tensor(lib, g, dtype)
        scaler = lib.amp.GradScaler("cpu", init_scale=3.0)
        scaler.scale(lib.ones(()))
        scaler.unscale_(lib.optim.SGD([p], lr=1.0))
        results.append(p.grad.double().numpy())
    np.testing.assert_array_equal(results[0], results[1])


def test_two_optimizers_skip_independently_and_share_the_update():
    """An inf in one optimizer's gradients skips only its step; the scale backs off once for the iteration."""
    outcomes = []
    for lib in (tw, torch):
        a, b = lib.nn.Parameter(lib.ones(3)), lib.nn.Parameter(lib.ones(3))
        opt_a, opt_b = lib.optim.SGD([a], lr=0.5), lib.optim.SGD([b], lr=0.5)
        scaler = lib.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)
        scaler.scale(lib.ones(()))
        a.grad = lib.tensor([4.0, float("inf"), 4.0])
        b.grad = lib.tensor([4.0, 8.0, 12.0])
        scaler.step(opt_a)
        scaler.step(opt_b)
        scaler.update()
        outcomes.append((a.detach().numpy().tolist(), b.detach().numpy().tolist(), scaler.get_scale()))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][2] == 2.0 and outcomes[0][0] == [1.0, 1.0, 1.0]


def test_growth_stops_at_float32_overflow():
    results = []
    for lib in (tw, torch):
        scaler = lib.amp.GradScaler("cpu", init_scale=2.0**127, growth_interval=1)
        p = lib.nn.Parameter(lib.ones(2))
        opt = lib.optim.SGD([p], lr=0.0)
        trackers = []
        for _ in range(2):
            scaler.scale(lib.ones(()))
            p.grad = lib.zeros(2)
            scaler.step(opt)
            scaler.update()
            trackers.append((scaler.get_scale(), scaler._get_growth_tracker()))
        results.append(trackers)
    assert results[0] == results[1] == [(2.0**127, 0), (2.0**127, 0)]


def test_scale_of_outputs_matches_torch():
    for lib in (tw, torch):
        scaler = lib.amp.GradScaler("cpu", init_scale=8.0)
        x = lib.tensor([1.0, 2.0]).half()
        y = scaler.scale(x)
        assert y.dtype == lib.float16 and y.tolist() == [8.0, 16.0]
        nested = scaler.scale([x, (x, x)])
        assert isinstance(nested, list) and isinstance(nested[1], tuple) and nested[1][1].tolist() == [8.0, 16.0]
        assert [t.tolist() for t in scaler.scale(t for t in [x])] == [[8.0, 16.0]]
        with pytest.raises(ValueError, match="outputs must be a Tensor or an iterable of Tensors"):
            scaler.scale([1.0])


def test_state_dict_round_trip_continues_the_run():
    """A scaler loaded from another's state dict (ours or torch's) continues exactly as the original does."""
    def run(lib, scaler, steps, inf_at=()):
        p = lib.nn.Parameter(lib.ones(2))
        opt = lib.optim.SGD([p], lr=0.0)
        out = []
        for k in range(steps):
            scaler.scale(lib.ones(()))
            p.grad = lib.tensor([float("inf") if k in inf_at else 1.0, 1.0])
            scaler.step(opt)
            scaler.update()
            out.append(scaler.get_scale())
        return out

    original = tw.amp.GradScaler("cpu", init_scale=16.0, growth_interval=2, growth_factor=3.0, backoff_factor=0.25)
    run(tw, original, 3, inf_at=(0,))
    saved = original.state_dict()
    reference = torch.amp.GradScaler("cpu", init_scale=16.0, growth_interval=2, growth_factor=3.0,
                                     backoff_factor=0.25)
    run(torch, reference, 3, inf_at=(0,))
    assert saved == reference.state_dict()
    for source in (saved, reference.state_dict()):
        fresh = tw.amp.GradScaler("cpu")
        fresh.load_state_dict(source)
        assert fresh.state_dict() == saved
        assert run(tw, fresh, 4) == run(torch, _torch_loaded(reference.state_dict()), 4)
    started = tw.amp.GradScaler("cpu")
    started.scale(tw.ones(()))
    started.load_state_dict(saved)  # fills the existing tensors
    assert started.get_scale() == saved["scale"] and started._get_growth_tracker() == saved["_growth_tracker"]


def _torch_loaded(state):
    scaler = torch.amp.GradScaler("cpu")
    scaler.load_state_dict(state)
    return scaler


def test_pickle_at_iteration_boundaries():
    scaler = tw.amp.GradScaler("cpu", init_scale=32.0)
    p = tw.nn.Parameter(tw.ones(2))
    opt = tw.optim.SGD([p], lr=0.1)
    scaler.scale(tw.ones(()))
    p.grad = tw.tensor([float("nan"), 0.0])
    scaler.step(opt)
    with pytest.raises(AssertionError, match="may only be pickled at the beginning of an iteration"):
        pickle.dumps(scaler)
    scaler.update()
    copy = pickle.loads(pickle.dumps(scaler))
    assert copy.get_scale() == 16.0 and copy.state_dict() == scaler.state_dict()


def test_disabled_scaler_is_transparent():
    for lib in (tw, torch):
        scaler = lib.amp.GradScaler("cpu", enabled=False)
        x = lib.ones(2)
        assert scaler.scale(x) is x and not scaler.is_enabled()
        p = lib.nn.Parameter(lib.ones(2))
        p.grad = lib.tensor([float("inf"), 1.0])
        scaler.step(lib.optim.SGD([p], lr=1.0))  # not skipped: a disabled scaler checks nothing
        assert np.isinf(p.detach().numpy()[0])
        scaler.update()
        scaler.unscale_(None)
        assert scaler.get_scale() == 1.0 and scaler.state_dict() == {} and scaler._get_growth_tracker() == 0
        scaler.load_state_dict({})


def _errors(lib):
    """The exception (type, message) of each misuse, in order."""
    found = []

    def attempt(fn):
        try:
            fn()
            found.append(None)
        except Exception as e:  # noqa: BLE001 — the point is to record it
            found.append((type(e).__name__, str(e).replace("torch", "tilewise")))

    p = lib.nn.Parameter(lib.ones(2))
    opt = lib.optim.SGD([p], lr=0.1)
    scaler = lib.amp.GradScaler("cpu")
    attempt(lambda: scaler.step(opt))
    attempt(lambda: scaler.unscale_(opt))
    attempt(lambda: scaler.update())
    scaler.scale(lib.ones(()))
    attempt(lambda: scaler.update())
    p.grad = lib.ones(2)
    attempt(lambda: scaler.step(opt, closure=lambda: None))
    attempt(lambda: scaler.unscale_(opt))
    attempt(lambda: scaler.unscale_(opt))
    attempt(lambda: scaler.step(opt))
    attempt(lambda: scaler.step(opt))
    attempt(lambda: scaler.unscale_(opt))
    attempt(lambda: scaler.update(lib.ones(2)))
    attempt(lambda: scaler.update(lib.ones(1, requires_grad=True)))
    attempt(lambda: scaler.update(lib.tensor([4.0])))
    attempt(lambda: scaler.update(2.0))
    found.append(scaler.get_scale())
    half = lib.nn.Parameter(lib.ones(2).half())
    half.grad = lib.ones(2).half()
    attempt(lambda: scaler.unscale_(lib.optim.SGD([half], lr=0.1)))
    attempt(lambda: lib.amp.GradScaler("cpu", growth_factor=1.0))
    attempt(lambda: lib.amp.GradScaler("cpu", backoff_factor=1.0))
    attempt(lambda: lib.amp.GradScaler("cpu").load_state_dict({}))
    return found


def test_errors_match_torch():
    ours, theirs = _errors(tw), _errors(torch)
    for k, (a, b) in enumerate(zip(ours, theirs)):
        if isinstance(a, tuple) and isinstance(b, tuple) and ("new_scale" in b[1] or "shape" in b[1]):
            assert a[0] == b[0], k  # torch names its tensor types here; copy_'s own shape error words differ
        else:
            assert a == b, k
    assert len(ours) == len(theirs)


class _SelfScaling:
    """An optimizer that unscales and skips by itself (torch's ``_step_supports_amp_scaling`` contract)."""

    _step_supports_amp_scaling = True

    def __init__(self, lib, params):
        self.param_groups = [{"params": params}]
        self.seen = []

    def step(self):
        self.seen.append((float(self.grad_scale.item()), float(self.found_inf.item())))


def test_self_scaling_optimizer_contract_matches_torch():
    seen = []
    for lib in (tw, torch):
        p = lib.nn.Parameter(lib.ones(2))
        opt = _SelfScaling(lib, [p])
        scaler = lib.amp.GradScaler("cpu", init_scale=4.0)
        for grad in ([1.0, 2.0], [float("inf"), 1.0]):
            scaler.scale(lib.ones(()))
            p.grad = lib.tensor(grad)
            scaler.step(opt)
            scaler.update()
        assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")
        assert p.grad.tolist() == [float("inf"), 1.0]  # the optimizer unscales, not the scaler
        seen.append(opt.seen)
    assert seen[0] == seen[1] == [(4.0, 0.0), (4.0, 1.0)]


def test_compiled_check_and_unscale_matches_eager():
    """The program the CUDA path runs (compiled over the list), here on the compiler's C target."""
    from tilewise.amp.grad_scaler import check_and_unscale_
    from tilewise.optim._foreach import compiled

    rng = np.random.default_rng(5)
    for bad in (None, np.inf, np.nan):
        arrays = [rng.standard_normal(s).astype(np.float32) * 1e4 for s in ((4, 5), (7,), ())]
        if bad is not None:
            arrays[1][3] = bad
        outs = []
        for run in (check_and_unscale_, compiled({}, "k", check_and_unscale_)):
            grads = [tw.tensor(a) for a in arrays] + [tw.tensor(arrays[0]).bfloat16()]
            found = tw.zeros(())
            run(grads[:3], found, tw.tensor(1 / 1024.0))
            run(grads[3:], found, tw.tensor(1 / 1024.0))
            outs.append((found.item(), [g.double().numpy() for g in grads]))
        assert outs[0][0] == outs[1][0] == (0.0 if bad is None else 1.0)
        for a, b in zip(outs[0][1], outs[1][1]):
            np.testing.assert_array_equal(a, b)


def test_step_inside_a_compiled_training_step_matches_eager():
    """``scaler.step`` reads found_inf on the host (torch's one synchronisation): inside ``tilewise.compile`` that
    is a graph break, and the compiled training step still trains as the eager one does."""
    def make():
        model = tw.nn.Linear(4, 3)
        model.weight.data.copy_(tw.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)))
        model.bias.data.zero_()
        opt = tw.optim.Adam(model.parameters(), lr=0.01)
        scaler = tw.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)

        def train_step(x, blow_up):
            opt.zero_grad()
            loss = model(x).square().mean() * blow_up
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            return loss

        return model, scaler, train_step

    results = []
    for compiled in (False, True):
        model, scaler, train_step = make()
        step = tw.compile(train_step) if compiled else train_step
        scales = []
        for k in range(6):
            x = tw.tensor(np.full((2, 4), 0.1 * (k + 1), np.float32))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # numpy on inf inputs
                step(x, tw.tensor(float("inf") if k == 2 else 1.0))
            scales.append(scaler.get_scale())
        results.append((scales, model.weight.detach().numpy()))
    assert results[0][0] == results[1][0] == [1024.0, 2048.0, 1024.0, 1024.0, 2048.0, 2048.0]
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-6, atol=1e-7)


def test_compiled_optimizer_step_reads_gradients_set_outside():
    """A compiled ``optimizer.step`` reads each parameter's ``.grad`` afresh on every call (it once kept the first
    call's gradient tensor, so later steps repeated the first update)."""
    results = []
    for compiled in (False, True):
        p = tw.nn.Parameter(tw.ones(2))
        opt = tw.optim.SGD([p], lr=0.1, weight_decay=0.5)
        step = tw.compile(lambda opt=opt: opt.step()) if compiled else opt.step
        for k in range(3):
            p.grad = tw.tensor([float(k), 10.0 * k])
            step()
        results.append(p.detach().numpy())
    np.testing.assert_array_equal(results[0], results[1])


def test_cuda_scaler_without_cuda_warns_and_disables():
    if tw.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.warns(UserWarning, match="CUDA is not available.  Disabling."):
        scaler = tw.amp.GradScaler()
    assert not scaler.is_enabled()


def test_deprecated_aliases_warn_as_torch():
    for name, make in [("tilewise.cuda.amp.GradScaler", lambda: tw.cuda.amp.GradScaler(enabled=False)),
                       ("tilewise.cpu.amp.GradScaler", lambda: tw.cpu.amp.GradScaler(init_scale=4.0)),
                       ("tilewise.cuda.amp.autocast", lambda: tw.cuda.amp.autocast()),
                       ("tilewise.cpu.amp.autocast", lambda: tw.cpu.amp.autocast())]:
        with pytest.warns(FutureWarning, match=f"`{name}\\(args...\\)` is deprecated"):
            made = make()
        assert isinstance(made, (tw.amp.GradScaler, tw.amp.autocast))
    with pytest.warns(FutureWarning):
        scaler = tw.cpu.amp.GradScaler(init_scale=4.0)
    assert scaler.get_scale() == 4.0 and scaler._device == "cpu"
    with pytest.warns(FutureWarning):
        region = tw.cpu.amp.autocast()
    with region:
        assert tw.is_autocast_enabled("cpu") and tw.get_autocast_dtype("cpu") is tw.bfloat16
    with pytest.warns(FutureWarning):
        region = tw.cuda.amp.autocast(dtype=tw.bfloat16)
    with region:
        # without CUDA, torch's CUDA autocast warns and stays off
        assert tw.is_autocast_enabled("cuda") is tw.cuda.is_available() and tw.get_autocast_dtype("cuda") is tw.bfloat16
    from tilewise.cuda.amp import GradScaler, autocast  # noqa: F401 — torch's import spelling works


@pytest.mark.cuda
def test_cuda_training_matches_cpu():
    """On CUDA the check-and-unscale runs compiled over each dtype's gradients; the run matches the CPU's."""
    def train(device):
        params0, grads = _arrays()
        params = [tw.nn.Parameter(tw.tensor(p).to(device)) for p in params0]
        opt = tw.optim.SGD(params, lr=0.1, momentum=0.9)
        scaler = tw.amp.GradScaler(device, init_scale=2.0**8, growth_interval=3)
        scales = []
        for step in range(STEPS):
            scaler.scale(tw.ones((), device=device))
            for p, g in zip(params, grads[step]):
                g = g * np.float32(scaler.get_scale())
                if step in BAD_STEPS and p.ndim == 2:
                    g[1, 2] = BAD_STEPS[step]
                p.grad = tw.tensor(g).to(device)
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        return scales, [p.detach().cpu().numpy() for p in params]

    cpu, gpu = train("cpu"), train("cuda")
    assert cpu[0] == gpu[0]
    for a, b in zip(cpu[1], gpu[1]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.cuda
def test_cuda_fp16_model_with_autocast_and_scaler_trains():
    model = tw.nn.Linear(16, 4).cuda()
    opt = tw.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = tw.amp.GradScaler("cuda")
    x = tw.randn(32, 16, device="cuda")
    losses = []
    for _ in range(20):
        opt.zero_grad()
        with tw.autocast("cuda"):
            loss = model(x).float().square().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert losses[-1] < losses[0] and scaler.get_scale() == 2.0**16
