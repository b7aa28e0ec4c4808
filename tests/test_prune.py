"""tilewise.nn.utils.prune against torch.nn.utils.prune: the same masks from the same weights, the same
reparametrization (``_orig`` parameter, ``_mask`` buffer, forward pre-hook), iterative pruning, global pruning,
``remove``, gradients through the mask, and the same errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.utils.prune as torch_prune

import tilewise as tw
import tilewise.nn.utils.prune as tw_prune

LIBS = {"torch": (torch, torch_prune), "tilewise": (tw, tw_prune)}


def _weights(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _both(build):
    """``build(lib, prune)`` for each library; the results as numpy where they are tensors."""
    out = {}
    for name, (lib, prune) in LIBS.items():
        result = build(lib, prune)
        out[name] = {k: (v.detach().numpy() if hasattr(v, "detach") else v) for k, v in result.items()}
    return out["torch"], out["tilewise"]


def _assert_same(theirs: dict, ours: dict):
    assert theirs.keys() == ours.keys()
    for key, value in theirs.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_allclose(ours[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
            assert ours[key].dtype == value.dtype, key
        else:
            assert ours[key] == value, key


def _linear(lib, seed=0, shape=(6, 8)):
    layer = lib.nn.Linear(shape[1], shape[0])
    with lib.no_grad():
        layer.weight.copy_(lib.tensor(_weights(seed, shape)))
        layer.bias.copy_(lib.tensor(_weights(seed + 1, shape[:1])))
    return layer


@pytest.mark.parametrize("amount", [0, 5, 0.3, 0.5, 1.0])
def test_l1_unstructured_masks_the_smallest_magnitudes_and_reparametrizes(amount):
    def build(lib, prune):
        layer = _linear(lib)
        prune.l1_unstructured(layer, "weight", amount=amount)
        x = lib.tensor(_weights(5, (3, 8)))
        out = layer(x)
        out.sum().backward()
        return {"mask": layer.weight_mask, "weight": layer.weight, "out": out, "grad": layer.weight_orig.grad,
                "params": sorted(n for n, _ in layer.named_parameters()),
                "buffers": sorted(n for n, _ in layer.named_buffers()),
                "state": sorted(layer.state_dict()), "pruned": prune.is_pruned(layer)}

    _assert_same(*_both(build))


@pytest.mark.parametrize("n,dim,amount", [(1, 0, 2), (2, 1, 0.25), (float("inf"), -1, 0.5), (3, 0, 0)])
def test_ln_structured_prunes_whole_channels_by_norm(n, dim, amount):
    def build(lib, prune):
        conv = lib.nn.Conv2d(3, 4, 2)
        with lib.no_grad():
            conv.weight.copy_(lib.tensor(_weights(2, (4, 3, 2, 2))))
        prune.ln_structured(conv, "weight", amount=amount, n=n, dim=dim)
        return {"mask": conv.weight_mask, "weight": conv.weight}

    _assert_same(*_both(build))


def test_pruning_twice_combines_the_methods_in_a_container_and_remove_makes_it_permanent():
    def build(lib, prune):
        layer = _linear(lib)
        prune.l1_unstructured(layer, "weight", amount=0.25)
        prune.ln_structured(layer, "weight", amount=2, n=2, dim=0)
        prune.l1_unstructured(layer, "weight", amount=3)
        hooks = [h for h in layer._forward_pre_hooks.values() if isinstance(h, prune.BasePruningMethod)]
        kinds = [type(m).__name__ for m in hooks[0]]
        mask = layer.weight_mask.clone()
        prune.remove(layer, "weight")
        x = lib.tensor(_weights(5, (3, 8)))
        return {"mask": mask, "kinds": kinds, "container": type(hooks[0]).__name__, "weight": layer.weight,
                "is_parameter": isinstance(layer.weight, lib.nn.Parameter), "out": layer(x),
                "state": sorted(layer.state_dict()), "pruned": prune.is_pruned(layer),
                "hooks": len(layer._forward_pre_hooks)}

    _assert_same(*_both(build))


def test_global_unstructured_chooses_across_tensors_and_custom_masks_combine():
    def build(lib, prune):
        model = lib.nn.Sequential(_linear(lib, 0, (6, 8)), lib.nn.ReLU(), _linear(lib, 3, (4, 6)))
        prune.custom_from_mask(model[0], "bias", mask=lib.tensor([1, 0, 1, 1, 0, 1]))
        prune.global_unstructured([(model[0], "weight"), (model[2], "weight"), (model[0], "bias")],
                                  pruning_method=prune.L1Unstructured, amount=20)
        scores = {(model[2], "bias"): lib.tensor(_weights(9, (4,)))}
        prune.global_unstructured([(model[2], "bias")], prune.L1Unstructured, importance_scores=scores, amount=1)
        prune.identity(model[2], "weight")
        x = lib.tensor(_weights(5, (3, 8)))
        return {"m0w": model[0].weight_mask, "m2w": model[2].weight_mask, "m0b": model[0].bias_mask,
                "m2b": model[2].bias_mask, "out": model(x), "pruned": prune.is_pruned(model),
                "kept": int(sum(m.sum() for n, m in model.named_buffers() if n.endswith("_mask")))}

    _assert_same(*_both(build))


def test_a_pruned_model_trains_and_only_the_kept_weights_move():
    def build(lib, prune):
        layer = _linear(lib)
        prune.l1_unstructured(layer, "weight", amount=0.5)
        opt = lib.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9)
        x, y = lib.tensor(_weights(5, (4, 8))), lib.tensor(_weights(6, (4, 6)))
        losses = []
        for _ in range(3):
            loss = lib.nn.functional.mse_loss(layer(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(round(loss.item(), 5))
        return {"losses": losses, "weight": layer.weight, "orig": layer.weight_orig}

    theirs, ours = _both(build)
    _assert_same(theirs, ours)
    assert (ours["weight"] == 0).sum() == 24


def test_random_methods_prune_the_asked_count():
    tw.manual_seed(0)
    layer = _linear(tw)
    tw_prune.random_unstructured(layer, "weight", amount=0.25)
    assert int((layer.weight_mask == 0).sum()) == 12
    conv = tw.nn.Conv2d(4, 6, 3)
    tw_prune.random_structured(conv, "weight", amount=2, dim=0)
    channels = conv.weight_mask.sum(dim=(1, 2, 3))
    assert sorted(channels.tolist()) == [0, 0, 36, 36, 36, 36]
    pruned = tw_prune.RandomUnstructured(amount=3).prune(tw.ones(10))
    assert int((pruned == 0).sum()) == 3


@pytest.mark.parametrize("call", [
    lambda lib, p, layer: p.l1_unstructured(layer, "weight", amount=-1),
    lambda lib, p, layer: p.l1_unstructured(layer, "weight", amount=1.5),
    lambda lib, p, layer: p.l1_unstructured(layer, "weight", amount="half"),
    lambda lib, p, layer: p.l1_unstructured(layer, "weight", amount=100),
    lambda lib, p, layer: p.ln_structured(layer, "bias", amount=1, n=2, dim=0),
    lambda lib, p, layer: p.ln_structured(layer, "weight", amount=1, n=2, dim=2),
    lambda lib, p, layer: p.remove(layer, "weight"),
    lambda lib, p, layer: p.global_unstructured([(layer, "weight")], p.LnStructured, amount=1, n=2, dim=0),
    lambda lib, p, layer: p.global_unstructured(5, p.L1Unstructured, amount=1),
    lambda lib, p, layer: p.global_unstructured([(layer, "weight")], p.L1Unstructured, importance_scores=[1],
                                                amount=1),
])
def test_bad_arguments_raise_torchs_errors_and_leave_the_module_alone(call):
    errors = {}
    for name, (lib, prune) in LIBS.items():
        layer = _linear(lib)
        with pytest.raises(Exception) as info:
            call(lib, prune, layer)
        text = str(info.value)
        for library_name in ("torch.Size", "tilewise.Size", "torch.nn.utils.prune", "tilewise.nn.utils.prune"):
            text = text.replace(library_name, "")
        errors[name] = (type(info.value), text)
        assert sorted(n for n, _ in layer.named_parameters()) == ["bias", "weight"], "the module is left as it was"
    assert errors["tilewise"][0] is errors["torch"][0]
    assert errors["tilewise"][1].split(" of module")[0] == errors["torch"][1].split(" of module")[0]


def test_the_method_classes_used_directly():
    def build(lib, prune):
        t = lib.tensor(_weights(4, (3, 4)))
        custom = prune.CustomFromMask(lib.tensor([[1, 0, 1, 1]] * 3)).prune(t)
        layer = _linear(lib)
        prune.l1_unstructured(layer, "weight", amount=2)
        prune.l1_unstructured(layer, "weight", amount=2)
        (hook,) = list(layer._forward_pre_hooks.values())
        lib.manual_seed(0)
        structured = prune.RandomStructured(amount=1, dim=1).compute_mask(t, lib.ones_like(t))
        return {"custom": custom, "container": isinstance(hook, prune.PruningContainer), "methods": len(hook),
                "pruned_columns": int((structured.sum(dim=0) == 0).sum())}

    _assert_same(*_both(build))
