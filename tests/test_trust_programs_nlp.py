"""Natural-language programs in the styles their tutorials and papers' code are published in, run under torch and under
tilewise (``import tilewise as torch``) from the same initial weights and data, as in ``test_trust_programs.py``, whose
helpers these use: word2vec's skip-gram with negative sampling (two embedding tables, bmm of the negatives, logsigmoid,
a learning rate decayed by hand, nearest neighbours by cosine similarity), a Kim-style character-CNN text classifier
(convolutions of several widths over a padded embedding, max over time two ways, weighted cross entropy, weight decay,
gradient clipping) and a BiLSTM-CRF tagger (packed bidirectional LSTM, a CRF's forward algorithm and gold path score,
Viterbi decoding). Below the programs, the failures they met, each reduced to a test.
"""
# ruff: noqa: N801, N803, N806 — the programs keep the scripts' names (B, K, D, L, BiLSTM_CRF)

from __future__ import annotations

import numpy as np
import pytest
import torch as real_torch
from test_trust_programs import assert_same, gradients, initial_state, numpy_of, run_both
from test_trust_programs_styles2 import raised

import tilewise

LIBRARIES = [real_torch, tilewise]


# ----------------------------------------------------------------------------------------------------------------------
# word2vec's skip-gram with negative sampling, as the PyTorch ports of the original C write it: an input ("u") and an
# output ("v") embedding table, the input table uniform in +-0.5/D and the output table zero; the positive score is the
# dot product of centre and context vectors, the negatives' scores one bmm of (B, K, D) by (B, D, 1); the loss is the
# mean of -(logsigmoid(pos) + sum logsigmoid(-neg)); plain SGD whose learning rate decays linearly, set by hand in
# each param_group; at the end, each word's nearest neighbours by cosine similarity of the normalised input vectors.

def skip_gram(torch, init, data, vocab=20, D=8, lr=0.5, neighbours=4):
    nn, F = torch.nn, torch.nn.functional

    class SkipGramModel(nn.Module):
        def __init__(self, emb_size, emb_dimension):
            super().__init__()
            self.u_embeddings = nn.Embedding(emb_size, emb_dimension)
            self.v_embeddings = nn.Embedding(emb_size, emb_dimension)
            initrange = 1.0 / emb_dimension
            nn.init.uniform_(self.u_embeddings.weight.data, -initrange, initrange)
            nn.init.constant_(self.v_embeddings.weight.data, 0)

        def forward(self, pos_u, pos_v, neg_v):
            emb_u = self.u_embeddings(pos_u)
            emb_v = self.v_embeddings(pos_v)
            emb_neg_v = self.v_embeddings(neg_v)

            score = torch.sum(torch.mul(emb_u, emb_v), dim=1)
            score = torch.clamp(score, max=10, min=-10)
            score = -F.logsigmoid(score)

            neg_score = torch.bmm(emb_neg_v, emb_u.unsqueeze(2)).squeeze()
            neg_score = torch.clamp(neg_score, max=10, min=-10)
            neg_score = -torch.sum(F.logsigmoid(-neg_score), dim=1)

            return torch.mean(score + neg_score)

    model = SkipGramModel(vocab, D)
    record = {"init": initial_state(torch, model, init), "loss": [], "lr": [], "grads": []}
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    steps = len(data)
    for i, (pos_u, pos_v, neg_v) in enumerate(data):
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr * (1.0 - i / steps)
        optimizer.zero_grad()
        loss = model(torch.from_numpy(pos_u), torch.from_numpy(pos_v), torch.from_numpy(neg_v))
        loss.backward()
        record["grads"].append(gradients(model))
        optimizer.step()
        record["loss"].append(loss.item())
        record["lr"].append(optimizer.param_groups[0]["lr"])
    with torch.no_grad():
        embeddings = F.normalize(model.u_embeddings.weight, dim=1)
        similarity = embeddings @ embeddings.t()
        values, indices = similarity.topk(neighbours + 1, dim=1)
        record["similarity"] = numpy_of(similarity)
        record["neighbours"] = numpy_of(values[:, 1:])
        # ties between equal similarities may order differently; the words themselves are compared where they are not
        record["nearest"] = numpy_of(indices[:, 0])
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def skip_gram_batches(rng, steps=6, batch=8, negatives=5, vocab=20):
    # a corpus whose words co-occur with their neighbours modulo the vocabulary, negatives drawn from a unigram table
    unigram = rng.dirichlet(np.ones(vocab))
    batches = []
    for _ in range(steps):
        centre = rng.integers(0, vocab, batch)
        context = (centre + rng.choice([-2, -1, 1, 2], batch)) % vocab
        negative = rng.choice(vocab, (batch, negatives), p=unigram)
        batches.append((centre.astype(np.int64), context.astype(np.int64), negative.astype(np.int64)))
    return batches


def test_skip_gram_with_negative_sampling_and_a_hand_decayed_lr_trains_like_torch():
    ours, theirs = run_both(skip_gram, skip_gram_batches(np.random.default_rng(0)))
    assert theirs["final"]["v_embeddings.weight"].any()  # the output table, zero at first, has learnt
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A Kim-style character-CNN text classifier: characters embedded with padding_idx=0 (the padding row stays zero and
# gets no gradient), transposed to (N, D, L), convolutions of widths 2, 3 and 4 with ReLU, max over time by
# torch.max(x, dim=2)[0] for some and by F.max_pool1d(x, x.size(2)).squeeze(2) for others, the pooled features
# concatenated, dropout (p=0 here), a linear head, cross entropy weighted per class, and clip_grad_norm_ before each
# step; Adadelta (the paper's) or Adam with weight_decay.

def char_cnn(torch, init, data, vocab=16, D=6, filters=4, widths=(2, 3, 4), classes=3, optimizer_name="adadelta",
             style="conv1d"):
    # style "conv1d": one embedding, Conv1d over (N, D, L); "kim": Kim's own layout, a static channel (an embedding
    # from_pretrained, frozen) beside a trained one with max_norm, Conv2d(channels, filters, (K, D)) over (N, C, L, D)
    # squeezed to (N, filters, L - K + 1), and the l2 constraint on the head's rows by renorm_ after each step
    nn, F = torch.nn, torch.nn.functional
    kim = style == "kim"

    class CNNText(nn.Module):
        def __init__(self):
            super().__init__()
            if kim:
                self.embed = nn.Embedding(vocab, D, padding_idx=0, max_norm=1.5)
                self.static = nn.Embedding.from_pretrained(torch.tensor(data["pretrained"]), freeze=True, padding_idx=0)
                self.convs = nn.ModuleList([nn.Conv2d(2, filters, (k, D)) for k in widths])
            else:
                self.embed = nn.Embedding(vocab, D, padding_idx=0)
                self.convs = nn.ModuleList([nn.Conv1d(D, filters, k) for k in widths])
            self.dropout = nn.Dropout(0.0)
            self.fc = nn.Linear(len(widths) * filters, classes)

        def forward(self, x):
            if kim:
                x = torch.stack([self.embed(x), self.static(x)], dim=1)  # (N, 2, L, D)
                features = [F.relu(conv(x)).squeeze(3) for conv in self.convs]
            else:
                x = self.embed(x).transpose(1, 2)  # (N, D, L)
                features = [F.relu(conv(x)) for conv in self.convs]
            pooled = []
            for i, h in enumerate(features):
                if i % 2 == 0:
                    pooled.append(torch.max(h, dim=2)[0])
                else:
                    pooled.append(F.max_pool1d(h, h.size(2)).squeeze(2))
            x = self.dropout(torch.cat(pooled, 1))
            return self.fc(x)

    model = CNNText()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "norm": []}
    parameters = filter(lambda p: p.requires_grad, model.parameters())
    if optimizer_name == "adadelta":
        optimizer = torch.optim.Adadelta(parameters, lr=1.0, rho=0.95, eps=1e-6, weight_decay=1e-3)
    else:
        optimizer = torch.optim.Adam(parameters, lr=1e-2, weight_decay=1e-3)
    class_weights = torch.tensor(data["class_weights"])
    for text, label in data["train"]:
        model.train()
        optimizer.zero_grad()
        logits = model(torch.from_numpy(text))
        loss = F.cross_entropy(logits, torch.from_numpy(label), weight=class_weights)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        record["grads"].append(gradients(model))
        record["norm"].append(float(norm))
        optimizer.step()
        if kim:
            model.fc.weight.data.renorm_(2, 0, 0.6)
        record["loss"].append(loss.item())
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(data["test"]))
        record["logits"] = numpy_of(logits)
        record["predicted"] = numpy_of(torch.argmax(F.softmax(logits, dim=1), dim=1))
        record["padding_row"] = numpy_of(model.embed.weight[0])
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def char_texts(rng, steps=5, batch=6, length=9, vocab=16, classes=3):
    def texts(n):
        lengths = rng.integers(4, length + 1, n)
        codes = rng.integers(1, vocab, (n, length))
        codes[np.arange(length)[None, :] >= lengths[:, None]] = 0  # padded with the padding index
        return codes.astype(np.int64)

    return {"train": [(texts(batch), rng.integers(0, classes, batch).astype(np.int64)) for _ in range(steps)],
            "test": texts(4), "class_weights": [1.0, 2.0, 0.5],
            "pretrained": rng.standard_normal((vocab, 6)).astype(np.float32)}


@pytest.mark.parametrize("optimizer_name, style", [("adadelta", "conv1d"), ("adam", "conv1d"), ("adadelta", "kim")])
def test_char_cnn_with_padding_max_over_time_class_weights_and_clipping_trains_like_torch(optimizer_name, style):
    ours, theirs = run_both(char_cnn, char_texts(np.random.default_rng(0)), optimizer_name=optimizer_name, style=style)
    assert not theirs["padding_row"].any()
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A BiLSTM-CRF tagger, as the PyTorch tutorial and the repositories after it write it, batched: word embeddings through
# a bidirectional LSTM over pack_padded_sequence(..., enforce_sorted=False), pad_packed_sequence back, a linear layer to
# emission scores; a CRF with a transition matrix parameter (transitions[i, j]: from tag i to tag j) and start and end
# scores, its partition function by the forward algorithm (logsumexp over the previous tag at each step, kept only where
# the mask is on), the gold path's score through gather, the negative log-likelihood; Viterbi decoding with max and
# argmax at each step, the backpointers kept in a list of tensors and followed back from each sequence's end. SGD with
# momentum under StepLR.

def bilstm_crf(torch, init, data, vocab=15, E=6, H=5, tags=4):
    nn, rnn_utils = torch.nn, torch.nn.utils.rnn

    class CRF(nn.Module):
        def __init__(self, num_tags):
            super().__init__()
            self.num_tags = num_tags
            self.start_transitions = nn.Parameter(torch.empty(num_tags))
            self.end_transitions = nn.Parameter(torch.empty(num_tags))
            self.transitions = nn.Parameter(torch.empty(num_tags, num_tags))
            nn.init.uniform_(self.start_transitions, -0.1, 0.1)
            nn.init.uniform_(self.end_transitions, -0.1, 0.1)
            nn.init.uniform_(self.transitions, -0.1, 0.1)

        def forward(self, emissions, tags, mask):
            # emissions (B, T, K), tags (B, T), mask (B, T) bool with the first step always on
            numerator = self._compute_score(emissions, tags, mask)
            denominator = self._compute_normalizer(emissions, mask)
            return (denominator - numerator).sum() / mask.float().sum()

        def _compute_score(self, emissions, tags, mask):
            B, T = tags.shape
            score = self.start_transitions[tags[:, 0]]
            score = score + emissions[:, 0].gather(1, tags[:, 0:1]).squeeze(1)
            for i in range(1, T):
                transition = self.transitions[tags[:, i - 1], tags[:, i]]
                emission = emissions[:, i].gather(1, tags[:, i].unsqueeze(1)).squeeze(1)
                score = score + (transition + emission) * mask[:, i]
            seq_ends = mask.long().sum(dim=1) - 1
            last_tags = tags.gather(1, seq_ends.unsqueeze(1)).squeeze(1)
            return score + self.end_transitions[last_tags]

        def _compute_normalizer(self, emissions, mask):
            T = emissions.size(1)
            score = self.start_transitions + emissions[:, 0]
            for i in range(1, T):
                broadcast_score = score.unsqueeze(2)
                broadcast_emissions = emissions[:, i].unsqueeze(1)
                next_score = broadcast_score + self.transitions + broadcast_emissions
                next_score = torch.logsumexp(next_score, dim=1)
                score = torch.where(mask[:, i].unsqueeze(1), next_score, score)
            score = score + self.end_transitions
            return torch.logsumexp(score, dim=1)

        def decode(self, emissions, mask):
            B, T, _ = emissions.shape
            score = self.start_transitions + emissions[:, 0]
            history = []
            for i in range(1, T):
                broadcast_score = score.unsqueeze(2)
                broadcast_emission = emissions[:, i].unsqueeze(1)
                next_score = broadcast_score + self.transitions + broadcast_emission
                next_score, indices = next_score.max(dim=1)
                score = torch.where(mask[:, i].unsqueeze(1), next_score, score)
                history.append(indices)
            score = score + self.end_transitions
            seq_ends = mask.long().sum(dim=1) - 1
            best_tags_list = []
            for idx in range(B):
                best_last_tag = torch.argmax(score[idx])
                best_tags = [best_last_tag.item()]
                for hist in reversed(history[:seq_ends[idx]]):
                    best_last_tag = hist[idx][best_tags[-1]]
                    best_tags.append(best_last_tag.item())
                best_tags.reverse()
                best_tags_list.append(best_tags)
            return best_tags_list, score.max(dim=1)[0]

    class BiLSTMCRF(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(vocab, E, padding_idx=0)
            self.lstm = nn.LSTM(E, H, num_layers=1, bidirectional=True, batch_first=True)
            self.hidden2tag = nn.Linear(2 * H, tags)
            self.crf = CRF(tags)

        def _get_lstm_features(self, sentences, lengths):
            embeds = self.embedding(sentences)
            packed = rnn_utils.pack_padded_sequence(embeds, lengths, batch_first=True, enforce_sorted=False)
            lstm_out, _ = self.lstm(packed)
            lstm_out, _ = rnn_utils.pad_packed_sequence(lstm_out, batch_first=True, total_length=sentences.size(1))
            return self.hidden2tag(lstm_out)

        def neg_log_likelihood(self, sentences, lengths, tags):
            feats = self._get_lstm_features(sentences, lengths)
            return self.crf(feats, tags, sentences != 0)

        def forward(self, sentences, lengths):
            feats = self._get_lstm_features(sentences, lengths)
            return self.crf.decode(feats, sentences != 0)

    model = BiLSTMCRF()
    record = {"init": initial_state(torch, model, init), "loss": [], "lr": [], "grads": []}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    for sentences, lengths, gold in data["train"]:
        model.zero_grad()
        loss = model.neg_log_likelihood(torch.from_numpy(sentences), torch.from_numpy(lengths), torch.from_numpy(gold))
        loss.backward()
        record["grads"].append(gradients(model))
        optimizer.step()
        scheduler.step()
        record["loss"].append(loss.item())
        record["lr"].append(scheduler.get_last_lr()[0])
    model.eval()
    with torch.no_grad():
        sentences, lengths = data["test"]
        paths, scores = model(torch.from_numpy(sentences), torch.from_numpy(lengths))
        record["paths"] = [np.asarray(p) for p in paths]
        record["path_scores"] = numpy_of(scores)
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def tagged_sentences(rng, steps=5, batch=4, length=7, vocab=15, tags=4):
    def sentences(n):
        lengths = rng.integers(2, length + 1, n)
        lengths[rng.integers(0, n)] = length  # the longest fills the padded width
        words = rng.integers(1, vocab, (n, length))
        words[np.arange(length)[None, :] >= lengths[:, None]] = 0
        return words.astype(np.int64), lengths.astype(np.int64)

    train = []
    for _ in range(steps):
        words, lengths = sentences(batch)
        gold = ((words * 3 + 1) % tags) * (words != 0)  # a tag each word mostly determines, 0 under the padding
        train.append((words, lengths, gold.astype(np.int64)))
    return {"train": train, "test": sentences(5)}


def test_bilstm_crf_with_packed_sequences_forward_algorithm_and_viterbi_trains_and_tags_like_torch():
    ours, theirs = run_both(bilstm_crf, tagged_sentences(np.random.default_rng(0)))
    assert theirs["loss"][-1] < theirs["loss"][0]
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# The same tagger as PyTorch's own tutorial writes it, one sentence at a time: START and STOP tags whose transitions are
# set to -10000 through .data, log_sum_exp written out with max_score = vec[0, argmax(vec)] and expand, the forward
# algorithm tag by tag (a list of one-element views concatenated into forward_var), the gold score over
# torch.cat([start, tags]), Viterbi with Python-int backpointers and the path followed back from the best last tag;
# the LSTM's initial state passed in (zeros here, randn there), SGD with weight_decay.

def tutorial_bilstm_crf(torch, init, data, vocab=12, E=5, H=4, tags=3):
    nn = torch.nn
    START_TAG, STOP_TAG = tags, tags + 1
    tagset_size = tags + 2

    def argmax(vec):
        _, idx = torch.max(vec, 1)
        return idx.item()

    def log_sum_exp(vec):
        max_score = vec[0, argmax(vec)]
        max_score_broadcast = max_score.view(1, -1).expand(1, vec.size()[1])
        return max_score + torch.log(torch.sum(torch.exp(vec - max_score_broadcast)))

    class BiLSTM_CRF(nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden_dim = 2 * H
            self.word_embeds = nn.Embedding(vocab, E)
            self.lstm = nn.LSTM(E, H, num_layers=1, bidirectional=True)
            self.hidden2tag = nn.Linear(self.hidden_dim, tagset_size)
            self.transitions = nn.Parameter(torch.tensor(data["transitions"]))
            self.transitions.data[START_TAG, :] = -10000
            self.transitions.data[:, STOP_TAG] = -10000
            self.hidden = self.init_hidden()

        def init_hidden(self):
            return (torch.zeros(2, 1, self.hidden_dim // 2), torch.zeros(2, 1, self.hidden_dim // 2))

        def _forward_alg(self, feats):
            init_alphas = torch.full((1, tagset_size), -10000.)
            init_alphas[0][START_TAG] = 0.
            forward_var = init_alphas
            for feat in feats:
                alphas_t = []
                for next_tag in range(tagset_size):
                    emit_score = feat[next_tag].view(1, -1).expand(1, tagset_size)
                    trans_score = self.transitions[next_tag].view(1, -1)
                    next_tag_var = forward_var + trans_score + emit_score
                    alphas_t.append(log_sum_exp(next_tag_var).view(1))
                forward_var = torch.cat(alphas_t).view(1, -1)
            terminal_var = forward_var + self.transitions[STOP_TAG]
            return log_sum_exp(terminal_var)

        def _get_lstm_features(self, sentence):
            self.hidden = self.init_hidden()
            embeds = self.word_embeds(sentence).view(len(sentence), 1, -1)
            lstm_out, self.hidden = self.lstm(embeds, self.hidden)
            lstm_out = lstm_out.view(len(sentence), self.hidden_dim)
            return self.hidden2tag(lstm_out)

        def _score_sentence(self, feats, tags):
            score = torch.zeros(1)
            tags = torch.cat([torch.tensor([START_TAG], dtype=torch.long), tags])
            for i, feat in enumerate(feats):
                score = score + self.transitions[tags[i + 1], tags[i]] + feat[tags[i + 1]]
            return score + self.transitions[STOP_TAG, tags[-1]]

        def _viterbi_decode(self, feats):
            backpointers = []
            init_vvars = torch.full((1, tagset_size), -10000.)
            init_vvars[0][START_TAG] = 0
            forward_var = init_vvars
            for feat in feats:
                bptrs_t = []
                viterbivars_t = []
                for next_tag in range(tagset_size):
                    next_tag_var = forward_var + self.transitions[next_tag]
                    best_tag_id = argmax(next_tag_var)
                    bptrs_t.append(best_tag_id)
                    viterbivars_t.append(next_tag_var[0][best_tag_id].view(1))
                forward_var = (torch.cat(viterbivars_t) + feat).view(1, -1)
                backpointers.append(bptrs_t)
            terminal_var = forward_var + self.transitions[STOP_TAG]
            best_tag_id = argmax(terminal_var)
            path_score = terminal_var[0][best_tag_id]
            best_path = [best_tag_id]
            for bptrs_t in reversed(backpointers):
                best_tag_id = bptrs_t[best_tag_id]
                best_path.append(best_tag_id)
            start = best_path.pop()
            assert start == START_TAG
            best_path.reverse()
            return path_score, best_path

        def neg_log_likelihood(self, sentence, tags):
            feats = self._get_lstm_features(sentence)
            forward_score = self._forward_alg(feats)
            gold_score = self._score_sentence(feats, tags)
            return forward_score - gold_score

        def forward(self, sentence):
            lstm_feats = self._get_lstm_features(sentence)
            return self._viterbi_decode(lstm_feats)

    model = BiLSTM_CRF()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": []}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, weight_decay=1e-4)
    for sentence, gold in data["train"]:
        model.zero_grad()
        loss = model.neg_log_likelihood(torch.tensor(sentence, dtype=torch.long), torch.tensor(gold, dtype=torch.long))
        loss.backward()
        optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
    with torch.no_grad():
        record["decoded"] = [model(torch.tensor(sentence, dtype=torch.long)) for sentence, _ in data["train"][:2]]
        record["decoded"] = [[float(score), np.asarray(path)] for score, path in record["decoded"]]
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def tutorial_sentences(rng, steps=3, vocab=12, tags=3):
    train = []
    for _ in range(steps):
        sentence = rng.integers(0, vocab, rng.integers(3, 6)).tolist()
        train.append((sentence, [w % tags for w in sentence]))
    return {"train": train, "transitions": rng.standard_normal((tags + 2, tags + 2)).astype(np.float32)}


def test_the_tutorials_bilstm_crf_one_sentence_at_a_time_trains_and_decodes_like_torch():
    ours, theirs = run_both(tutorial_bilstm_crf, tutorial_sentences(np.random.default_rng(0)))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# The failures the programs met, each reduced.

REFUSALS = {
    # skip-gram's bmm of the negatives against the centre words, given tensors of the wrong ranks or sizes
    "bmm, a matrix": (lambda t: t.bmm(t.ones(2, 5, 3), t.ones(3, 1)), RuntimeError, "batch2 must be a 3D tensor"),
    "bmm, inner sizes": (lambda t: t.bmm(t.ones(2, 5, 3), t.ones(2, 4, 1)), RuntimeError,
                         "Expected size for first two dimensions of batch2 tensor to be: [2, 3] but got: [2, 4]."),
    "bmm, batch sizes": (lambda t: t.ones(2, 5, 3).bmm(t.ones(3, 3, 1)), RuntimeError,
                         "Expected size for first two dimensions of batch2 tensor to be: [2, 3] but got: [3, 3]."),
    "mm, a batch": (lambda t: t.mm(t.ones(2, 3, 1), t.ones(3, 1)), RuntimeError, "self must be a matrix"),
    "mm, inner sizes": (lambda t: t.mm(t.ones(2, 3), t.ones(4, 1)), RuntimeError,
                        "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x1)"),
    "matmul, a linear layer's": (lambda t: t.nn.Linear(5, 2)(t.ones(2, 4, 3)), RuntimeError,
                                 "mat1 and mat2 shapes cannot be multiplied (8x3 and 5x2)"),
    "matmul, matrix and vector": (lambda t: t.ones(2, 3) @ t.ones(5), RuntimeError,
                                  "size mismatch, got input (2), mat (2x3), vec (5)"),
    "matmul, two vectors": (lambda t: t.ones(3) @ t.ones(5), RuntimeError,
                            "inconsistent tensor size, expected tensor [3] and src [5] to have the same number of "
                            "elements, but got 3 and 5 elements respectively"),
    "matmul, batches": (lambda t: t.ones(2, 1, 2, 3) @ t.ones(3, 5, 4), RuntimeError,
                        "Expected size for first two dimensions of batch2 tensor to be: [6, 3] but got: [6, 5]."),
    "matmul, batches that do not broadcast": (
        lambda t: t.ones(3, 2, 3) @ t.ones(2, 5, 4), RuntimeError,
        "The size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 0"),
    # the neighbours' topk asking for more words than the vocabulary holds
    "topk, k past the size": (lambda t: t.ones(2, 3).topk(4), RuntimeError, "selected index k out of range"),
    "kthvalue, k of zero": (lambda t: t.ones(2, 3).kthvalue(0), RuntimeError,
                            "kthvalue(): selected number k out of range for dimension 1"),
    # the text CNN's pooled features joined, and its max over time of a text shorter than the widest filter
    "cat, sizes": (lambda t: t.cat([t.ones(2, 3), t.ones(2, 4), t.ones(3, 3)]), RuntimeError,
                   "Sizes of tensors must match except in dimension 0. Expected size 3 but got size 4 for tensor "
                   "number 1 in the list."),
    "cat, an empty one left out": (lambda t: t.cat([t.ones(0), t.ones(2, 3), t.ones(2, 4)]), RuntimeError,
                                   "Sizes of tensors must match except in dimension 0. Expected size 3 but got size 4 "
                                   "for tensor number 2 in the list."),
    "cat, ranks": (lambda t: t.cat([t.ones(2, 3), t.ones(3)], 1), RuntimeError,
                   "Tensors must have same number of dimensions: got 2 and 1"),
    "cat, a zero-dim tensor": (lambda t: t.cat([t.ones(2, 3), t.ones(3), t.ones(())]), RuntimeError,
                               "zero-dimensional tensor (at position 2) cannot be concatenated"),
    "cat, nothing": (lambda t: t.cat([]), ValueError, "torch.cat(): expected a non-empty list of Tensors"),
    "cat, a number": (lambda t: t.cat([t.ones(2), 3]), TypeError,
                      "expected Tensor as element 1 in argument 0, but got int"),
    "max_pool1d, the window past the text": (lambda t: t.nn.functional.max_pool1d(t.ones(1, 2, 3), 4), RuntimeError,
                                            "max_pool1d() Invalid computed output size: 0"),
    "max_pool1d, the window past the text, training": (
        lambda t: t.nn.functional.max_pool1d(t.ones(1, 2, 3, requires_grad=True), 2, dilation=3), RuntimeError,
        "max_pool1d() Invalid computed output size: 0"),
    "max_pool1d, an empty text": (lambda t: t.nn.functional.max_pool1d(t.ones(1, 2, 0), 1), RuntimeError,
                                  "max_pool1d: Expected 2D or 3D (batch mode) tensor with optional 0 dim batch size "
                                  "for input, but got:[1, 2, 0]"),
    "max_pool1d, a zero window": (lambda t: t.nn.functional.max_pool1d(t.ones(1, 2, 3), 0), RuntimeError,
                                  "max_pool1d() kernel_size must be greater than zero, but got 0"),
    "max_pool1d, a zero stride": (lambda t: t.nn.functional.max_pool1d(t.ones(1, 2, 3), 2, 0), RuntimeError,
                                  "max_pool1d() stride must be greater than zero, but got 0"),
    "max_pool1d, padding": (lambda t: t.nn.functional.max_pool1d(t.ones(1, 2, 3), 2, padding=2), RuntimeError,
                            "max_pool1d() padding should be at most half of kernel size, but got padding=2 and "
                            "kernel_size=2"),
    "max_pool1d, two strides": (lambda t: t.nn.functional.max_pool1d(t.ones(1, 2, 3), 2, (1, 1)), RuntimeError,
                                "max_pool1d() stride must be None, an int, list of ints, or tuple of ints of size 1 "
                                "but got size 2"),
    "avg_pool1d, the window past the text": (lambda t: t.nn.functional.avg_pool1d(t.ones(2, 3), 4), RuntimeError,
                                            "Given input size: (2x1x3). Calculated output size: (2x1x0). Output size "
                                            "is too small"),
    # a label past the classifier's classes
    "cross_entropy, a class past the end": (
        lambda t: t.nn.functional.cross_entropy(t.ones(2, 3), t.tensor([0, 3]), weight=t.ones(3)), IndexError,
        "Target 3 is out of bounds."),
    "nll_loss of sequences, a negative class": (
        lambda t: t.nn.functional.nll_loss(t.ones(2, 3, 4), t.tensor([[0, -3, 1, 1], [0, 0, 0, 0]])), IndexError,
        "Target -3 is out of bounds."),
    # pretrained vectors of the wrong rank
    "from_pretrained, a vector": (lambda t: t.nn.Embedding.from_pretrained(t.ones(3)), AssertionError,
                                  "Embeddings parameter is expected to be 2-dimensional"),
    # a CRF mask of integers
    "where, a long condition": (lambda t: t.where(t.tensor([1, 0]), t.ones(2), t.zeros(2)), RuntimeError,
                                "where expected condition to be a boolean tensor, but got a tensor with dtype Long"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_the_programs_mistakes_are_refused_in_torchs_words(case):
    call, error, message = REFUSALS[case]
    theirs, ours = (raised(call, t) for t in LIBRARIES)
    assert type(theirs) is error and str(theirs) == message, repr(theirs)
    assert type(ours) is error and str(ours).startswith(message), repr(ours)
    assert str(ours) == message or str(ours)[len(message):].startswith(" ("), repr(ours)  # details in parentheses


def test_where_of_a_uint8_mask_warns_as_torch_and_selects_as_a_bool_one():
    # older CRF code builds its mask with .byte(); torch still takes it, with a deprecation warning at the caller's line
    for torch in LIBRARIES:
        with pytest.warns(UserWarning, match="^where received a uint8 condition tensor. This behavior is deprecated") \
                as caught:
            out = torch.where(torch.tensor([1, 0, 2], dtype=torch.uint8), torch.ones(3), torch.zeros(3))
        assert caught[0].filename == __file__
        np.testing.assert_array_equal(out.numpy(), [1.0, 0.0, 1.0])
