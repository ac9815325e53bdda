"""--reset-position-ids / --reset-attention-mask on one made-up sample, worked by hand as the
forks' get_ltor_masks_and_position_ids does it: a document begins after each end-of-document
token, the token stays with the document it ends."""
import torch

from megatron.model.documents import document_ids, document_mask, document_positions

EOD = 0
# documents: [5, EOD] [7, 8, EOD] [9]; second row: [EOD] [3, 4, 6, 2, 1]
TOKENS = torch.tensor([[5, EOD, 7, 8, EOD, 9], [EOD, 3, 4, 6, 2, 1]])


def test_document_index_and_positions_by_hand():
    assert document_ids(TOKENS, EOD).tolist() == [[0, 0, 1, 1, 1, 2], [0, 1, 1, 1, 1, 1]]
    assert document_positions(document_ids(TOKENS, EOD)).tolist() == [[0, 1, 0, 1, 2, 0], [0, 0, 1, 2, 3, 4]]


def test_mask_by_hand():
    """1 = masked. Row 0: query 3 (token 8) sees keys 2 and 3 only; query 5 (token 9) only itself."""
    mask = document_mask(document_ids(TOKENS, EOD))
    assert mask.shape == (2, 1, 6, 6)
    assert mask[0, 0].int().tolist() == [[0, 1, 1, 1, 1, 1],
                                         [0, 0, 1, 1, 1, 1],
                                         [1, 1, 0, 1, 1, 1],
                                         [1, 1, 0, 0, 1, 1],
                                         [1, 1, 0, 0, 0, 1],
                                         [1, 1, 1, 1, 1, 0]]
    assert mask[1, 0].int().tolist() == [[0, 1, 1, 1, 1, 1],
                                         [1, 0, 1, 1, 1, 1],
                                         [1, 0, 0, 1, 1, 1],
                                         [1, 0, 0, 0, 1, 1],
                                         [1, 0, 0, 0, 0, 1],
                                         [1, 0, 0, 0, 0, 0]]
