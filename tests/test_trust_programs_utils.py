"""Programs that lean on torch's utilities, in styles people publish, run eagerly under torch and under tilewise
(``import tilewise as torch``) from the same initial weights and batches, as in ``test_trust_programs.py``, whose
helpers these use: a categorical VAE with a straight-through Gumbel-softmax, a training loop of schedulers, clipping,
weight averaging, gradient accumulation and an optimizer checkpoint, and a tabular classifier with embeddings,
class-weighted smoothed cross entropy, jacobians, hessians and per-sample gradients by vmap. Noise is drawn with numpy
and passed in. Below the programs, the failures they met, each reduced to a test.
"""
# ruff: noqa: N803, N806 — the programs keep the scripts' names (ANNEAL_RATE, T_0)

from __future__ import annotations

import io

import numpy as np
import pytest
import torch as real_torch
from test_trust_programs import assert_same, gradients, initial_state, numpy_of, run_both

import tilewise

LIBRARIES = [real_torch, tilewise]


# ----------------------------------------------------------------------------------------------------------------------
# A categorical VAE: Gumbel noise from uniforms added to the logits by hand, a softmax at an annealed temperature and
# the straight-through hard sample (a one-hot scattered at the argmax, y_hard - y.detach() + y), binary cross entropy
# summed over the batch, KL to a uniform prior with torch.log, OneHotCategorical log-probs of fixed one-hot samples as
# an auxiliary term, Adam with amsgrad.

def gumbel_vae(torch, init, batches, latent_dim=3, categorical_dim=4, temp_min=0.5, ANNEAL_RATE=0.1):
    nn, F = torch.nn, torch.nn.functional

    def sample_gumbel(u, eps=1e-20):
        return -torch.log(-torch.log(u + eps) + eps)

    def gumbel_softmax_sample(logits, u, temperature):
        y = logits + sample_gumbel(u)
        return F.softmax(y / temperature, dim=-1)

    def gumbel_softmax(logits, u, temperature, hard=False):
        y = gumbel_softmax_sample(logits, u, temperature)
        if not hard:
            return y.view(-1, latent_dim * categorical_dim)
        shape = y.size()
        _, ind = y.max(dim=-1)
        y_hard = torch.zeros_like(y).view(-1, shape[-1])
        y_hard.scatter_(1, ind.view(-1, 1), 1)
        y_hard = y_hard.view(*shape)
        y_hard = y_hard - y.detach() + y
        return y_hard.view(-1, latent_dim * categorical_dim)

    class VAEGumbel(nn.Module):
        def __init__(self, dim=12, hidden=16):
            super().__init__()
            self.fc1 = nn.Linear(dim, hidden)
            self.fc2 = nn.Linear(hidden, latent_dim * categorical_dim)
            self.fc3 = nn.Linear(latent_dim * categorical_dim, hidden)
            self.fc4 = nn.Linear(hidden, dim)
            self.relu = nn.ReLU()
            self.sigmoid = nn.Sigmoid()

        def encode(self, x):
            return self.fc2(self.relu(self.fc1(x)))

        def decode(self, z):
            return self.sigmoid(self.fc4(self.relu(self.fc3(z))))

        def forward(self, x, u, temp, hard):
            q = self.encode(x.view(x.size(0), -1))
            q_y = q.view(q.size(0), latent_dim, categorical_dim)
            z = gumbel_softmax(q_y, u, temp, hard)
            return self.decode(z), F.softmax(q_y, dim=-1).reshape(*q.size()), q_y

    def loss_function(recon_x, x, qy):
        BCE = F.binary_cross_entropy(recon_x, x.view(x.size(0), -1), reduction="sum") / x.shape[0]
        qy = qy.view(qy.size(0), latent_dim, categorical_dim)
        log_ratio = torch.log(qy * categorical_dim + 1e-20)
        KLD = torch.sum(qy * log_ratio, dim=-1).mean()
        return BCE + KLD

    model = VAEGumbel()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "temp": [], "log_prob": [],
              "hard": []}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, amsgrad=True)
    temp = 1.0
    for batch_idx, (data, u, samples) in enumerate(batches):
        data, u, samples = torch.from_numpy(data), torch.from_numpy(u), torch.from_numpy(samples)
        hard = batch_idx % 2 == 1
        optimizer.zero_grad()
        recon_batch, qy, q_y = model(data, u, temp, hard)
        loss = loss_function(recon_batch, data, qy)
        posterior = torch.distributions.OneHotCategorical(logits=q_y)
        log_prob = posterior.log_prob(samples)
        relaxed = torch.distributions.RelaxedOneHotCategorical(torch.tensor(float(temp)), logits=q_y)
        soft = gumbel_softmax_sample(q_y, u, temp)
        loss = loss - 0.01 * log_prob.mean() - 0.001 * relaxed.log_prob(soft.detach()).mean()
        loss.backward()
        optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
        record["log_prob"].append(numpy_of(log_prob))
        record["temp"].append(temp)
        if batch_idx % 2 == 1:
            temp = np.maximum(temp * np.exp(-ANNEAL_RATE * batch_idx), temp_min)
    model.eval()
    with torch.no_grad():
        data, u, samples = (torch.from_numpy(a) for a in batches[0])
        q_y = model.encode(data).view(-1, latent_dim, categorical_dim)
        z = gumbel_softmax(q_y, u, temp, hard=True)
        record["hard"] = numpy_of(z)
        assert bool((z.view(-1, latent_dim, categorical_dim).sum(-1) == 1).all())
        posterior = torch.distributions.OneHotCategorical(logits=q_y)
        record["entropy"] = numpy_of(posterior.entropy())
        record["probs"] = numpy_of(posterior.probs)
        record["mean"] = numpy_of(posterior.mean)
        record["mode"] = numpy_of(posterior.mode)
        record["support"] = numpy_of(posterior.enumerate_support())
        straight = torch.distributions.OneHotCategoricalStraightThrough(logits=q_y)
        record["straight_through"] = numpy_of(straight.log_prob(torch.from_numpy(batches[0][2])))
        drawn = posterior.sample((2,))
        assert tuple(drawn.shape) == (2, data.shape[0], latent_dim, categorical_dim)
        assert bool((drawn.sum(-1) == 1).all())
        soft = F.gumbel_softmax(q_y, tau=0.5, hard=True)
        assert bool((soft.sum(-1) == 1).all()) and tuple(soft.shape) == tuple(q_y.shape)
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def vae_batches(rng, steps=6, batch=5, dim=12, latent_dim=3, categorical_dim=4):
    out = []
    for _ in range(steps):
        data = (rng.random((batch, dim)) < 0.4).astype(np.float32)
        u = rng.random((batch, latent_dim, categorical_dim)).astype(np.float32)
        samples = np.eye(categorical_dim, dtype=np.float32)[rng.integers(0, categorical_dim, (batch, latent_dim))]
        out.append((data, u, samples))
    return out


def test_categorical_vae_with_straight_through_gumbel_softmax_trains_like_torch():
    ours, theirs = run_both(gumbel_vae, vae_batches(np.random.default_rng(0)))
    assert theirs["temp"][-1] < 1.0
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A training loop of utilities: LinearLR warmup then CosineAnnealingWarmRestarts under SequentialLR, Nesterov SGD,
# gradient accumulation over micro-batches (loss / accum), clip_grad_value_, an EMA of the weights by AveragedModel
# with get_ema_multi_avg_fn and its batch-norm statistics recomputed by update_bn; the optimizer's and scheduler's
# state saved with torch.save to a BytesIO mid-run and loaded into a fresh optimizer and scheduler that continue as
# the first would have. A second run steps ReduceLROnPlateau on a validation loss.

def scheduled_training(torch, init, batches, val, accum=2, resume_at=None):
    nn = torch.nn
    LinearLR, SequentialLR = torch.optim.lr_scheduler.LinearLR, torch.optim.lr_scheduler.SequentialLR
    CosineAnnealingWarmRestarts = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts
    AveragedModel, update_bn = torch.optim.swa_utils.AveragedModel, torch.optim.swa_utils.update_bn
    get_ema_multi_avg_fn = torch.optim.swa_utils.get_ema_multi_avg_fn

    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    record = {"init": initial_state(torch, model, init), "loss": [], "lr": [], "grads": []}

    def make_optimizer():
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
        warmup = LinearLR(optimizer, start_factor=0.1, total_iters=3)
        restarts = CosineAnnealingWarmRestarts(optimizer, T_0=2, T_mult=2, eta_min=1e-3)
        return optimizer, SequentialLR(optimizer, schedulers=[warmup, restarts], milestones=[3])

    optimizer, scheduler = make_optimizer()
    ema_model = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    criterion = nn.CrossEntropyLoss()
    for step, micro_batches in enumerate(batches):
        if step == resume_at:
            buffer = io.BytesIO()
            torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, buffer)
            buffer.seek(0)
            checkpoint = torch.load(buffer)
            optimizer, scheduler = make_optimizer()
            optimizer.load_state_dict(checkpoint["optimizer"])
            scheduler.load_state_dict(checkpoint["scheduler"])
        model.train()
        total = 0.0
        for x, y in micro_batches:
            loss = criterion(model(torch.from_numpy(x)), torch.from_numpy(y)) / accum
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_value_(model.parameters(), clip_value=0.2)
        record["grads"].append(gradients(model))
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        ema_model.update_parameters(model)
        record["loss"].append(total)
        record["lr"].append(scheduler.get_last_lr()[0])
    loader = [torch.from_numpy(x) for micro_batches in batches for x, _ in micro_batches]
    update_bn(loader, ema_model)
    ema_model.eval()
    model.eval()
    with torch.no_grad():
        record["val"] = numpy_of(model(torch.from_numpy(val[0])))
        record["val_ema"] = numpy_of(ema_model(torch.from_numpy(val[0])))
    record["n_averaged"] = int(ema_model.n_averaged)
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    record["ema"] = {k: numpy_of(v) for k, v in ema_model.state_dict().items()}
    record["optimizer"] = {k: v for k, v in optimizer.state_dict()["param_groups"][0].items() if k != "params"}
    return record


def plateau_training(torch, init, batches, val, epochs=8):
    nn, F = torch.nn, torch.nn.functional
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    record = {"init": initial_state(torch, model, init), "val": [], "lr": [], "bad": []}
    optimizer = torch.optim.Adam([{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 3e-2}],
                                 lr=5e-2)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=1,
                                                           threshold=1e-3, cooldown=1, min_lr=[1e-3, 5e-3])
    x_val, y_val = (torch.from_numpy(a) for a in val)
    for epoch in range(epochs):
        model.train()
        for x, y in batches[epoch % len(batches)]:
            optimizer.zero_grad()
            F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            val_loss = F.cross_entropy(model(x_val), y_val).item() + (0.5 if epoch < 2 else 0.0) + 0.05 * epoch
        scheduler.step(val_loss)
        record["val"].append(val_loss)
        record["lr"].append([group["lr"] for group in optimizer.param_groups])
        record["bad"].append([scheduler.num_bad_epochs, scheduler.cooldown_counter, scheduler.best])
    record["last_lr"] = scheduler.get_last_lr()
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def utility_batches(rng, steps=8, accum=2, batch=4):
    batches = [[(rng.standard_normal((batch, 6)).astype(np.float32), rng.integers(0, 3, batch)) for _ in range(accum)]
               for _ in range(steps)]
    return batches, (rng.standard_normal((6, 6)).astype(np.float32), rng.integers(0, 3, 6))


def test_warmup_restarts_clipping_accumulation_and_weight_averaging_train_like_torch_and_resume_from_bytes():
    batches, val = utility_batches(np.random.default_rng(1))
    ours, theirs = run_both(scheduled_training, batches, val)
    assert len(set(np.round(theirs["lr"], 6))) > 4  # the warmup and the restarts each moved the rate
    assert_same(ours, theirs)
    for torch, straight in ((real_torch, theirs), (tilewise, ours)):
        resumed = scheduled_training(torch, theirs["init"], batches, val, resume_at=4)
        assert_same(resumed, straight, rtol=0, atol=0)  # a fresh optimizer from the saved state continues as the first


def test_reduce_lr_on_plateau_on_a_validation_loss_steps_like_torch():
    batches, val = utility_batches(np.random.default_rng(2), steps=3)
    ours, theirs = run_both(plateau_training, batches, val)
    assert theirs["lr"][-1][0] < 5e-2  # the plateau cut the rate
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A tabular classifier: an nn.Embedding per categorical column (sizes by a rule of thumb) concatenated with numeric
# columns normalised by the training set's statistics, BatchNorm1d, dropout trained at p=0 and raised for an eval-mode
# comparison, CrossEntropyLoss with inverse-frequency class weights and label smoothing, AdamW with a StepLR; then
# autograd.functional.jacobian and hessian of the loss with respect to a small numeric input, and per-sample gradients
# by torch.func.vmap(grad(...)) over functional_call.

def tabular(torch, init, batches, cardinalities=(5, 3, 7), n_num=4, n_classes=3):
    nn, F = torch.nn, torch.nn.functional
    functional_call, grad, vmap = torch.func.functional_call, torch.func.grad, torch.func.vmap

    class TabularModel(nn.Module):
        def __init__(self, emb_szs, n_cont, out_sz, layers=(16, 8), p=0.0):
            super().__init__()
            self.embeds = nn.ModuleList([nn.Embedding(ni, nf) for ni, nf in emb_szs])
            self.emb_drop = nn.Dropout(p)
            self.bn_cont = nn.BatchNorm1d(n_cont)
            layerlist, n_in = [], sum(nf for _, nf in emb_szs) + n_cont
            for i in layers:
                layerlist += [nn.Linear(n_in, i), nn.ReLU(inplace=True), nn.BatchNorm1d(i), nn.Dropout(p)]
                n_in = i
            layerlist.append(nn.Linear(layers[-1], out_sz))
            self.layers = nn.Sequential(*layerlist)

        def forward(self, x_cat, x_cont):
            embeddings = [e(x_cat[:, i]) for i, e in enumerate(self.embeds)]
            x = self.emb_drop(torch.cat(embeddings, 1))
            x_cont = self.bn_cont(x_cont)
            return self.layers(torch.cat([x, x_cont], 1))

    emb_szs = [(size, min(50, (size + 1) // 2)) for size in cardinalities]
    model = TabularModel(emb_szs, n_num, n_classes)
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "lr": []}
    all_num = torch.from_numpy(np.concatenate([b[1] for b in batches]))
    all_y = torch.from_numpy(np.concatenate([b[2] for b in batches]))
    mean, std = all_num.mean(dim=0), all_num.std(dim=0, keepdim=True)
    counts = torch.bincount(all_y, minlength=n_classes)
    weights = (counts.sum() / (n_classes * counts.clamp(min=1))).float()
    record["weights"] = numpy_of(weights)
    criterion = nn.CrossEntropyLoss(weight=weights, label_smoothing=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    for x_cat, x_num, y in batches:
        x_cat, y = torch.from_numpy(x_cat), torch.from_numpy(y)
        x_num = (torch.from_numpy(x_num) - mean) / std
        model.train()
        optimizer.zero_grad()
        loss = criterion(model(x_cat, x_num), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
        record["lr"].append(scheduler.get_last_lr()[0])

    x_cat, x_num, y = batches[0]
    x_cat, y = torch.from_numpy(x_cat), torch.from_numpy(y)
    x_num = (torch.from_numpy(x_num) - mean) / std
    model.eval()
    with torch.no_grad():
        before = model(x_cat, x_num)
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.5
        after = model(x_cat, x_num)
    assert torch.equal(before, after)  # dropout is the identity in eval mode
    record["eval"] = numpy_of(after)
    record["eval_loss"] = criterion(after, y).item()
    record["unweighted"] = F.cross_entropy(after, y, label_smoothing=0.1, reduction="none").tolist()

    small_cat, small_num, small_y = x_cat[:2], x_num[:2].clone(), y[:2]

    def loss_of_numbers(numbers):
        return criterion(model(small_cat, numbers), small_y)

    def probabilities(numbers):
        return F.softmax(model(small_cat, numbers), dim=-1)

    record["jacobian"] = numpy_of(torch.autograd.functional.jacobian(probabilities, small_num))
    record["jacobian_loss"] = numpy_of(torch.autograd.functional.jacobian(loss_of_numbers, small_num))
    record["hessian"] = numpy_of(torch.autograd.functional.hessian(loss_of_numbers, small_num))
    record["hessian_vectorized"] = numpy_of(torch.autograd.functional.hessian(loss_of_numbers, small_num,
                                                                              vectorize=True))

    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def compute_loss(params, buffers, cat, num, target):
        out = functional_call(model, (params, buffers), (cat.unsqueeze(0), num.unsqueeze(0)))
        return F.cross_entropy(out, target.unsqueeze(0))

    per_sample = vmap(grad(compute_loss), in_dims=(None, None, 0, 0, 0))(params, buffers, x_cat, x_num, y)
    record["per_sample"] = {k: numpy_of(v) for k, v in per_sample.items()}
    model.zero_grad()
    F.cross_entropy(model(x_cat, x_num), y, reduction="sum").backward()
    for name, p in model.named_parameters():  # the per-sample gradients add up to the batch's
        np.testing.assert_allclose(numpy_of(per_sample[name].sum(0)), numpy_of(p.grad), rtol=1e-4, atol=1e-5)
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def tabular_batches(rng, steps=5, batch=8, cardinalities=(5, 3, 7), n_num=4, n_classes=3):
    out = []
    for _ in range(steps):
        x_cat = np.stack([rng.integers(0, c, batch) for c in cardinalities], axis=1)
        x_num = (rng.standard_normal((batch, n_num)) * [1.0, 10.0, 0.1, 3.0] + [0.0, 50.0, -1.0, 2.0])
        y = rng.choice(n_classes, batch, p=[0.6, 0.3, 0.1])
        out.append((x_cat, x_num.astype(np.float32), y))
    return out


def test_tabular_classifier_with_embeddings_weighted_smoothed_loss_jacobians_and_per_sample_grads_like_torch():
    ours, theirs = run_both(tabular, tabular_batches(np.random.default_rng(3)))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# What the programs met, reduced.

def test_a_numpy_scalar_given_for_a_tensor_argument_is_a_python_number_to_autograd():
    # the annealed temperature, np.maximum of floats, is an np.float64: div's derivative divided by it as a number
    for torch in LIBRARIES:
        x = torch.ones(3, requires_grad=True)
        (x / np.float64(0.5) + x * np.float32(2.0) - np.int64(1) * x).sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0, 3.0])


@pytest.mark.parametrize("expression", ["s * x", "s - x", "s / x", "s ** x", "s + x", "s % x"])
def test_a_numpy_scalar_on_the_left_of_a_tensor_gives_a_tensor_on_the_graph(expression):
    # numpy defers to the tensor's reflected operator (array priority), as it does for torch's tensors
    for torch in LIBRARIES:
        x = torch.tensor([0.5, 2.0], requires_grad=True)
        out = eval(expression, {"s": np.float64(2.0), "x": x})
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.grad_fn is not None
        expected = eval(expression, {"s": 2.0, "x": x})
        np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy())


@pytest.mark.filterwarnings("ignore:__array_wrap__ must accept context:DeprecationWarning")  # torch's own wrap
def test_numpy_functions_of_tensors_give_tensors_as_in_torch():
    for torch in LIBRARIES:
        x = torch.tensor([0.0, 1.0])
        assert isinstance(np.sin(x), torch.Tensor) and np.sin(torch.tensor(1.0)).shape == ()
        plus = x + np.ones(2)  # numpy's sum of the two, wrapped back
        assert isinstance(plus, torch.Tensor) and plus.dtype == torch.float64
        assert np.greater(x, 0.5).dtype == torch.uint8
        assert (3 << torch.tensor([1])).tolist() == [6] and (64 >> torch.tensor([2])).tolist() == [16]
        with pytest.raises(TypeError, match="unsupported operand"):
            np.ones(2) * x


LOGITS = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)


def relaxed_record(torch, name, probs=False):
    logits = torch.tensor(LOGITS, requires_grad=True)
    temperature = torch.tensor(0.7, requires_grad=True)
    params = {"probs": torch.softmax(logits, -1) if name == "RelaxedOneHotCategorical" else torch.sigmoid(logits)} \
        if probs else {"logits": logits}
    dist = getattr(torch.distributions, name)(temperature, **params)
    value = torch.softmax(torch.tensor(LOGITS) * 2, -1) if name == "RelaxedOneHotCategorical" \
        else torch.sigmoid(torch.tensor(LOGITS) * 2)
    log_prob = dist.log_prob(value)
    draw = dist.rsample((2,))
    expanded = dist.expand((5,) + tuple(dist.batch_shape))
    return {"log_prob": numpy_of(log_prob), "grads": [numpy_of(g) for g in torch.autograd.grad(log_prob.sum(),
                                                                                              [logits, temperature])],
            "shapes": [list(dist.batch_shape), list(dist.event_shape), list(draw.shape), list(expanded.batch_shape)],
            "probs": numpy_of(dist.probs), "logits": numpy_of(dist.logits),
            "expanded": numpy_of(expanded.log_prob(value)),
            "rsample": [draw.requires_grad, dist.has_rsample]}


@pytest.mark.parametrize("probs", [False, True], ids=["logits", "probs"])
@pytest.mark.parametrize("name", ["RelaxedOneHotCategorical", "RelaxedBernoulli"])
def test_relaxed_distributions_of_gumbel_softmax_give_torch_log_probs_and_gradients(name, probs):
    assert_same(relaxed_record(tilewise, name, probs), relaxed_record(real_torch, name, probs))


@pytest.mark.parametrize("name", ["Bernoulli", "Categorical", "OneHotCategorical", "OneHotCategoricalStraightThrough"])
def test_probabilities_first_read_while_sampling_keep_their_gradient(name):
    # probs computed from logits on first use, inside sample's no_grad, are computed with grad as torch's lazy_property
    records = []
    for torch in LIBRARIES:
        logits = torch.tensor(LOGITS, requires_grad=True)
        dist = getattr(torch.distributions, name)(logits=logits)
        dist.sample()
        records.append(numpy_of(torch.autograd.grad(dist.probs.sum() + dist.entropy().sum(), logits)[0]))
    assert_same(records[1], records[0])


def test_straight_through_one_hot_draws_carry_the_gradient_of_the_probabilities():
    records = []
    for torch in LIBRARIES:
        logits = torch.tensor(LOGITS, requires_grad=True)
        dist = torch.distributions.OneHotCategoricalStraightThrough(logits=logits)
        draw = dist.rsample((2,))
        assert bool((draw.detach().sum(-1) == 1).all()) and dist.has_rsample
        weights = torch.arange(4.0)
        grad, = torch.autograd.grad((draw * weights).sum(), logits)
        records.append([numpy_of(grad), list(dist.param_shape), numpy_of(dist.log_prob(torch.eye(4)[[0, 2, 3]]))])
    assert_same(records[1], records[0])


def test_a_transformed_distribution_sums_an_elementwise_log_det_over_its_event():
    records = []
    for torch in LIBRARIES:
        D = torch.distributions
        base = D.Independent(D.Normal(torch.zeros(2, 3), torch.ones(2, 3)), 1)
        dist = D.TransformedDistribution(base, [D.ExpTransform(), D.AffineTransform(0.5, 2.0)])
        records.append(numpy_of(dist.log_prob(torch.full((2, 3), 1.5))))
    assert records[0].shape == (2,)
    assert_same(records[1], records[0])


def test_a_dense_tensor_answers_torch_s_layout_and_kind_flags():
    # a hand-written update asks p.grad.is_sparse before its dense arithmetic
    for torch in LIBRARIES:
        grad = torch.ones(2)
        flags = [grad.is_sparse, grad.is_sparse_csr, grad.is_quantized, grad.is_mkldnn, grad.is_nested]
        assert flags == [False] * 5
        with pytest.raises(AttributeError):
            grad.is_sparse = True


@pytest.mark.parametrize("call", [
    lambda t: t.nn.functional.cross_entropy(t.zeros(2, 3), t.tensor([0, 2]), weight=t.ones(3, dtype=t.float64)),
    lambda t: t.nn.CrossEntropyLoss(weight=t.ones(3, dtype=t.float64), label_smoothing=0.1)(t.zeros(2, 3),
                                                                                            t.tensor([0, 2])),
    lambda t: t.nn.functional.nll_loss(t.zeros(2, 3, dtype=t.float64), t.tensor([0, 2]), weight=t.ones(3)),
    lambda t: t.nn.functional.cross_entropy(t.zeros(2, 3), t.tensor([0, 2]), weight=t.ones(3, dtype=t.int64)),
], ids=["double weight", "double weight smoothed", "float weight of double input", "long weight"])
def test_class_weights_of_another_dtype_than_the_input_are_refused_as_torch(call):
    # inverse-frequency weights computed in float64 (counts.sum() / counts) must be cast to the logits' dtype
    messages = []
    for torch in LIBRARIES:
        with pytest.raises(RuntimeError, match="expected scalar type") as info:
            call(torch)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


STRICT_REFUSALS = {
    "jacobian of a constant": lambda t, x: t.autograd.functional.jacobian(lambda a: t.ones(2), x, strict=True),
    "jacobian, an unused input": lambda t, x: t.autograd.functional.jacobian(lambda a, b: a * 2, (x, x), strict=True),
    "jacobian of a linear map, create_graph": lambda t, x: t.autograd.functional.jacobian(
        lambda a: a * 2, x, strict=True, create_graph=True),
    "jacobian, strict and vectorize": lambda t, x: t.autograd.functional.jacobian(lambda a: a * 2, x, strict=True,
                                                                                  vectorize=True),
    "hessian of a linear function": lambda t, x: t.autograd.functional.hessian(lambda a: a.sum(), x, strict=True),
    "hessian, an input only linear": lambda t, x: t.autograd.functional.hessian(lambda a, b: (a * a + b).sum(),
                                                                                (x, x), strict=True),
    "hessian of a vector": lambda t, x: t.autograd.functional.hessian(lambda a: a.pow(3), x),
    "hessian of a tuple": lambda t, x: t.autograd.functional.hessian(lambda a: (a.sum(), a.sum()), x),
    "vjp of a constant": lambda t, x: t.autograd.functional.vjp(lambda a: t.ones(2), x, t.ones(2), strict=True),
    "vjp, an unused input": lambda t, x: t.autograd.functional.vjp(lambda a, b: a * 2, (x, x), t.ones(2, 3),
                                                                   strict=True),
}


@pytest.mark.parametrize("case", STRICT_REFUSALS)
def test_autograd_functional_strict_mode_refuses_as_torch(case):
    # strict=True was taken and ignored: a function independent of an input gave zeros instead of torch's error
    messages = []
    for torch in LIBRARIES:
        with pytest.raises(RuntimeError) as info:
            STRICT_REFUSALS[case](torch, torch.ones(2, 3))
        messages.append(str(info.value))
    assert messages[1] == messages[0]


def test_autograd_functional_strict_mode_accepts_what_torch_accepts():
    records = []
    for torch in LIBRARIES:
        F = torch.autograd.functional
        x = torch.tensor([[0.5, 1.0, 2.0], [1.5, -1.0, 0.25]])
        records.append([numpy_of(F.jacobian(lambda a: a.pow(2), x, strict=True, create_graph=True)),
                        numpy_of(F.hessian(lambda a: a.pow(3).sum(), x, strict=True)),
                        numpy_of(F.vjp(lambda a: a.sin(), x, torch.ones(2, 3), strict=True)[1])])
    assert_same(records[1], records[0])


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")  # torch's tracing of the jvp warns
def test_func_linearize_gives_the_value_and_a_jvp_function_as_torch():
    records = []
    for torch in LIBRARIES:
        x, y = torch.tensor([0.5, 1.0]), torch.tensor([[1.0, 2.0]])
        out, jvp_fn = torch.func.linearize(lambda a, b: (a.sin() * b, {"s": a.exp().sum()}), x, y)
        tangent, aux = jvp_fn(torch.tensor([1.0, -1.0]), torch.ones(1, 2))
        with pytest.raises(RuntimeError, match="tangent:0 with shape"):
            jvp_fn(torch.ones(3), torch.ones(1, 2))
        with pytest.raises(RuntimeError, match="to have the same argspec as the primals"):
            jvp_fn(torch.ones(2))
        records.append([numpy_of(out[0]), numpy_of(tangent), numpy_of(aux["s"])])
    assert_same(records[1], records[0])


def test_nn_utils_stateless_functional_call_is_the_deprecated_spelling_of_func_functional_call():
    records = []
    for torch in LIBRARIES:
        params = {"weight": torch.ones(2, 3), "bias": torch.tensor([0.5, -0.5])}
        with pytest.warns(FutureWarning, match="stateless.functional_call` is deprecated"):
            records.append(numpy_of(torch.nn.utils.stateless.functional_call(torch.nn.Linear(3, 2), params,
                                                                             (torch.ones(4, 3),))))
    assert_same(records[1], records[0])


@pytest.mark.parametrize("groups", [[[2]], [[1, 1]]], ids=["a larger group", "another group"])
def test_an_optimizer_state_of_other_groups_is_refused_with_torch_s_message(groups):
    # a fresh optimizer built for the resumed run must have the saved run's groups
    messages = []
    for torch in LIBRARIES:
        p = torch.nn.Parameter(torch.ones(2))
        saved = torch.optim.Adam([p], amsgrad=True).state_dict()
        fresh = torch.optim.Adam([{"params": ([p] if i == 0 else []) + [torch.nn.Parameter(torch.ones(1))
                                                                         for _ in range(n - (i == 0))]}
                                  for i, n in enumerate(groups[0])], amsgrad=True)
        with pytest.raises(ValueError) as info:
            fresh.load_state_dict(saved)
        messages.append(str(info.value))
    assert messages[0] in messages[1]


def test_gumbel_softmax_copied_from_torch_s_source_runs_with_its_legacy_memory_format():
    # torch's F.gumbel_softmax builds its one-hot by zeros_like(logits, memory_format=torch.legacy_contiguous_format)
    records = []
    for torch in LIBRARIES:
        logits = torch.tensor(LOGITS, requires_grad=True)
        y_soft = torch.softmax(logits / 0.5, -1)
        index = y_soft.max(-1, keepdim=True)[1]
        y_hard = torch.zeros_like(logits, memory_format=torch.legacy_contiguous_format).scatter_(-1, index, 1.0)
        ret = y_hard - y_soft.detach() + y_soft
        records.append([numpy_of(ret), numpy_of(torch.autograd.grad((ret * torch.arange(4.0)).sum(), logits)[0])])
        assert torch.legacy_contiguous_format is torch.contiguous_format
    assert_same(records[1], records[0])


NUMPY_INTEGERS = {
    # sizes, dims and counts read off numpy arrays (a column's cardinality, np.max of lengths) are numpy integers
    "zeros(np.int64)": lambda t: t.zeros(np.int64(2)),
    "zeros((np.int64, np.int32))": lambda t: t.zeros((np.int64(2), np.int32(3))),
    "randn(np.int64, 3).shape": lambda t: t.tensor(list(t.randn(np.int64(2), 3).shape)),
    "eye(np.int64)": lambda t: t.eye(np.int64(3)),
    "sum(np.int64)": lambda t: t.arange(6.0).reshape(2, 3).sum(np.int64(1)),
    "x.mean(dim=np.int64)": lambda t: t.arange(6.0).reshape(2, 3).mean(dim=np.int64(0)),
    "clamp(np.float64)": lambda t: t.arange(4.0).clamp(np.float64(0.5), np.float64(2.5)),
    "add(alpha=np.float64)": lambda t: t.arange(3.0).add(t.ones(3), alpha=np.float64(0.5)),
    # the factories take their size by keyword too
    "zeros(size=)": lambda t: t.zeros(size=(2, 3)),
    "ones(size=)": lambda t: t.ones(size=[2]),
    "empty(size=).shape": lambda t: t.tensor(list(t.empty(size=(1, 2)).shape)),
    "rand(size=).shape": lambda t: t.tensor(list(t.rand(size=(3,)).shape)),
    "randn(size=).shape": lambda t: t.tensor(list(t.randn(size=(3,), dtype=t.float64).shape)),
    "randint(high, size=).shape": lambda t: t.tensor(list(t.randint(5, size=(2, 2)).shape)),
}


@pytest.mark.parametrize("case", NUMPY_INTEGERS)
def test_numpy_integers_and_keyword_sizes_are_taken_as_torch_takes_them(case):
    expected, ours = NUMPY_INTEGERS[case](real_torch), NUMPY_INTEGERS[case](tilewise)
    assert str(ours.dtype).split(".")[-1] == str(expected.dtype).split(".")[-1]
    np.testing.assert_array_equal(ours.numpy(), expected.numpy())


def test_a_size_given_twice_is_refused_as_torch():
    for torch in LIBRARIES:
        with pytest.raises(TypeError, match="zeros\\(\\) got multiple values for argument 'size'"):
            torch.zeros((2,), size=(2,))


def batch_norm_ensemble(torch):
    F = torch.func
    x = torch.from_numpy(np.random.default_rng(6).standard_normal((6, 3)).astype(np.float32))
    models = []
    for i in range(3):
        m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        with torch.no_grad():
            for j, p in enumerate(m.parameters()):
                p.copy_(torch.linspace(-1, 1, p.numel()).reshape(p.shape) * (i + 1) * (j + 1) / 3)
        assert F.replace_all_batch_norm_modules_(m) is m
        models.append(m)
    assert models[0][1].running_mean is None and not models[0][1].track_running_stats
    params, buffers = F.stack_module_state(models)

    def loss(p, b, x):
        return F.functional_call(models[0], (p, b), (x,)).pow(2).mean()

    grads = F.vmap(F.grad(loss), in_dims=(0, 0, None))(params, buffers, x)
    return {"buffers": sorted(buffers), "loss": numpy_of(F.vmap(loss, in_dims=(0, 0, None))(params, buffers, x)),
            "grads": {k: numpy_of(v) for k, v in grads.items() if k != "0.bias"}}  # 0.bias: a batch norm follows


def test_an_ensemble_of_batch_norm_models_vmapped_after_replace_all_batch_norm_modules_as_torch():
    assert_same(batch_norm_ensemble(tilewise), batch_norm_ensemble(real_torch), atol=1e-5)


def gumbel_record(torch, loc, scale):
    loc = torch.tensor(loc, requires_grad=True) if isinstance(loc, list) else loc
    scale = torch.tensor(scale, requires_grad=True) if isinstance(scale, list) else scale
    dist = torch.distributions.Gumbel(loc, scale)
    value = torch.tensor([0.5, -1.0])
    log_prob = dist.log_prob(value)
    record = {"log_prob": numpy_of(log_prob), "moments": [numpy_of(dist.mean), numpy_of(dist.mode),
                                                          numpy_of(dist.stddev), numpy_of(dist.entropy())],
              "cdf": numpy_of(dist.cdf(value)), "icdf": numpy_of(dist.icdf(torch.tensor([0.2, 0.7]))),
              "shapes": [list(dist.batch_shape), list(dist.sample((3,)).shape)]}
    if isinstance(scale, torch.Tensor):
        record["grad"] = numpy_of(torch.autograd.grad(log_prob.sum() + dist.cdf(value).sum(), scale)[0])
    return record


@pytest.mark.parametrize("loc, scale", [(0.0, 1.0), ([0.0, 1.0], [1.0, 2.0])], ids=["numbers", "tensors"])
def test_the_gumbel_distribution_of_the_noise_gives_torch_values(loc, scale):
    # the Gumbel noise of a Gumbel-softmax, drawn from torch.distributions.Gumbel(0, 1) in many scripts; its
    # transforms invert through Transform.inv (an inverse transform, as torch's)
    assert_same(gumbel_record(tilewise, loc, scale), gumbel_record(real_torch, loc, scale))
    for torch in LIBRARIES:
        inverse = torch.distributions.ExpTransform().inv
        assert repr(inverse) == "_InverseTransform(ExpTransform())" and repr(inverse.inv) == "ExpTransform()"


BITWISE_REFUSALS = {
    # a mask combined with a numpy bool (np.bool_ reads as the number 1.0 to torch) and bitwise operators of floats
    "bool tensor | np.bool_": (lambda t: t.tensor([True]) | np.bool_(False), NotImplementedError,
                               "\"bitwise_or_cpu\" not implemented for 'Float'"),
    "int tensor & 1.5": (lambda t: t.tensor([1]) & 1.5, NotImplementedError,
                         "\"bitwise_and_cpu\" not implemented for 'Float'"),
    "float ^ float": (lambda t: t.tensor([1.5]) ^ t.tensor([1.0]), NotImplementedError,
                      "\"bitwise_xor_cpu\" not implemented for 'Float'"),
    "half << 1": (lambda t: t.tensor([1.5], dtype=t.float16) << 1, NotImplementedError,
                  "\"lshift_cpu\" not implemented for 'Half'"),
    "bitwise_not(float)": (lambda t: t.bitwise_not(t.tensor([1.5])), NotImplementedError,
                           "\"bitwise_not_cpu\" not implemented for 'Float'"),
    "~float": (lambda t: ~t.tensor([1.5]), TypeError,
               "~ (operator.invert) is only implemented on integer and Boolean-type tensors"),
}


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
@pytest.mark.parametrize("case", BITWISE_REFUSALS)
def test_bitwise_operators_refuse_floating_operands_as_torch(torch, case):
    call, error, message = BITWISE_REFUSALS[case]
    with pytest.raises(error) as info:
        call(torch)
    assert type(info.value) is error and message in str(info.value)


def test_a_numpy_bool_beside_a_tensor_is_the_number_torch_reads():
    for torch in LIBRARIES:
        plus = torch.tensor([1, 2]) + np.bool_(True)
        assert plus.dtype == torch.float32 and plus.tolist() == [2.0, 3.0]
        times = np.bool_(True) * torch.tensor([1.0, 2.0])
        assert isinstance(times, torch.Tensor) and times.tolist() == [1.0, 2.0]


def jacobians_of_a_parameter_dict(torch):
    x = torch.from_numpy(np.random.default_rng(7).standard_normal((2, 3)).astype(np.float32))
    m = torch.nn.Linear(3, 2)
    with torch.no_grad():
        m.weight.copy_(torch.linspace(-1, 1, 6).reshape(2, 3))
        m.bias.copy_(torch.tensor([0.5, -0.5]))
    params = {k: v.detach() for k, v in m.named_parameters()}

    def loss(p, x):
        return torch.func.functional_call(m, p, (x,)).tanh().pow(2).sum()

    jac = torch.func.jacrev(loss)(params, x)
    assert isinstance(jac, dict)  # the argument's structure, as the per-parameter gradients torch.func gives
    return {"jacrev": {k: numpy_of(v) for k, v in jac.items()},
            "jacfwd": {k: numpy_of(v) for k, v in torch.func.jacfwd(loss)(params, x).items()},
            "hessian": {k: {j: numpy_of(w) for j, w in row.items()}
                        for k, row in torch.func.hessian(loss)(params, x).items()},
            "hessian_x": numpy_of(torch.func.hessian(loss, argnums=1)(params, x))}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch's forward-mode AD scripts a helper on first use
def test_func_jacobians_with_respect_to_a_dict_of_parameters_keep_its_keys():
    # jacrev of a function of a parameter dict gave one tensor (the first parameter's) in place of the dict
    assert_same(jacobians_of_a_parameter_dict(tilewise), jacobians_of_a_parameter_dict(real_torch))


def test_a_forward_mode_jacobian_with_create_graph_is_refused_as_torch():
    messages = []
    for torch in LIBRARIES:
        with pytest.raises(NotImplementedError) as info:
            torch.autograd.functional.jacobian(lambda a: a.sin(), torch.ones(2), create_graph=True, vectorize=True,
                                               strategy="forward-mode")
        messages.append(str(info.value))
    assert messages[0] == messages[1]
