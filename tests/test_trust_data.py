"""tilewise.utils.data against torch.utils.data as training scripts import and extend it."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.utils.data

import tilewise as tw
import tilewise.utils.data


class Box:
    """A sample type default_collate does not know, to be taught through ``default_collate_fn_map``."""

    def __init__(self, value: float) -> None:
        self.value = value


def _register_box(lib):
    collate_module = importlib.import_module(f"{lib.__name__}.utils.data._utils.collate")

    def collate_box_fn(batch, *, collate_fn_map=None):
        return lib.tensor([box.value for box in batch])

    collate_module.default_collate_fn_map[Box] = collate_box_fn
    return collate_module


@pytest.mark.parametrize("lib", [torch, tw], ids=["torch", "tilewise"])
def test_default_collate_extended_through_private_collate_module(lib):
    collate_module = _register_box(lib)
    try:
        samples = [{"box": Box(1.5), "label": 0}, {"box": Box(2.5), "label": 1}]
        batch = lib.utils.data.default_collate(samples)
        assert batch["box"].tolist() == [1.5, 2.5] and batch["label"].tolist() == [0, 1]
        loaded = next(iter(lib.utils.data.DataLoader(samples, batch_size=2)))
        assert loaded["box"].tolist() == [1.5, 2.5]
        direct = collate_module.collate([Box(3.0)], collate_fn_map=collate_module.default_collate_fn_map)
        assert direct.tolist() == [3.0]
        assert collate_module.default_collate is lib.utils.data.default_collate
        assert collate_module.default_convert is lib.utils.data.default_convert
    finally:
        del collate_module.default_collate_fn_map[Box]


class _WorkerInfoTypes:
    """Answers, inside a worker, whether ``get_worker_info()`` is an instance of ``_utils.worker.WorkerInfo``."""

    def __init__(self, lib) -> None:
        self.data = lib.utils.data

    def __getitem__(self, index):
        return isinstance(self.data.get_worker_info(), self.data._utils.worker.WorkerInfo)

    def __len__(self) -> int:
        return 1


@pytest.mark.parametrize("lib", [torch, tw], ids=["torch", "tilewise"])
def test_private_worker_module_reached_as_attributes(lib):
    utils = lib.utils.data._utils
    assert utils.worker.get_worker_info is lib.utils.data.get_worker_info
    assert utils.worker.get_worker_info() is None
    assert utils.MP_STATUS_CHECK_INTERVAL == torch.utils.data._utils.MP_STATUS_CHECK_INTERVAL
    assert callable(utils.pin_memory.pin_memory)
    loader = lib.utils.data.DataLoader(_WorkerInfoTypes(lib), batch_size=None, num_workers=1, timeout=30)
    assert list(loader) == [True]


@pytest.mark.parametrize("lib", [torch, tw], ids=["torch", "tilewise"])
def test_shuffle_with_a_generator_that_is_not_one_is_a_type_error(lib):
    loader = lib.utils.data.DataLoader(list(range(4)), shuffle=True, generator=3)
    with pytest.raises(TypeError, match="generator"):
        list(loader)
    with pytest.raises(TypeError, match="generator"):
        list(lib.utils.data.RandomSampler(range(4), generator="seed"))
    with pytest.raises(TypeError, match="generator"):
        lib.utils.data.random_split(range(4), [2, 2], generator=0)


@pytest.mark.parametrize("draw", [
    lambda lib: lib.rand(2, generator=3),
    lambda lib: lib.randperm(3, generator="x"),
    lambda lib: lib.randint(0, 3, (2,), generator=1.5),
    lambda lib: lib.multinomial(lib.ones(2), 1, generator=3),
    lambda lib: lib.ones(2).uniform_(generator=3),
    lambda lib: lib.zeros(1).random_(generator=3),
], ids=["rand", "randperm", "randint", "multinomial", "uniform_", "random_"])
def test_random_ops_refuse_a_generator_that_is_not_one(draw):
    with pytest.raises(TypeError, match="generator"):
        draw(torch)
    with pytest.raises(TypeError, match="argument 'generator' must be tilewise.Generator or None, but got"):
        draw(tw)
