"""EAGLE-2 (Li et al., 2024): exact speculative decoding with a feature-level draft head and dynamic draft
trees (docs/eagle2.md), in raster order.

One cycle, from the last committed token x_r (the tree's root, not yet fed to the target):
1. draft: the head (mulo_sd/nets/eagle_head.py) reads the target's features and tokens of the newly committed
   positions and predicts the features after x_r; its top `top_k` tokens are the first tree level. Each
   further level feeds the `top_k` most confident nodes of the last level (confidence: the product of the
   head's probabilities along the path, EAGLE-2's cumulative score) as one tree step of the head and scores
   their `top_k` children, for `depth` levels in all. Of every scored node, the `total_tokens` most confident
   form the draft tree (a child never scores above its parent, so the tree is closed under ancestors).
2. verify: ONE target `step_tree` feeds the root and the tree (tree attention mask over the slot cache's
   tree slots, slot_cache.py) and gives the target's processed distribution p after every node.
3. accept (recursive rejection sampling over siblings, EAGLE's evaluate_posterior): from the root, the
   children of the current node are tried in order of confidence; child v is accepted with probability
   p(v) (its draft is deterministic: q is a point mass on v); a rejection sets p(v) = 0 and renormalises p
   (= norm(max(0, p - q))) before the next sibling. When no child is accepted the next token is sampled from
   the remaining p; when a leaf is accepted, from the target's p after it (the bonus token). Under greedy
   sampling p is one-hot, so a child is accepted iff it is the target's argmax. Either way the tokens follow
   the target's (guided, processed) distribution exactly: the drafts depend only on the committed prefix.
4. commit: the K/V of the root and the accepted nodes are copied from the tree slots to their grid slots;
   their hidden features are the head's inputs of the next cycle.

Guidance: the target's logits are guided as in every method (sampling.py); the head drafts from guided
logits too, its conditional rows reading the target's conditional features and its unconditional rows the
unconditional ones (the target's `step_tree` returns both).

Statistics: target_forwards = `start` + one verification per cycle; drafter_forwards = head calls (`depth`
per cycle at most: one that feeds the committed tokens, then one per further level); every call is on the
critical path. tokens_drafted = tree nodes verified (root excluded); tokens_accepted = drafts kept;
tokens_rejected = siblings tried and rejected; tokens_resampled = positions the target sampled itself (the
first token, and one per cycle unless the grid ended); accepted_per_cycle: drafts kept in each cycle.
Rows of a batch are decoded one image at a time, image b from its own generator when `generator` is a list
(one per image), so its tokens equal decoding it alone. Not batched: every image grows its own
dynamic tree (its own node count, positions and parents, hence its own tree mask), and each level of the
head's expansion depends on the scores of the level before; one call over all trees would need per-row tree
positions, masks and tree slots in both the target and the head (docs/batching.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mulo_sd.decoding.methods.instrumented import DRAFT_HEAD, Recorded
from mulo_sd.decoding.methods.result import DecodeResult, finish
from mulo_sd.decoding.sampling import SamplerConfig, image_generators, process_logits, sample
from mulo_sd.decoding.stats import DecodeStats


def check_tree_knobs(depth: int, top_k: int, total_tokens: int, vocab_size: int) -> None:
    """Raise unless the tree knobs describe a non-empty tree the draft can fill."""
    if depth < 1:
        raise ValueError(f"depth must be >= 1 (draft tree levels), got {depth}")
    if not 1 <= top_k <= vocab_size:
        raise ValueError(
            f"top_k must lie in [1, {vocab_size}] (children scored per expanded node), got {top_k}"
        )
    most = top_k + (depth - 1) * top_k * top_k  # every node the draft scores
    if not 1 <= total_tokens <= most:
        raise ValueError(
            f"total_tokens must lie in [1, {most}] (the nodes that depth={depth}, top_k={top_k} score), "
            f"got {total_tokens}"
        )


@torch.inference_mode()
def decode_eagle2(
    target,
    head,
    cond: torch.Tensor,
    sampler: SamplerConfig,
    generator: torch.Generator,
    *,
    depth: int = 5,
    top_k: int = 8,
    total_tokens: int = 32,
    cond_mask: torch.Tensor | None = None,
    tokenizer=None,
) -> DecodeResult:
    """EAGLE-2 decoding (module docstring) with a GPT target and its EagleHead."""
    if not hasattr(target, "step_tree"):
        raise ValueError(f"EAGLE-2 verifies trees with GPT.step_tree; {type(target).__name__} has none")
    head.check_target(target)
    check_tree_knobs(depth, top_k, total_tokens, target.vocab_size)
    batch = cond.shape[0]
    generators = image_generators(generator, batch)
    images, stats = [], None
    for i in range(batch):
        mask = None if cond_mask is None else cond_mask[i : i + 1]
        tokens, image_stats = _decode_image(
            target, head, cond[i : i + 1], mask, sampler, generators[i], depth, top_k, total_tokens
        )
        images.append(tokens)
        stats = image_stats if stats is None else stats.add(image_stats)
    height, width = target.grid_size
    return finish(torch.stack(images).view(batch, height, width).to(cond.device), stats, tokenizer)


class _Tree:
    """The scored draft nodes of one cycle: token, parent node (-1: the root), depth (1 = the root's
    children) and cumulative log confidence, in creation order (a parent before its children)."""

    def __init__(self):
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.depths: list[int] = []
        self.scores: list[float] = []

    def add(self, tokens, parent: int, depth: int, scores) -> list[int]:
        first = len(self.tokens)
        self.tokens += tokens
        self.parents += [parent] * len(tokens)
        self.depths += [depth] * len(tokens)
        self.scores += scores
        return list(range(first, len(self.tokens)))

    def most_confident(self, count: int) -> list[int]:
        """The `count` best nodes in creation order; ties go to the earlier node, so a parent (never below
        its child) is kept whenever its child is."""
        order = sorted(range(len(self.scores)), key=lambda i: -self.scores[i])  # stable: creation order
        return sorted(order[:count])


def _draft_log_probs(target, head_state, predicted: torch.Tensor) -> torch.Tensor:
    """Head features [B', n, dim] -> guided draft log-probabilities [n, V] (one image)."""
    logits = head_state.guide(target.output(predicted).float())
    return logits[0].log_softmax(-1)


def _embed(target, tokens: torch.Tensor, rows: int) -> torch.Tensor:
    """Token ids [n] -> the target's embeddings [B', n, dim] for every internal row."""
    return target.tok_embeddings(tokens.to(target.device)).unsqueeze(0).expand(rows, -1, -1)


def _draft(target, head, head_state, features, embeddings, positions, size, depth, top_k) -> _Tree:
    """Feed the newly committed positions to the head, then grow the dynamic tree level by level."""
    predicted = head.step(head_state, features, embeddings, positions)[:, -1]  # [B', dim]: after the root
    root_position = int(positions[-1])
    levels = min(depth, size - 1 - root_position)
    tree = _Tree()
    best = _draft_log_probs(target, head_state, predicted[:, None])[0].topk(top_k)
    frontier = tree.add(best.indices.tolist(), -1, 1, best.values.tolist())
    inputs = dict.fromkeys(frontier, predicted)  # node -> the features that predicted its token
    rows = predicted.shape[0]
    slot_of: dict[int, int] = {}  # node -> its head tree slot (only expanded nodes are fed)
    head_parents: list[int] = []
    head_positions: list[int] = []
    for level in range(2, levels + 1):
        first = len(head_parents)
        for node in frontier:
            slot_of[node] = len(head_parents)
            head_parents.append(slot_of.get(tree.parents[node], -1))
            head_positions.append(root_position + level - 1)
        tokens = torch.tensor([tree.tokens[node] for node in frontier])
        fed = torch.stack([inputs[node] for node in frontier], dim=1)
        out = head.step(
            head_state, fed, _embed(target, tokens, rows), torch.tensor(head_positions),
            parents=torch.tensor(head_parents), first=first,
        )  # fmt: skip
        best = _draft_log_probs(target, head_state, out).topk(top_k)  # [frontier, top_k]
        cumulative = torch.tensor([tree.scores[node] for node in frontier])[:, None] + best.values.cpu()
        children = []
        for row, node in enumerate(frontier):
            ids = tree.add(best.indices[row].tolist(), node, level, cumulative[row].tolist())
            inputs.update(dict.fromkeys(ids, out[:, row]))
            children += ids
        chosen = cumulative.flatten().topk(min(top_k, len(children))).indices.sort().values
        frontier = [children[i] for i in chosen.tolist()]
    return tree


def _decode_image(target, head, cond, cond_mask, sampler, generator, depth, top_k, total_tokens):
    """One image: -> (tokens int64 [H*W] on CPU, its statistics)."""
    height, width = target.grid_size
    size = height * width
    stats = DecodeStats(batch_size=1, device=cond.device)
    target, head = Recorded(target, "target", stats), Recorded(head, "drafter", stats, DRAFT_HEAD)
    values = torch.zeros(size, dtype=torch.long)
    features: dict[int, torch.Tensor] = {}  # position p -> the target's features f_p [B', dim] predicting x_p
    with stats.wall():
        with stats.phase("prefill"):
            state = target.start(cond, sampler.cfg_scale, cond_mask=cond_mask)
            state.add_tree_slots(total_tokens + 1)
            rows = state.written.shape[0]
            head_state = head.start(rows, sampler.cfg_scale, max(1, (depth - 1) * top_k))
            features[0] = state.first_hidden
            values[0] = sample(process_logits(state.first_logits, sampler), generator).cpu()[0]
            stats.tokens_resampled += 1
        done, head_fed = 1, 0  # positions < done are committed; the head has read positions < head_fed
        while done < size:
            stats.cycles += 1
            with stats.phase("draft"):
                positions = torch.arange(head_fed, done)
                fed = torch.stack([features[p] for p in range(head_fed, done)], dim=1)
                embeddings = _embed(target, values[head_fed:done], rows)
                tree = _draft(target, head, head_state, fed, embeddings, positions, size, depth, top_k)
                head_fed = done
                verified = _Verified.of(
                    tree, tree.most_confident(total_tokens), done - 1, int(values[done - 1])
                )
            stats.tokens_drafted += len(verified.tokens) - 1
            with stats.phase("verify"):
                logits, hidden = target.step_tree(
                    state,
                    torch.tensor([verified.tokens]),
                    torch.tensor(verified.positions),
                    torch.tensor(verified.parents),
                )
                probs = process_logits(logits[0], sampler)
            with stats.phase("accept"):
                path, p = _accept(verified, probs, generator, stats)
            done = _commit(state, verified, path, p, hidden, values, features, generator, stats)
    return values, stats


@dataclass
class _Verified:
    """The tree one target call verifies: index 0 is the root (the last committed token), then the kept
    draft nodes, each with its parent's index, its grid position and its draft confidence."""

    tokens: list[int]
    parents: list[int]  # index of the parent (-1: the root's)
    positions: list[int]
    scores: list[float]  # cumulative log confidence of node j at scores[j - 1] (the root has none)

    @classmethod
    def of(cls, tree: _Tree, kept: list[int], root: int, root_token: int) -> _Verified:
        index = {node: j + 1 for j, node in enumerate(kept)}  # node -> its index in the verified tree
        return cls(
            tokens=[root_token] + [tree.tokens[node] for node in kept],
            parents=[-1] + [index.get(tree.parents[node], 0) for node in kept],
            positions=[root] + [root + tree.depths[node] for node in kept],
            scores=[tree.scores[node] for node in kept],
        )


def _accept(verified: _Verified, probs: torch.Tensor, generator, stats) -> tuple[list[int], torch.Tensor]:
    """Recursive rejection sampling over siblings from the root (module docstring, step 3) -> the accepted
    path of indices (the root first) and the distribution the next token is sampled from."""
    tokens, children = verified.tokens, {}
    for j in range(1, len(tokens)):
        children.setdefault(verified.parents[j], []).append(j)
    path, current, p = [0], 0, probs[0]
    while True:
        p = probs[current].clone()
        siblings = sorted(children.get(current, []), key=lambda j: -verified.scores[j - 1])
        accepted = None
        for j in siblings:
            uniform = float(torch.rand(1, generator=generator, device=generator.device))
            if uniform < float(p[tokens[j]]):
                accepted = j
                break
            stats.tokens_rejected += 1
            p[tokens[j]] = 0.0  # norm(max(0, p - q)) with q the point mass on the draft
            total = p.sum()
            p = p / total if total > 0 else probs[current]
        if accepted is None:
            return path, p
        path.append(accepted)
        current = accepted


def _commit(state, verified, path, p, hidden, values, features, generator, stats) -> int:
    """Commit the accepted path (K/V from the tree slots to the grid slots, tokens, the features the head
    reads next) and sample the token after it from `p`; -> the committed count."""
    size, positions = values.shape[0], verified.positions
    stats.tokens_accepted += len(path) - 1
    stats.accepted_per_cycle.append(len(path) - 1)
    nodes = torch.tensor(path)
    state.commit_tree(nodes, torch.tensor([positions[j] for j in path]) + state.cond_len)
    for j in path:
        values[positions[j]] = verified.tokens[j]
        if positions[j] + 1 < size:
            features[positions[j] + 1] = hidden[:, j]
    position = positions[path[-1]] + 1
    if position < size:
        values[position] = sample(p, generator).cpu()
        stats.tokens_resampled += 1
    return position + 1 if position < size else size
