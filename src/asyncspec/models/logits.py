"""The greedy decision rule's numerics, shared by every backend.

Measured here: in bf16 a logit tie ("." vs "," at exactly 45.0) resolved differently in a
batched call than in a one-token call. So the vocabulary projection runs in the model's dtype
(fast), and every candidate within NEAR_TIE_MARGIN of a row's maximum is re-scored exactly in
fp32. One rule for one-token and many-token calls alike.
"""

from __future__ import annotations

import torch

# bf16 keeps 8 significant bits: a logit near 50 is resolved to 0.25; stay a few steps wider.
NEAR_TIE_MARGIN = 1.0


def project_logits(
    hidden: torch.Tensor,  # [N, D] in the model's dtype
    weight: torch.Tensor,  # [V, D] the output projection
    bias: torch.Tensor | None = None,  # [V]
    suppressed: torch.Tensor | None = None,  # [N, V] bool, True = never emitted
) -> torch.Tensor:  # float32 [N, V]
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    if suppressed is not None:
        logits.masked_fill_(suppressed, float("-inf"))
    if hidden.dtype == torch.float32:
        return logits
    top = logits.max(dim=-1, keepdim=True).values
    rows, cols = (logits >= top - NEAR_TIE_MARGIN).nonzero(as_tuple=True)
    exact = (hidden[rows].float() * weight[cols].float()).sum(-1)
    if bias is not None:
        exact += bias[cols].float()
    logits[rows, cols] = exact
    return logits


def greedy_tokens(logits: torch.Tensor) -> list[int]:
    """argmax per row of float32 logits [..., V]; the first index wins an exact tie."""
    return logits.argmax(dim=-1).reshape(-1).tolist()
