"""torch.cuda's contexts, random-state functions, deprecated memory spellings and architecture queries: their
behaviour without a GPU here (torch's CPU build as the oracle where it answers), and on a GPU (marked ``cuda``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw

NO_GPU = not tw.cuda.is_available()


@pytest.mark.skipif(not NO_GPU, reason="the behaviour without a GPU")
def test_without_a_gpu_queries_answer_as_torchs_cpu_build():
    for lib in (torch, tw):
        assert lib.cuda.is_initialized() is False
        assert lib.cuda.get_rng_state_all() == []
        assert lib.cuda.is_tf32_supported() is False
        assert lib.cuda.get_arch_list() == [] and lib.cuda.get_gencode_flags() == ""
        lib.cuda.set_rng_state_all([])
        lib.cuda.seed()  # no GPU: changes nothing
        lib.cuda.seed_all()
        lib.cuda.set_stream(None)
        with lib.cuda.device(-1), lib.cuda.device_of(lib.ones(1)), lib.cuda.StreamContext(None):
            pass
    tw.manual_seed(3)
    first = tw.rand(3)
    tw.manual_seed(3)
    tw.cuda.seed_all()
    np.testing.assert_array_equal(tw.rand(3).numpy(), first.numpy()), "seeding CUDA without a GPU left the CPU alone"


@pytest.mark.skipif(not NO_GPU, reason="the behaviour without a GPU")
@pytest.mark.parametrize("call", [lambda: tw.cuda.get_rng_state(), lambda: tw.cuda.set_rng_state(tw.get_rng_state()),
                                  lambda: tw.cuda.initial_seed(), lambda: tw.cuda.can_device_access_peer(0, 1),
                                  lambda: tw.cuda.device(0).__enter__()])
def test_without_a_gpu_what_needs_one_raises_a_clear_error(call):
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        call()


def test_the_deprecated_memory_spellings_warn_as_torchs():
    import warnings

    if not NO_GPU:
        pytest.skip("compared with torch's CPU build")
    said = {}
    for lib in (torch, tw):
        for name in ("memory_cached", "max_memory_cached", "reset_max_memory_allocated", "reset_max_memory_cached"):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    getattr(lib.cuda, name)()
                except (AttributeError, RuntimeError):  # torch's CPU build cannot reset what it never had
                    pass
            said[lib.__name__, name] = [(w.category, str(w.message)) for w in caught]
    assert {k[1]: v for k, v in said.items() if k[0] == "tilewise"} == \
        {k[1]: v for k, v in said.items() if k[0] == "torch"}


@pytest.mark.cuda
def test_on_a_gpu_contexts_switch_and_restore_the_device_and_stream():
    assert tw.cuda.is_initialized() or tw.cuda.init() is None
    before = tw.cuda.current_device()
    with tw.cuda.device(0):
        assert tw.cuda.current_device() == 0
    assert tw.cuda.current_device() == before
    x = tw.ones(2, device="cuda")
    with tw.cuda.device_of(x):
        assert tw.cuda.current_device() == x.device.index
    s = tw.cuda.Stream()
    with tw.cuda.StreamContext(s):
        assert tw.cuda.current_stream() == s
    assert tw.cuda.current_stream() != s
    tw.cuda.set_stream(s)
    assert tw.cuda.current_stream() == s
    tw.cuda.set_stream(tw.cuda.default_stream())
    assert not tw.cuda.is_current_stream_capturing()
    assert tw.cuda.is_tf32_supported() == (tw.cuda.get_device_capability()[0] >= 8)
    arch = "sm_{}{}".format(*tw.cuda.get_device_capability())
    assert arch in tw.cuda.get_arch_list() and f"code={arch}" in tw.cuda.get_gencode_flags()
    assert tw.cuda.can_device_access_peer(0, 0) in (True, False)


@pytest.mark.cuda
def test_on_a_gpu_the_saved_random_state_replays_the_same_draws():
    tw.cuda.manual_seed(7)
    state = tw.cuda.get_rng_state()
    assert state.dtype == tw.uint8 and len(tw.cuda.get_rng_state_all()) == tw.cuda.device_count()
    first = tw.rand(4, device="cuda")
    tw.cuda.set_rng_state(state)
    np.testing.assert_array_equal(tw.rand(4, device="cuda").cpu().numpy(), first.cpu().numpy())
    tw.cuda.set_rng_state_all(tw.cuda.get_rng_state_all())
    assert tw.cuda.initial_seed() == 7
