"""Documents inside one sample (the forks' --reset-position-ids / --reset-attention-mask, their
get_ltor_masks_and_position_ids): a sample is cut from a stream of documents each ending in an
end-of-document token, and a document begins after that token (the token itself stays with the
document it ends). One long tensor, the document index of every position, says all of it; it
crosses pipeline stages next to the hidden states (DeepSpeed sends no gradient for an integer
tensor), and every layer derives what its flags ask for from it."""
import torch


def document_ids(tokens: torch.Tensor, eod: int) -> torch.Tensor:
    """[b, s] tokens -> [b, s] int64: how many end-of-document tokens come before each position."""
    is_eod = (tokens == eod).long()
    return torch.cumsum(is_eod, dim=1) - is_eod


def document_positions(doc_ids: torch.Tensor) -> torch.Tensor:
    """[b, s] -> [b, s]: each position counted from the start of its document (0, 1, ... again
    after every end-of-document token)."""
    s = doc_ids.size(1)
    index = torch.arange(s, device=doc_ids.device).expand_as(doc_ids)
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values  # the document's start
    return index - first


def document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """[b, s] -> [b, 1, s, s] bool, True where query i must not see key j: j after i (causal) or j
    in another document. A query always sees itself, so no row is all masked."""
    s = doc_ids.size(1)
    causal = torch.ones(s, s, dtype=torch.bool, device=doc_ids.device).triu_(1)
    other = doc_ids[:, :, None] != doc_ids[:, None, :]
    return (other | causal)[:, None]
