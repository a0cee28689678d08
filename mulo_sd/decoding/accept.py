"""Accept rules of the speculative methods, applied to the target's processed distribution
(`sampling.process_logits`, the distribution plain AR sampling would draw from).

MuLo-SD (docs/algorithm.md section 5), deterministic: accept draft token v at position i iff
`sum_{u in B_k(v)} p_i(u) >= threshold`, B_k(v) being v plus its k nearest codebook entries (neighbours.py).
Rules: 'absolute' (the paper's) thresholds at tau; 'typical' at tau * exp(-H(p_i)), tau over the perplexity of
the target's distribution (Medusa's typical acceptance, pooled): where the target is unsure among many codes,
any draft as likely as a typical one of them passes, so rejections (and their resampling) concentrate where
the target is confident. k = 0 tests v's own probability; with greedy sampling p_i is one-hot (H = 0, both
rules agree), so tau = 1 accepts exactly the argmax. `floor` raises either rule's bar to at least itself:
accept iff the pooled mass >= max(floor, bar). Under the typical rule it stops the bar from vanishing where
the target is unsure among many codes (textured backgrounds), which is where its drafts pass unjudged;
floor = 0 is the rule itself, floor >= tau the absolute rule at max(floor, tau).

LANTERN (docs/algorithm.md section 13), randomised: with v's neighbours n_1..n_k nearest first and c_j =
p(n_1) + .. + p(n_j), j* = max{j <= k : c_j <= delta} (j* = 0, c_0 = 0, when even c_1 > delta), the relaxed
probability is p~(v) = p(v) + c_{j*}; v is accepted with probability min(1, p~(v) / q(v)). After a rejection
the token is drawn from norm(max(0, p - q')), where q' is the drafter's q with q'(n_1) = .. = q'(n_k) = 0
whenever the relaxation added mass (c_{j*} > 0), and q' = q otherwise. This is what LANTERN's code does (it
zeroes q on v's nearest neighbours once any was pooled, v itself keeps q(v)), except that it zeroes k + 1
neighbours and also zeroes them when the pooled neighbours carry no mass; here zero pooled mass changes
nothing, so delta = 0 is exactly standard speculative sampling: accept with min(1, p(v)/q(v)), resample from
norm(max(0, p - q)).
"""

from __future__ import annotations

import torch

ACCEPT_RULES = ("absolute", "typical")


def check_neighbour_knobs(neighbours: torch.Tensor, k: int, vocab_size: int) -> None:
    """Raise unless `neighbours` is a [V, K] table for this vocabulary and 0 <= k <= K, k < V."""
    if not 0 <= k < vocab_size:
        raise ValueError(f"k must lie in [0, {vocab_size}) (neighbours besides the token itself), got {k}")
    if neighbours.dim() != 2 or neighbours.shape[0] != vocab_size:
        raise ValueError(
            f"neighbours must be a [V={vocab_size}, K] table (neighbours.codebook_neighbours), "
            f"got shape {list(neighbours.shape)}"
        )
    if k > neighbours.shape[1]:
        raise ValueError(
            f"k={k} exceeds the neighbour table's {neighbours.shape[1]} columns: build it with K >= k"
        )


def pooled_probability(
    probs: torch.Tensor, tokens: torch.Tensor, neighbours: torch.Tensor, k: int
) -> torch.Tensor:
    """probs [n, V], tokens [n] -> [n]: p_i(B_k(tokens[i])), the mass of a token and its k neighbours."""
    tokens = tokens.to(probs.device)
    own = probs.gather(1, tokens[:, None])[:, 0]
    if k == 0:
        return own
    pooled = probs.gather(1, neighbours.to(probs.device)[tokens, :k])
    return own + pooled.sum(1)


def accept_pooled(
    probs: torch.Tensor,
    tokens: torch.Tensor,
    neighbours: torch.Tensor,
    k: int,
    tau: float,
    rule: str = "absolute",
    floor: float = 0.0,
) -> torch.Tensor:
    """MuLo-SD's rule: bool [n], True where p_i(B_k(tokens[i])) >= max(floor, bar), the bar being tau
    ('absolute') or tau * exp(-H(p_i)) ('typical'; module docstring)."""
    pooled = pooled_probability(probs, tokens, neighbours, k)
    if rule == "absolute":
        return pooled >= max(floor, tau)
    if rule == "typical":
        entropy = -torch.special.xlogy(probs, probs).sum(1)
        bar = tau * torch.exp(-entropy)
        # (no clamp at floor 0: the bar, hence every decode, stays bit for bit the rule's own)
        return pooled >= (bar.clamp(min=floor) if floor > 0 else bar)
    raise ValueError(f"accept_rule must be one of {ACCEPT_RULES}, got '{rule}'")


def lantern_relaxed_probability(
    probs: torch.Tensor, tokens: torch.Tensor, neighbours: torch.Tensor, k: int, delta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """probs [n, V] (target), tokens [n] -> (p~ [n], pooled mass c_{j*} [n]) of LANTERN's relaxation."""
    tokens = tokens.to(probs.device)
    own = probs.gather(1, tokens[:, None])[:, 0]
    if k == 0:
        return own, torch.zeros_like(own)
    cumulative = probs.gather(1, neighbours.to(probs.device)[tokens, :k]).cumsum(
        1
    )  # c_1 .. c_k, nondecreasing
    count = (cumulative <= delta).sum(1)  # j*
    pooled = torch.where(count > 0, cumulative.gather(1, (count - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    return own + pooled, pooled


def lantern_residual(
    probs: torch.Tensor,
    draft_probs: torch.Tensor,
    token: int,
    neighbours: torch.Tensor,
    k: int,
    pooled: float,
) -> torch.Tensor:
    """The distribution [V] to resample a rejected `token` from: norm(max(0, p - q')) (module docstring).

    Falls back to p when p <= q' everywhere (then the rejection had probability 0 up to rounding)."""
    q = draft_probs
    if k > 0 and pooled > 0:
        q = q.clone()
        q[neighbours[token, :k].to(q.device)] = 0.0
    residual = (probs - q).clamp(min=0.0)
    total = residual.sum()
    return residual / total if total > 0 else probs
