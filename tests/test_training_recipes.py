"""Training programs written the way popular tutorials and fine-tuning scripts write them, run once with ``torch``
and once with ``tilewise`` as the module named ``torch`` inside them, from the same initial weights (torch's
state_dict copied into tilewise's model) and the same data: losses and parameters agree step by step to float32
tolerance.

Each recipe is a function of the framework module, so its body reads exactly as the tutorial's does; only the
name bound to ``torch`` changes. Random draws differ between the frameworks, so the recipes draw their data with
numpy (or Python's ``random``) and take their initial weights from torch.
"""

from __future__ import annotations

import collections
import random

import numpy as np
import pytest
import torch as real_torch
import torch.utils.checkpoint  # noqa: F401 — binds torch.utils.checkpoint as the recipes use it
import torch.utils.data  # noqa: F401
from compiled_steps import compiled_if

import tilewise
import tilewise.utils.checkpoint  # noqa: F401
import tilewise.utils.data  # noqa: F401

FRAMEWORKS = {"torch": real_torch, "tilewise": tilewise}


def _numpy(value) -> np.ndarray:
    return value.detach().cpu().numpy()


def _state_from_torch(framework, state: dict) -> dict:
    if framework is real_torch:
        return {k: v.clone() for k, v in state.items()}
    return {k: tilewise.from_numpy(_numpy(v).copy()) for k, v in state.items()}


def _assert_runs_agree(theirs: dict, ours: dict, rtol=2e-5, atol=2e-6):
    """Each run reports {"losses": [...], "params": {name: tensor}, ...}: the same keys, the same numbers."""
    assert theirs.keys() == ours.keys()
    np.testing.assert_allclose(ours["losses"], theirs["losses"], rtol=rtol, atol=atol, err_msg="losses")
    assert list(ours["params"]) == list(theirs["params"])
    for name, value in theirs["params"].items():
        np.testing.assert_allclose(_numpy(ours["params"][name]), _numpy(value), rtol=rtol, atol=atol, err_msg=name)
    for key in theirs.keys() - {"losses", "params"}:
        assert ours[key] == theirs[key], key


# Adam divides each gradient by its own running magnitude, so where a gradient is near zero its last-bit rounding
# differences become a step's worth of difference in the parameter: up to lr * 2e-3 after a dozen steps.
ADAM_ATOL = 2e-5


def _run_both(recipe, model_factory, *args, **kwargs):
    """Builds torch's model, copies its initial weights into tilewise's, and runs the recipe on each."""
    runs = {}
    reference = model_factory(real_torch)
    for name, framework in FRAMEWORKS.items():
        model = model_factory(framework)
        model.load_state_dict(_state_from_torch(framework, reference.state_dict()))
        runs[name] = recipe(framework, model, *args, **kwargs)
    return runs["torch"], runs["tilewise"]


def _named_parameters(model) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# --- 1. a fine-tuning loop -------------------------------------------------------------------------------------

def finetune_model(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(8)
            self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))

        def forward(self, x):
            return x + self.mlp(self.norm(x))

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(6, 8)
            self.stem = Block()
            self.blocks = nn.Sequential(Block(), Block(), Block())
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            h = self.embed(x)
            h = torch.utils.checkpoint.checkpoint(self.stem, h, use_reentrant=False)
            h = torch.utils.checkpoint.checkpoint_sequential(self.blocks, 2, h, use_reentrant=False)
            return self.head(h.mean(dim=1))

    return Classifier()


def finetune_batches(steps: int, accum: int):
    rng = np.random.default_rng(0)
    return [[(rng.standard_normal((4, 5, 6)).astype(np.float32), rng.integers(0, 3, size=4))
             for _ in range(accum)] for _ in range(steps)]


def finetune_objects(torch, model, scaler_enabled: bool):
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.95))
    warmup, total = 3, 10

    def lr_lambda(step):
        if step < warmup:
            return float(step + 1) / float(warmup)
        return max(0.0, float(total - step) / float(max(1, total - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2, enabled=scaler_enabled)
    return optimizer, scheduler, scaler


def finetune_steps(torch, model, optimizer, scheduler, scaler, batches, losses, lrs):
    loss_fn = torch.nn.CrossEntropyLoss()
    accum = len(batches[0])
    for micro_batches in batches:
        model.train()
        total = 0.0
        for x, y in micro_batches:
            logits = model(torch.from_numpy(x))
            loss = loss_fn(logits, torch.from_numpy(y)) / accum
            scaler.scale(loss).backward()
            total += loss.item()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        scheduler.step()
        losses.append(total)
        lrs.append(scheduler.get_last_lr()[0])


def finetune(torch, model, batches, scaler_enabled, resume_at, path):
    optimizer, scheduler, scaler = finetune_objects(torch, model, scaler_enabled)
    losses, lrs = [], []
    finetune_steps(torch, model, optimizer, scheduler, scaler, batches[:resume_at], losses, lrs)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "step": resume_at}, path)
    uninterrupted = list(losses)
    finetune_steps(torch, model, optimizer, scheduler, scaler, batches[resume_at:], uninterrupted, [])

    resumed = finetune_model(torch)
    checkpoint = torch.load(path)
    resumed.load_state_dict(checkpoint["model"])
    optimizer, scheduler, scaler = finetune_objects(torch, resumed, scaler_enabled)
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    scaler.load_state_dict(checkpoint["scaler"])
    assert checkpoint["step"] == resume_at
    finetune_steps(torch, resumed, optimizer, scheduler, scaler, batches[resume_at:], losses, lrs)
    assert losses == uninterrupted, "resuming from the checkpoint changed the run"
    for (name, p), q in zip(model.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), name
    return {"losses": losses, "params": _named_parameters(resumed), "lrs": lrs, "scale": scaler.get_scale()}


@pytest.mark.parametrize("scaler_enabled", [False, True])
def test_finetuning_loop_with_checkpointing_warmup_accumulation_scaler_and_resume(scaler_enabled, tmp_path):
    batches = finetune_batches(steps=6, accum=2)
    theirs, ours = _run_both(lambda fw, model: finetune(fw, model, batches, scaler_enabled, 3,
                                                        tmp_path / f"{fw.__name__}.pt"), finetune_model)
    _assert_runs_agree(theirs, ours, atol=ADAM_ATOL)


def test_a_finetuning_checkpoint_saved_by_tilewise_resumes_in_torch(tmp_path):
    batches = finetune_batches(steps=4, accum=2)
    reference = finetune_model(real_torch)
    ours = finetune_model(tilewise)
    ours.load_state_dict(_state_from_torch(tilewise, reference.state_dict()))
    finetune(tilewise, ours, batches, True, 2, tmp_path / "ours.pt")
    theirs = finetune_model(real_torch)
    checkpoint = real_torch.load(tmp_path / "ours.pt")
    theirs.load_state_dict(checkpoint["model"])
    optimizer, scheduler, scaler = finetune_objects(real_torch, theirs, True)
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    scaler.load_state_dict(checkpoint["scaler"])
    losses, lrs = [], []
    finetune_steps(real_torch, theirs, optimizer, scheduler, scaler, batches[2:], losses, lrs)

    again = finetune_model(tilewise)
    mine = tilewise.load(tmp_path / "ours.pt")
    again.load_state_dict(mine["model"])
    optimizer, scheduler, scaler = finetune_objects(tilewise, again, True)
    optimizer.load_state_dict(mine["optimizer"])
    scheduler.load_state_dict(mine["scheduler"])
    scaler.load_state_dict(mine["scaler"])
    our_losses, our_lrs = [], []
    finetune_steps(tilewise, again, optimizer, scheduler, scaler, batches[2:], our_losses, our_lrs)
    np.testing.assert_allclose(our_losses, losses, rtol=2e-5, atol=2e-6)
    assert our_lrs == lrs


# --- 2. parametrizations ----------------------------------------------------------------------------------------

def parametrized_model(torch, orthogonal_map):
    nn = torch.nn
    parametrize = torch.nn.utils.parametrize
    parametrizations = torch.nn.utils.parametrizations

    class Symmetric(nn.Module):
        def forward(self, x):
            return x.triu() + x.triu(1).transpose(-1, -2)

        def right_inverse(self, a):
            return a.triu()

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.tensor(0.5))

        def forward(self, x):
            return x * self.scale

        def right_inverse(self, a):
            return a / self.scale

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = parametrizations.weight_norm(nn.Linear(6, 8))
            self.square = parametrize.register_parametrization(nn.Linear(8, 8), "weight", Symmetric())
            parametrize.register_parametrization(self.square, "weight", Scaled())
            self.orth = parametrizations.orthogonal(nn.Linear(8, 5), orthogonal_map=orthogonal_map)
            self.conv = parametrizations.spectral_norm(nn.Conv1d(4, 4, 3, padding=1))
            self.out = parametrizations.weight_norm(nn.Linear(5 + 4, 3), dim=None)

        def forward(self, x, seq):
            h = torch.tanh(self.square(torch.relu(self.inp(x))))
            h = torch.cat([self.orth(h), self.conv(seq).mean(dim=-1)], dim=-1)
            return self.out(h)

    return Net()


def train_parametrized(torch, model, steps=4):
    parametrize = torch.nn.utils.parametrize
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.standard_normal((8, 6)).astype(np.float32))
    seq = torch.from_numpy(rng.standard_normal((8, 4, 7)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 3, size=8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    keys = list(model.state_dict())
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x, seq), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad(), parametrize.cached():
        losses.append(torch.nn.functional.cross_entropy(model(x, seq), y).item())
    weights = {name: getattr(model, name).weight.detach().clone()
               for name in ("inp", "square", "orth", "conv", "out")}
    gram = weights["orth"] @ weights["orth"].T
    assert torch.allclose(gram, torch.eye(5), atol=1e-5), "the orthogonal weight left the orthogonal matrices"
    assert torch.equal(weights["square"], weights["square"].T), "the symmetric weight is not symmetric"
    model.square.weight = weights["square"] * 2  # right_inverse of each parametrization, in reverse order
    assigned = model.square.weight.detach().clone()
    classes = [type(m).__name__ for m in (model.inp, model.orth)]
    for name in ("inp", "square", "orth", "conv", "out"):
        parametrize.remove_parametrizations(getattr(model, name), "weight")
    assert not any(parametrize.is_parametrized(m) for m in model.modules())
    after_removal = {name: getattr(model, name).weight.detach().clone() for name in weights}
    return {"losses": losses, "params": {**_named_parameters(model), **{f"{k}.parametrized": v for k, v in
                                                                        weights.items()},
                                         "assigned": assigned, **{f"{k}.removed": v for k, v in
                                                                   after_removal.items()}},
            "keys": keys, "keys_after_removal": list(model.state_dict()), "classes": classes}


@pytest.mark.parametrize("orthogonal_map", ["matrix_exp", "cayley", "householder"])
def test_parametrizations_train_assign_and_remove_as_in_torch(orthogonal_map):
    theirs, ours = _run_both(train_parametrized, lambda fw: parametrized_model(fw, orthogonal_map))
    _assert_runs_agree(theirs, ours, rtol=1e-4, atol=1e-5)


# --- 3. text classification, as the torchtext tutorial writes it -----------------------------------------------

WORDS = ("the a match goal team market stock price rocket orbit planet vote party minister chip phone app "
         "score win shares fell rose launch star election law cloud data model").split()


def news_corpus(n: int = 48):
    rng = random.Random(0)
    topics = [WORDS[3:8] + WORDS[18:20], WORDS[8:12] + WORDS[20:22], WORDS[12:15] + WORDS[22:24],
              WORDS[15:18] + WORDS[25:28]]
    rows = []
    for i in range(n):
        label = i % 4
        length = rng.randint(3, 9)
        text = " ".join(rng.choice(topics[label] + WORDS[:3]) for _ in range(length))
        rows.append((label + 1, text))
    return rows


def build_vocab(rows):
    counter = collections.Counter()
    for _, text in rows:
        counter.update(text.split())
    vocab = {"<pad>": 0, "<unk>": 1}
    for word, _ in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])):
        vocab[word] = len(vocab)
    return vocab


class TextClassificationModel:
    """The tutorial's model, for either framework."""

    @staticmethod
    def make(torch, vocab_size, mode, with_offsets):
        nn = torch.nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.embedding = nn.EmbeddingBag(vocab_size, 16, mode=mode, padding_idx=None if with_offsets else 0)
                self.fc = nn.Linear(16, 4)

            def forward(self, text, offsets=None):
                return self.fc(self.embedding(text, offsets))

        return Model()


def text_classification(torch, model, rows, vocab, with_offsets, compiled=False):
    from_torch = torch.utils.data
    pad_sequence = torch.nn.utils.rnn.pad_sequence

    def text_pipeline(text):
        return [vocab.get(token, vocab["<unk>"]) for token in text.split()]

    def collate_batch(batch):
        label_list, text_list, offsets = [], [], [0]
        for label, text in batch:
            label_list.append(label - 1)
            processed = torch.tensor(text_pipeline(text), dtype=torch.int64)
            text_list.append(processed)
            offsets.append(processed.size(0))
        labels = torch.tensor(label_list, dtype=torch.int64)
        if with_offsets:
            offsets = torch.tensor(offsets[:-1]).cumsum(dim=0)
            return labels, torch.cat(text_list), offsets
        return labels, pad_sequence(text_list, batch_first=True, padding_value=vocab["<pad>"]), None

    loader = from_torch.DataLoader(rows, batch_size=8, shuffle=False, collate_fn=collate_batch)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1.0, gamma=0.1)
    losses, accuracies = [], []

    @compiled_if(torch, compiled)  # batches of several lengths: one variant per shape
    def train_step(label, text, offsets):
        optimizer.zero_grad()
        predicted_label = model(text, offsets)
        loss = criterion(predicted_label, label)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        optimizer.step()
        return loss.detach()

    for _ in range(2):
        model.train()
        for label, text, offsets in loader:
            losses.append(train_step(label, text, offsets).item())
        scheduler.step()
        model.eval()
        total_acc, total_count = 0, 0
        with torch.no_grad():
            for label, text, offsets in loader:
                predicted_label = model(text, offsets)
                total_acc += (predicted_label.argmax(1) == label).sum().item()
                total_count += label.size(0)
        accuracies.append(total_acc / total_count)
    return {"losses": losses, "params": _named_parameters(model), "accuracy": accuracies}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("mode,with_offsets", [("mean", True), ("sum", True), ("mean", False), ("sum", False)])
def test_text_classification_with_embedding_bag_matches_torch(mode, with_offsets, compiled):
    rows = news_corpus()
    vocab = build_vocab(rows)
    theirs, ours = _run_both(
        lambda fw, model: text_classification(fw, model, rows, vocab, with_offsets, compiled),
        lambda fw: TextClassificationModel.make(fw, len(vocab), mode, with_offsets))
    _assert_runs_agree(theirs, ours)


# --- 4. the seq2seq translation tutorial -----------------------------------------------------------------------

SOS, EOS, MAX_LENGTH = 0, 1, 6


def seq2seq_models(torch, input_size=12, output_size=11, hidden_size=16):
    nn = torch.nn
    F = torch.nn.functional  # noqa: N806 — the tutorial's spelling

    class EncoderRNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(input_size, hidden_size)
            self.gru = nn.GRU(hidden_size, hidden_size, batch_first=True)
            self.dropout = nn.Dropout(0.0)

        def forward(self, input):
            embedded = self.dropout(self.embedding(input))
            output, hidden = self.gru(embedded)
            return output, hidden

    class BahdanauAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.Wa = nn.Linear(hidden_size, hidden_size)
            self.Ua = nn.Linear(hidden_size, hidden_size)
            self.Va = nn.Linear(hidden_size, 1)

        def forward(self, query, keys):
            scores = self.Va(torch.tanh(self.Wa(query) + self.Ua(keys)))
            scores = scores.squeeze(2).unsqueeze(1)
            weights = F.softmax(scores, dim=-1)
            context = torch.bmm(weights, keys)
            return context, weights

    class AttnDecoderRNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(output_size, hidden_size)
            self.attention = BahdanauAttention()
            self.gru = nn.GRU(2 * hidden_size, hidden_size, batch_first=True)
            self.out = nn.Linear(hidden_size, output_size)
            self.dropout = nn.Dropout(0.0)

        def forward(self, encoder_outputs, encoder_hidden, target_tensor=None):
            batch_size = encoder_outputs.size(0)
            decoder_input = torch.empty(batch_size, 1, dtype=torch.long).fill_(SOS)
            decoder_hidden = encoder_hidden
            decoder_outputs, attentions = [], []
            for i in range(MAX_LENGTH):
                decoder_output, decoder_hidden, attn_weights = self.forward_step(
                    decoder_input, decoder_hidden, encoder_outputs)
                decoder_outputs.append(decoder_output)
                attentions.append(attn_weights)
                if target_tensor is not None:
                    decoder_input = target_tensor[:, i].unsqueeze(1)  # teacher forcing
                else:
                    _, topi = decoder_output.topk(1)
                    decoder_input = topi.squeeze(-1).detach()
            decoder_outputs = torch.cat(decoder_outputs, dim=1)
            decoder_outputs = F.log_softmax(decoder_outputs, dim=-1)
            attentions = torch.cat(attentions, dim=1)
            return decoder_outputs, decoder_hidden, attentions

        def forward_step(self, input, hidden, encoder_outputs):
            embedded = self.dropout(self.embedding(input))
            query = hidden.permute(1, 0, 2)
            context, attn_weights = self.attention(query, encoder_outputs)
            input_gru = torch.cat((embedded, context), dim=2)
            output, hidden = self.gru(input_gru, hidden)
            output = self.out(output)
            return output, hidden, attn_weights

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = EncoderRNN()
            self.decoder = AttnDecoderRNN()

    return Seq2Seq()


def translation_pairs(n=16, input_size=12, output_size=11):
    rng = np.random.default_rng(1)
    inputs = np.full((n, MAX_LENGTH), EOS, dtype=np.int64)
    targets = np.full((n, MAX_LENGTH), EOS, dtype=np.int64)
    for i in range(n):
        length = int(rng.integers(2, MAX_LENGTH))
        inputs[i, :length] = rng.integers(2, input_size, size=length)
        targets[i, :length] = (inputs[i, :length] * 3 + 1) % (output_size - 2) + 2
    return inputs, targets


def translate(torch, model, inputs, targets, epochs=3):
    encoder, decoder = model.encoder, model.decoder
    encoder_optimizer = torch.optim.Adam(encoder.parameters(), lr=0.01)
    decoder_optimizer = torch.optim.Adam(decoder.parameters(), lr=0.01)
    criterion = torch.nn.NLLLoss()
    losses = []
    for _ in range(epochs):
        for start in range(0, len(inputs), 4):
            input_tensor = torch.from_numpy(inputs[start:start + 4])
            target_tensor = torch.from_numpy(targets[start:start + 4])
            encoder_optimizer.zero_grad()
            decoder_optimizer.zero_grad()
            encoder_outputs, encoder_hidden = encoder(input_tensor)
            decoder_outputs, _, _ = decoder(encoder_outputs, encoder_hidden, target_tensor)
            loss = criterion(decoder_outputs.view(-1, decoder_outputs.size(-1)), target_tensor.view(-1))
            loss.backward()
            encoder_optimizer.step()
            decoder_optimizer.step()
            losses.append(loss.item())
    with torch.no_grad():
        encoder_outputs, encoder_hidden = encoder(torch.from_numpy(inputs[:4]))
        decoder_outputs, _, attentions = decoder(encoder_outputs, encoder_hidden)
        _, topi = decoder_outputs.topk(1)
        decoded_ids = topi.squeeze().detach()
    params = _named_parameters(model)
    # Softmax ignores a shift of all its scores, so Va's bias gets a gradient of rounding noise only, which Adam
    # scales up to steps of size lr in either direction: its value is the one number the frameworks need not share.
    params.pop("decoder.attention.Va.bias")
    return {"losses": losses, "params": {**params, "attentions": attentions}, "decoded": decoded_ids.tolist()}


@pytest.mark.usefixtures("torch_on_one_thread")  # Adam rescales the attention weights' smallest gradients: on
# the thread state earlier tests had left, torch's rounding moved one weight of Wa by up to 7.6e-4 relative
def test_seq2seq_translation_with_bahdanau_attention_matches_torch():
    inputs, targets = translation_pairs()
    theirs, ours = _run_both(lambda fw, model: translate(fw, model, inputs, targets), seq2seq_models)
    _assert_runs_agree(theirs, ours, rtol=5e-5, atol=ADAM_ATOL)


# --- 5. a small graph network ----------------------------------------------------------------------------------

def graph_data(num_nodes=10, num_edges=24, features=5):
    rng = np.random.default_rng(2)
    src = rng.integers(0, num_nodes - 2, size=num_edges)  # the last two nodes receive no messages
    dst = rng.integers(0, num_nodes - 2, size=num_edges)
    x = rng.standard_normal((num_nodes, features)).astype(np.float32)
    y = rng.integers(0, 3, size=num_nodes)
    return x, np.stack([src, dst]), y


def graph_model(torch, features=5, hidden=8, classes=3):
    nn = torch.nn

    class MessagePassing(nn.Module):
        def __init__(self, aggr, include_self, in_features, out_features):
            super().__init__()
            self.aggr, self.include_self = aggr, include_self
            self.message = nn.Linear(in_features, out_features)
            self.update = nn.Linear(in_features + out_features, out_features)

        def forward(self, x, edge_index):
            src, dst = edge_index
            messages = self.message(x)[src]
            num_nodes, width = x.size(0), messages.size(1)
            if self.aggr == "add":
                out = torch.zeros(num_nodes, width).index_add_(0, dst, messages)
            elif self.aggr == "counts":  # torch_scatter's scatter_mean: a sum over the counts of each index
                total = torch.zeros(num_nodes, width).index_add_(0, dst, messages)
                count = torch.zeros(num_nodes).index_add_(0, dst, torch.ones(dst.size(0)))
                out = total / count.clamp(min=1).unsqueeze(-1)
            else:
                index = dst.unsqueeze(-1).expand(-1, width)
                out = torch.zeros(num_nodes, width).scatter_reduce(
                    0, index, messages, reduce=self.aggr, include_self=self.include_self)
            return torch.relu(self.update(torch.cat([x, out], dim=-1)))

    class GraphNet(nn.Module):
        def __init__(self, aggr, include_self):
            super().__init__()
            self.conv1 = MessagePassing(aggr, include_self, features, hidden)
            self.conv2 = MessagePassing(aggr, include_self, hidden, hidden)
            self.classify = nn.Linear(hidden, classes)

        def forward(self, x, edge_index):
            return self.classify(self.conv2(self.conv1(x, edge_index), edge_index))

    return GraphNet



def train_graph(torch, model, x, edge_index, y, steps=5, compiled=False):
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    x, edge_index, y = torch.from_numpy(x), torch.from_numpy(edge_index), torch.from_numpy(y)

    @compiled_if(torch, compiled)
    def step():
        optimizer.zero_grad()
        out = model(x, edge_index)
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    losses = [step().item() for _ in range(steps)]
    return {"losses": losses, "params": _named_parameters(model)}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("aggr,include_self", [("add", True), ("counts", True), ("sum", True), ("sum", False),
                                               ("mean", True), ("mean", False), ("amax", True), ("amax", False)])
def test_message_passing_graph_network_matches_torch(aggr, include_self, compiled):
    x, edge_index, y = graph_data()
    theirs, ours = _run_both(lambda fw, model: train_graph(fw, model, x, edge_index, y, compiled=compiled),
                             lambda fw: graph_model(fw)(aggr, include_self))
    # compiled: the CPU program's float32 sums are split across threads and fold in another order than torch's;
    # in one run of the whole suite one parameter of 64 was 3.2e-5 off (it passes alone)
    _assert_runs_agree(theirs, ours, rtol=5e-5 if compiled else 2e-5)
