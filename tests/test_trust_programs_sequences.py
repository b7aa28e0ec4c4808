"""Training programs in further published styles: a Transformer translator, a BERT-style masked LM, actor-critic, a
spatial transformer with window attention and SWA, MAML with torch.func and a PINN under LBFGS, a CTC speech model.

Each program runs eagerly under torch and under tilewise (``import tilewise as torch``) from the same initial weights
and batches, as in ``test_trust_programs.py``, whose helpers these use
noise a program draws comes from numpy.
"""
# ruff: noqa: N803, N806 — the programs keep the scripts' names (B, T, H, W, C, D, K)

from __future__ import annotations

import math

import numpy as np
from test_trust_programs import assert_same, gradients, initial_state, numpy_of, run_both

# ----------------------------------------------------------------------------------------------------------------------
# An encoder-decoder nn.Transformer translator (sequence-first): a registered sinusoidal positional encoding,
# generate_square_subsequent_mask, boolean source and padding masks, label smoothing with ignore_index, Adam with
# the Noam schedule as a LambdaLR, and greedy decoding through the encoder and decoder.

def translation(torch, init, batches, PAD=0, BOS=1, EOS=2):
    nn = torch.nn
    d = 16
    class PositionalEncoding(nn.Module):
        def __init__(self, d_model, dropout=0.0, max_len=32):
            super().__init__()
            self.dropout = nn.Dropout(p=dropout)
            position = torch.arange(max_len).unsqueeze(1)
            div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
            pe = torch.zeros(max_len, 1, d_model)
            pe[:, 0, 0::2] = torch.sin(position * div_term)
            pe[:, 0, 1::2] = torch.cos(position * div_term)
            self.register_buffer("pe", pe)
        def forward(self, x):
            x = x + self.pe[: x.size(0)]
            return self.dropout(x)

    class Seq2Seq(nn.Module):
        def __init__(self, src_vocab=12, tgt_vocab=10):
            super().__init__()
            self.src_emb = nn.Embedding(src_vocab, d, padding_idx=PAD)
            self.tgt_emb = nn.Embedding(tgt_vocab, d, padding_idx=PAD)
            self.pos = PositionalEncoding(d)
            self.transformer = nn.Transformer(d_model=d, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
                                              dim_feedforward=32, dropout=0.0)
            self.generator = nn.Linear(d, tgt_vocab)
        def encode(self, src, src_key_padding_mask):
            return self.transformer.encoder(self.pos(self.src_emb(src) * math.sqrt(d)),
                                            src_key_padding_mask=src_key_padding_mask)
        def decode(self, tgt, memory, tgt_mask, tgt_key_padding_mask=None, memory_key_padding_mask=None):
            return self.transformer.decoder(self.pos(self.tgt_emb(tgt) * math.sqrt(d)), memory, tgt_mask,
                                            tgt_key_padding_mask=tgt_key_padding_mask,
                                            memory_key_padding_mask=memory_key_padding_mask)
        def forward(self, src, tgt, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask, memory_key_padding_mask):
            outs = self.transformer(self.pos(self.src_emb(src) * math.sqrt(d)),
                                    self.pos(self.tgt_emb(tgt) * math.sqrt(d)), src_mask, tgt_mask, None,
                                    src_padding_mask, tgt_padding_mask, memory_key_padding_mask)
            return self.generator(outs)

    model = Seq2Seq()
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "lr": []}
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)
    warmup = 3
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: d ** -0.5 * min((step + 1) ** -0.5, (step + 1) * warmup ** -1.5))
    criterion = nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
    for src, tgt in batches:
        src, tgt = torch.from_numpy(src).T, torch.from_numpy(tgt).T   # (S, N)
        tgt_input = tgt[:-1, :]
        S, T = src.shape[0], tgt_input.shape[0]
        tgt_mask = nn.Transformer.generate_square_subsequent_mask(T)
        src_mask = torch.zeros((S, S), dtype=torch.bool)
        src_padding_mask = (src == PAD).transpose(0, 1)
        tgt_padding_mask = (tgt_input == PAD).transpose(0, 1)
        model.train()
        logits = model(src, tgt_input, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask, src_padding_mask)
        optimizer.zero_grad()
        tgt_out = tgt[1:, :]
        loss = criterion(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1))
        loss.backward()
        optimizer.step()
        scheduler.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
        record["lr"].append(scheduler.get_last_lr()[0])
    model.eval()
    # greedy decode
    with torch.no_grad():
        src = torch.from_numpy(batches[0][0][:1]).T
        memory = model.encode(src, (src == PAD).T)
        ys = torch.ones(1, 1).fill_(BOS).type(torch.long)
        for _ in range(6):
            tgt_mask = nn.Transformer.generate_square_subsequent_mask(ys.size(0)).type(torch.bool)
            out = model.decode(ys, memory, tgt_mask).transpose(0, 1)
            prob = model.generator(out[:, -1])
            _, next_word = torch.max(prob, dim=1)
            next_word = next_word.item()
            ys = torch.cat([ys, torch.ones(1, 1).type_as(src.data).fill_(next_word)], dim=0)
            if next_word == EOS:
                break
        record["decoded"] = numpy_of(ys)
        record["memory"] = numpy_of(memory)
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record

def translation_batches(rng, steps=4, batch=3, S=7, T=6):
    out = []
    for _ in range(steps):
        src = np.zeros((batch, S), np.int64)
        tgt = np.zeros((batch, T), np.int64)
        for i in range(batch):
            n = rng.integers(3, S + 1)
            m = rng.integers(3, T + 1)
            src[i, :n] = rng.integers(3, 12, n)
            tgt[i, 0] = 1
            tgt[i, 1:m - 1] = rng.integers(3, 10, m - 2)
            tgt[i, m - 1] = 2
        out.append((src, tgt))
    return out


def test_transformer_translation_with_masks_noam_schedule_and_greedy_decoding_trains_like_torch():
    ours, theirs = run_both(translation, translation_batches(np.random.default_rng(14)))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A masked language model written the Hugging Face way: position_ids as a non-persistent buffer, the extended
# attention mask (1 - mask) * finfo.min, einsum scores, LayerNorm eps=1e-12, a decoder tied to the word embeddings
# with a separate bias, labels -100 outside the masked positions, no decay for biases and LayerNorm weights, a linear
# warmup-decay LambdaLR, and accumulation through a disabled GradScaler.

def bert_mlm(torch, init, batches, accumulate=2):
    nn, F = torch.nn, torch.nn.functional
    V, H, NH, L, P = 20, 16, 2, 2, 12
    class Embeddings(nn.Module):
        def __init__(self):
            super().__init__()
            self.word_embeddings = nn.Embedding(V, H, padding_idx=0)
            self.position_embeddings = nn.Embedding(P, H)
            self.token_type_embeddings = nn.Embedding(2, H)
            self.LayerNorm = nn.LayerNorm(H, eps=1e-12)
            self.dropout = nn.Dropout(0.0)
            self.register_buffer("position_ids", torch.arange(P).expand((1, -1)), persistent=False)
            self.register_buffer("token_type_ids", torch.zeros(self.position_ids.size(), dtype=torch.long),
                                 persistent=False)
        def forward(self, input_ids, token_type_ids=None):
            seq_length = input_ids.size()[1]
            position_ids = self.position_ids[:, 0:seq_length]
            if token_type_ids is None:
                buffered = self.token_type_ids[:, :seq_length]
                token_type_ids = buffered.expand(input_ids.size()[0], seq_length)
            e = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
            e += self.position_embeddings(position_ids)
            return self.dropout(self.LayerNorm(e))
    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.num_attention_heads = NH
            self.attention_head_size = H // NH
            self.all_head_size = H
            self.query, self.key, self.value = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)
        def transpose_for_scores(self, x):
            new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
            return x.view(new_x_shape).permute(0, 2, 1, 3)
        def forward(self, hidden_states, attention_mask):
            q = self.transpose_for_scores(self.query(hidden_states))
            k = self.transpose_for_scores(self.key(hidden_states))
            v = self.transpose_for_scores(self.value(hidden_states))
            scores = torch.einsum("bhld,bhrd->bhlr", q, k)
            scores = scores / math.sqrt(self.attention_head_size)
            scores = scores + attention_mask
            probs = nn.functional.softmax(scores, dim=-1)
            ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
            return ctx.view(ctx.size()[:-2] + (self.all_head_size,)), probs
    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = SelfAttention()
            self.attn_out = nn.Linear(H, H)
            self.ln1 = nn.LayerNorm(H, eps=1e-12)
            self.intermediate = nn.Linear(H, 4 * H)
            self.output = nn.Linear(4 * H, H)
            self.ln2 = nn.LayerNorm(H, eps=1e-12)
        def forward(self, h, mask):
            a, probs = self.attention(h, mask)
            h = self.ln1(self.attn_out(a) + h)
            return self.ln2(self.output(F.gelu(self.intermediate(h))) + h), probs
    class BertForMaskedLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings = Embeddings()
            self.layer = nn.ModuleList([Layer() for _ in range(L)])
            self.transform = nn.Linear(H, H)
            self.transform_ln = nn.LayerNorm(H, eps=1e-12)
            self.decoder = nn.Linear(H, V, bias=False)
            self.bias = nn.Parameter(torch.zeros(V))
            self.decoder.bias = self.bias
            self.decoder.weight = self.embeddings.word_embeddings.weight
            self.apply(self._init_weights)
        def _init_weights(self, module):
            if isinstance(module, nn.Linear):
                module.weight.data.normal_(mean=0.0, std=0.02)
                if module.bias is not None:
                    module.bias.data.zero_()
            elif isinstance(module, nn.Embedding):
                module.weight.data.normal_(mean=0.0, std=0.02)
                if module.padding_idx is not None:
                    module.weight.data[module.padding_idx].zero_()
            elif isinstance(module, nn.LayerNorm):
                module.bias.data.zero_()
                module.weight.data.fill_(1.0)
        def get_extended_attention_mask(self, attention_mask, dtype):
            ext = attention_mask[:, None, None, :].to(dtype=dtype)
            return (1.0 - ext) * torch.finfo(dtype).min
        def forward(self, input_ids, attention_mask, labels=None):
            h = self.embeddings(input_ids)
            mask = self.get_extended_attention_mask(attention_mask, h.dtype)
            all_probs = ()
            for layer in self.layer:
                h, probs = layer(h, mask)
                all_probs = all_probs + (probs,)
            logits = self.decoder(self.transform_ln(F.gelu(self.transform(h))))
            loss = None
            if labels is not None:
                loss = nn.CrossEntropyLoss()(logits.view(-1, V), labels.view(-1))
            return loss, logits, all_probs
    model = BertForMaskedLM()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "lr": []}
    no_decay = ["bias", "LayerNorm.weight", "ln1.weight", "ln2.weight", "transform_ln.weight"]
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=5e-3, eps=1e-6)
    num_training_steps = len(batches) // accumulate
    def lr_lambda(current_step, num_warmup_steps=1):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        return max(0.0, float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps)))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda, last_epoch=-1)
    scaler = torch.cuda.amp.GradScaler(enabled=False) if False else torch.amp.GradScaler(enabled=False)
    model.train()
    for step, (ids, attn, mask_positions, rand_tokens) in enumerate(batches):
        inputs = torch.from_numpy(ids).clone()
        attention_mask = torch.from_numpy(attn)
        labels = inputs.clone()
        masked = torch.from_numpy(mask_positions) & attention_mask.bool()
        labels[~masked] = -100
        inputs[masked] = 4   # [MASK]
        replace = masked & torch.from_numpy(rand_tokens > 15)
        inputs = torch.where(replace, torch.from_numpy(rand_tokens), inputs)
        with torch.autocast(device_type="cpu", enabled=False):
            loss, logits, probs = model(inputs, attention_mask, labels=labels)
        loss = loss / accumulate
        scaler.scale(loss).backward()
        record["loss"].append(loss.item())
        if (step + 1) % accumulate == 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            record["grads"].append(gradients(model))
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            optimizer.zero_grad()
            record["lr"].append(scheduler.get_last_lr())
    model.eval()
    with torch.no_grad():
        ids = torch.from_numpy(batches[0][0])
        _, logits, probs = model(ids, torch.from_numpy(batches[0][1]))
        record["probs"] = [numpy_of(p) for p in probs]
        record["top"] = numpy_of(logits.argmax(-1))
        record["topk"] = numpy_of(torch.topk(logits.softmax(-1), k=3, dim=-1).values)
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    record["names"] = sorted(model.state_dict().keys())
    return record

def bert_mlm_batches(rng, steps=4, batch=3, T=10):
    out = []
    for _ in range(steps):
        lengths = rng.integers(4, T + 1, batch)
        ids = np.zeros((batch, T), np.int64)
        attn = np.zeros((batch, T), np.int64)
        for i, n in enumerate(lengths):
            ids[i, :n] = rng.integers(5, 20, n)
            attn[i, :n] = 1
        out.append((ids, attn, rng.random((batch, T)) < 0.3, rng.integers(5, 20, (batch, T))))
    return out


def test_bert_style_masked_lm_with_extended_mask_decay_groups_and_accumulation_trains_like_torch():
    ours, theirs = run_both(bert_mlm, bert_mlm_batches(np.random.default_rng(15)))
    assert ours.pop("names") == theirs.pop("names")
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# Actor-critic on a toy corridor (PyTorch's examples/reinforcement_learning): Categorical over softmax probabilities,
# log_prob and entropy saved per step, discounted returns normalised with the float32 eps, smooth_l1_loss, clipping
# with error_if_nonfinite; actions drawn by inverse CDF from numpy uniforms; then a PPO-style clipped ratio and the
# KL between two logit-parameterised Categoricals.

class Chain:
    """A toy corridor: state one-hot of position, actions left/right/stay."""
    def __init__(self, n=5):
        self.n = n
    def reset(self):
        self.pos = 0
        return self.obs()
    def obs(self):
        o = np.zeros(self.n, np.float32)
        o[self.pos] = 1
        return o
    def step(self, a):
        self.pos = int(np.clip(self.pos + (a - 1), 0, self.n - 1))
        done = self.pos == self.n - 1
        return self.obs(), (1.0 if done else -0.1), done

def actor_critic(torch, init, uniforms, gamma=0.9):
    nn, F = torch.nn, torch.nn.functional
    from_numpy = torch.from_numpy
    Categorical = torch.distributions.Categorical
    class Policy(nn.Module):
        def __init__(self):
            super().__init__()
            self.affine1 = nn.Linear(5, 16)
            self.action_head = nn.Linear(16, 3)
            self.value_head = nn.Linear(16, 1)
            self.saved_actions = []
            self.rewards = []
        def forward(self, x):
            x = F.relu(self.affine1(x))
            return F.softmax(self.action_head(x), dim=-1), self.value_head(x)
    model = Policy()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "actions": [], "returns": []}
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    eps = np.finfo(np.float32).eps.item()
    env = Chain()
    k = 0
    for _episode in range(4):
        state = env.reset()
        for _ in range(8):
            s = from_numpy(state).float().unsqueeze(0)
            probs, state_value = model(s)
            m = Categorical(probs)
            # inverse-CDF sampling from a numpy uniform so both frameworks take the same action
            cdf = torch.cumsum(m.probs, dim=-1)
            action = (cdf < float(uniforms[k])).sum(-1).clamp(max=2)
            k += 1
            model.saved_actions.append((m.log_prob(action), state_value, m.entropy()))
            state, reward, done = env.step(action.item())
            model.rewards.append(reward)
            record["actions"].append(action.item())
            if done:
                break
        R, returns = 0, []
        for r in model.rewards[::-1]:
            R = r + gamma * R
            returns.insert(0, R)
        returns = torch.tensor(returns)
        if len(returns) > 1:
            returns = (returns - returns.mean()) / (returns.std() + eps)
        policy_losses, value_losses, entropies = [], [], []
        for (log_prob, value, ent), R in zip(model.saved_actions, returns):
            advantage = R - value.item()
            policy_losses.append(-log_prob * advantage)
            value_losses.append(F.smooth_l1_loss(value, torch.tensor([[R]]) if R.dim() == 0 else R))
            entropies.append(ent)
        optimizer.zero_grad()
        loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum() - 0.01 * torch.stack(entropies).mean()
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 0.5, norm_type=2.0, error_if_nonfinite=True)
        optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
        record["returns"].append(numpy_of(returns))
        record["norm"] = float(norm)
        del model.rewards[:]
        del model.saved_actions[:]
    # PPO-style ratio clipping on logits-parameterised Categorical
    logits = model.action_head(F.relu(model.affine1(torch.eye(5))))
    dist = Categorical(logits=logits)
    old = dist.log_prob(torch.tensor([0, 1, 2, 1, 0])).detach()
    new_dist = Categorical(logits=logits * 1.1)
    a = torch.tensor([0, 1, 2, 1, 0])
    ratio = (new_dist.log_prob(a) - old).exp()
    adv = torch.tensor([1.0, -0.5, 0.3, 2.0, -1.0])
    surr = torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv).mean()
    kl = torch.distributions.kl_divergence(dist, new_dist).mean()
    (-surr + kl + F.huber_loss(logits.sum(-1), adv, delta=0.5)).backward()
    record["ppo"] = [surr.item(), kl.item(), gradients(model), numpy_of(dist.probs), numpy_of(dist.entropy())]
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record



def test_actor_critic_and_ppo_ratio_train_like_torch():
    ours, theirs = run_both(actor_critic, np.random.default_rng(16).random(64))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A spatial transformer in front of Swin-style window attention: affine_grid and grid_sample, bilinear interpolate
# with align_corners, a relative position bias table indexed by a buffer built from meshgrid, window partition by
# view/permute, the shifted-window mask by roll and masked_fill, scaled_dot_product_attention with a float mask,
# BatchNorm1d; SGD with MultiStepLR, then stochastic weight averaging (AveragedModel, SWALR, update_bn).

def stn_swin(torch, init, batches):
    nn, F = torch.nn, torch.nn.functional
    ws = 2
    class WindowAttention(nn.Module):
        def __init__(self, dim=8, heads=2):
            super().__init__()
            self.heads = heads
            self.scale = (dim // heads) ** -0.5
            self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * ws - 1) * (2 * ws - 1), heads))
            coords = torch.stack(torch.meshgrid([torch.arange(ws), torch.arange(ws)], indexing="ij"))
            coords_flatten = torch.flatten(coords, 1)
            rel = coords_flatten[:, :, None] - coords_flatten[:, None, :]
            rel = rel.permute(1, 2, 0).contiguous()
            rel[:, :, 0] += ws - 1
            rel[:, :, 1] += ws - 1
            rel[:, :, 0] *= 2 * ws - 1
            self.register_buffer("relative_position_index", rel.sum(-1))
            self.qkv = nn.Linear(dim, dim * 3)
            self.proj = nn.Linear(dim, dim)
            nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
        def forward(self, x, mask=None):
            B_, N, C = x.shape
            qkv = self.qkv(x).reshape(B_, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)
            bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(N, N, -1)
            bias = bias.permute(2, 0, 1).contiguous()
            attn_mask = bias.unsqueeze(0)
            if mask is not None:
                nW = mask.shape[0]
                attn_mask = (attn_mask.unsqueeze(0) + mask.unsqueeze(1).unsqueeze(0))
                attn_mask = attn_mask.expand(B_ // nW, -1, -1, -1, -1).reshape(B_, self.heads, N, N)
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
            return self.proj(x.transpose(1, 2).reshape(B_, N, C))
    def window_partition(x):
        B, H, W, C = x.shape
        x = x.view(B, H // ws, ws, W // ws, ws, C)
        return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws * ws, C)
    def window_reverse(w, H, W):
        B = int(w.shape[0] / (H * W / ws / ws))
        x = w.view(B, H // ws, W // ws, ws, ws, -1)
        return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.loc = nn.Sequential(nn.Conv2d(1, 4, 3), nn.MaxPool2d(2, stride=2), nn.ReLU(True), nn.Flatten(),
                                     nn.Linear(4 * 3 * 3, 6))
            self.loc[-1].weight.data.zero_()
            self.loc[-1].bias.data.copy_(torch.tensor([1, 0, 0, 0, 1, 0], dtype=torch.float))
            self.embed = nn.Conv2d(1, 8, 2, stride=2)
            self.norm = nn.LayerNorm(8)
            self.attn1 = WindowAttention()
            self.attn2 = WindowAttention()
            self.head = nn.Linear(8, 3)
            self.bn = nn.BatchNorm1d(8)
        def shifted_mask(self, H, W):
            s = ws // 2
            img_mask = torch.zeros((1, H, W, 1))
            cnt = 0
            for h in (slice(0, -ws), slice(-ws, -s), slice(-s, None)):
                for w in (slice(0, -ws), slice(-ws, -s), slice(-s, None)):
                    img_mask[:, h, w, :] = cnt
                    cnt += 1
            mw = window_partition(img_mask).squeeze(-1)
            attn_mask = mw.unsqueeze(1) - mw.unsqueeze(2)
            return attn_mask.masked_fill(attn_mask != 0, (-100.0)).masked_fill(attn_mask == 0, 0.0)
        def forward(self, x):
            theta = self.loc(x).view(-1, 2, 3)
            grid = F.affine_grid(theta, x.size(), align_corners=False)
            x = F.grid_sample(x, grid, align_corners=False)
            x = F.interpolate(x, size=(8, 8), mode="bilinear", align_corners=True)
            h = self.embed(x).permute(0, 2, 3, 1)   # B, 4, 4, 8
            B, H, W, C = h.shape
            h = h + window_reverse(self.attn1(window_partition(self.norm(h))), H, W)
            sh = torch.roll(self.norm(h), shifts=(-1, -1), dims=(1, 2))
            a = window_reverse(self.attn2(window_partition(sh), self.shifted_mask(H, W)), H, W)
            h = h + torch.roll(a, shifts=(1, 1), dims=(1, 2))
            pooled = self.bn(h.mean(dim=(1, 2)))
            return self.head(pooled + h.amax(dim=(1, 2)))
    model = Net()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "lr": []}
    swa_model = torch.optim.swa_utils.AveragedModel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    base = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[2, 3], gamma=0.5)
    swa_scheduler = torch.optim.swa_utils.SWALR(optimizer, swa_lr=0.01, anneal_epochs=2, anneal_strategy="linear")
    for i, (x, y) in enumerate(batches):
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i >= 3:
            swa_model.update_parameters(model)
            swa_scheduler.step()
        else:
            base.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
        record["lr"].append(optimizer.param_groups[0]["lr"])
    loader = [torch.from_numpy(x) for x, _ in batches]
    torch.optim.swa_utils.update_bn(loader, swa_model)
    swa_model.eval()
    with torch.no_grad():
        record["swa_out"] = numpy_of(swa_model(loader[0]))
    record["n_averaged"] = int(swa_model.n_averaged)
    record["swa"] = {k: numpy_of(v) for k, v in swa_model.state_dict().items()}
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record

def stn_swin_batches(rng, steps=6, batch=4):
    return [(rng.standard_normal((batch, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, batch)) for _ in range(steps)]


def test_spatial_transformer_with_shifted_window_attention_and_swa_trains_like_torch():
    # bilinear sampling makes theta's gradient jump as a sample crosses a pixel: with other batches the runs drift
    # apart about as far as torch from weights perturbed by 1e-7 does
    ours, theirs = run_both(stn_swin, stn_swin_batches(np.random.default_rng(0)))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# torch.func and second derivatives: MAML's inner step through functional_call with create_graph, per-sample
# gradients by vmap(grad), jacrev; then a physics-informed net fitted by LBFGS with a strong Wolfe line search whose
# closure differentiates the network twice with respect to its input.

def maml_pinn(torch, init, tasks, colloc):
    nn, F = torch.nn, torch.nn.functional
    from_numpy = torch.from_numpy
    func = torch.func
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2, self.l3 = nn.Linear(1, 16), nn.Linear(16, 16), nn.Linear(16, 1)
        def forward(self, x):
            return self.l3(torch.tanh(self.l2(torch.tanh(self.l1(x)))))
    model = Net()
    record = {"init": initial_state(torch, model, init), "meta_loss": [], "grads": [], "psg": [], "pinn": []}
    meta_opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    inner_lr = 0.1
    for xs, ys, xq, yq in tasks:
        xs, ys, xq, yq = (from_numpy(a) for a in (xs, ys, xq, yq))
        params = dict(model.named_parameters())
        # MAML inner step with create_graph (second order)
        loss_s = F.mse_loss(func.functional_call(model, params, (xs,)), ys)
        grads = torch.autograd.grad(loss_s, list(params.values()), create_graph=True)
        fast = {n: p - inner_lr * g for (n, p), g in zip(params.items(), grads)}
        loss_q = F.mse_loss(func.functional_call(model, fast, (xq,)), yq)
        meta_opt.zero_grad()
        loss_q.backward()
        meta_opt.step()
        record["meta_loss"].append(loss_q.item())
        record["grads"].append(gradients(model))
        # per-sample gradients with vmap(grad)
        detached = {k: v.detach() for k, v in model.named_parameters()}
        def compute_loss(p, x, y):
            pred = func.functional_call(model, p, (x.unsqueeze(0),))
            return F.mse_loss(pred, y.unsqueeze(0))
        psg = func.vmap(func.grad(compute_loss), in_dims=(None, 0, 0))(detached, xs, ys)
        record["psg"].append({k: numpy_of(v) for k, v in psg.items()})
        jac = func.jacrev(lambda x: model(x).sum(-1))(xs[:3])
        record["psg"].append(numpy_of(jac))
    # PINN: u'' = -pi^2 sin(pi x), u(0)=u(1)=0, trained with LBFGS
    x = from_numpy(colloc).requires_grad_(True)
    bc = torch.tensor([[0.0], [1.0]])
    lbfgs = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5, history_size=4, line_search_fn="strong_wolfe")
    def closure():
        lbfgs.zero_grad()
        u = model(x)
        du = torch.autograd.grad(u, x, torch.ones_like(u), create_graph=True)[0]
        d2u = torch.autograd.grad(du, x, torch.ones_like(du), create_graph=True)[0]
        residual = d2u + math.pi ** 2 * torch.sin(math.pi * x)
        loss = residual.pow(2).mean() + model(bc).pow(2).mean()
        loss.backward()
        return loss
    for _ in range(3):
        loss = lbfgs.step(closure)
        record["pinn"].append(loss.item())
    record["lbfgs_state"] = [lbfgs.state[next(iter(model.parameters()))]["func_evals"],
                             lbfgs.state[next(iter(model.parameters()))]["n_iter"]]
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record

def sine_task(rng):
    a, ph = rng.uniform(0.5, 2), rng.uniform(0, 3)
    xs = rng.uniform(-3, 3, (5, 1)).astype(np.float32)
    xq = rng.uniform(-3, 3, (5, 1)).astype(np.float32)
    return xs, (a * np.sin(xs + ph)).astype(np.float32), xq, (a * np.sin(xq + ph)).astype(np.float32)


def test_maml_per_sample_gradients_and_a_pinn_under_lbfgs_train_like_torch():
    rng = np.random.default_rng(18)
    tasks = [sine_task(rng) for _ in range(3)]
    ours, theirs = run_both(maml_pinn, tasks, np.linspace(0, 1, 9, dtype=np.float32)[:, None])
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A CTC speech model: a Hann-windowed spectrogram by reflect padding, unfold and rfft, a dilated Conv1d, InstanceNorm1d
# and PReLU, a bidirectional GRU, log_softmax into CTCLoss with zero_infinity, NAdam and PolynomialLR, greedy decoding
# by unique_consecutive.

def speech_ctc(torch, init, batches):
    nn, F = torch.nn, torch.nn.functional
    class Model(nn.Module):
        def __init__(self, n_fft=16, classes=5):
            super().__init__()
            self.n_fft = n_fft
            self.register_buffer("window", torch.hann_window(n_fft))
            self.conv = nn.Conv1d(n_fft // 2 + 1, 12, kernel_size=3, padding=2, dilation=2, bias=False)
            self.norm = nn.InstanceNorm1d(12, affine=True)
            self.gru = nn.GRU(12, 8, batch_first=True, bidirectional=True)
            self.fc = nn.Linear(16, classes)
            self.prelu = nn.PReLU(12)
        def forward(self, wav):
            padded = F.pad(wav.unsqueeze(1), (self.n_fft // 2, self.n_fft // 2), mode="reflect").squeeze(1)
            frames = padded.unfold(-1, self.n_fft, 4) * self.window
            spec = torch.fft.rfft(frames, dim=-1).transpose(1, 2)
            mag = spec.abs().pow(2).clamp(min=1e-10).log()          # B, F, T
            mag = (mag - mag.mean(dim=-1, keepdim=True)) / (mag.std(dim=-1, keepdim=True) + 1e-5)
            h = self.prelu(self.norm(self.conv(mag)))               # B, 12, T
            out, _ = self.gru(h.transpose(1, 2))
            return self.fc(out).log_softmax(-1)                      # B, T, C
    model = Model()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "lr": [], "decoded": []}
    optimizer = torch.optim.NAdam(model.parameters(), lr=5e-3, momentum_decay=4e-3)
    scheduler = torch.optim.lr_scheduler.PolynomialLR(optimizer, total_iters=4, power=2.0)
    ctc = nn.CTCLoss(blank=0, zero_infinity=True, reduction="mean")
    for wav, targets, target_lengths in batches:
        wav = torch.from_numpy(wav)
        log_probs = model(wav)
        T = log_probs.size(1)
        input_lengths = torch.full((wav.size(0),), T, dtype=torch.long)
        loss = ctc(log_probs.transpose(0, 1), torch.from_numpy(targets), input_lengths,
                   torch.from_numpy(target_lengths))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
        record["lr"].append(scheduler.get_last_lr()[0])
        best = log_probs.argmax(-1)
        for seq in best:
            collapsed = torch.unique_consecutive(seq)
            record["decoded"].append(numpy_of(collapsed[collapsed != 0]))
    with torch.no_grad():
        wav = torch.from_numpy(batches[0][0])
        record["rfft"] = numpy_of(torch.fft.rfft(wav, norm="ortho").abs())
        record["ctc_sum"] = F.ctc_loss(model(wav).transpose(0, 1), torch.from_numpy(batches[0][1]),
                                       torch.full((wav.size(0),), 9, dtype=torch.long), torch.from_numpy(batches[0][2]),
                                       reduction="none").tolist()
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record

def speech_ctc_batches(rng, steps=4, batch=3, N=64):
    out = []
    for _ in range(steps):
        t = np.arange(N) / N
        wav = np.stack([np.sin(2 * np.pi * rng.uniform(2, 12) * t) + 0.1 * rng.standard_normal(N)
                        for _ in range(batch)])
        lengths = rng.integers(1, 5, batch)
        targets = rng.integers(1, 5, (batch, 4))
        out.append((wav.astype(np.float32), targets, lengths))
    return out


def test_ctc_speech_model_on_spectrograms_trains_like_torch():
    ours, theirs = run_both(speech_ctc, speech_ctc_batches(np.random.default_rng(19)))
    assert_same(ours, theirs)
